// Calls that bypass the generated stubs, for tests that send bytes which
// are not a valid request, or need streams held open without a thread each.
#ifndef OPTSTATE_TESTS_TESTING_RAW_RPC_H_
#define OPTSTATE_TESTS_TESTING_RAW_RPC_H_

#include <memory>
#include <string>
#include <vector>

#include "grpcpp/grpcpp.h"

namespace optstate::testing {

// One unary call of `method` ("/optstate.v1.OptimizerState/GetStats") with
// `request` as the message's bytes; the reply's bytes go to `reply`.
grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                      const std::string& request, std::string* reply = nullptr);

// A streaming call of `method`: writes each of `messages` as one message's
// bytes, half-closes, reads every reply, and returns the call's status.
grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::vector<std::string>& messages,
                       std::vector<std::string>* replies = nullptr);

// A channel of its own (its own connection), with the message limits set.
std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target,
                                          int max_message_bytes = 64 << 20);

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_RAW_RPC_H_
