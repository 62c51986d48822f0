// Generic-stub calls on a completion queue of their own.
#include "tests/testing/raw_rpc.h"

#include "grpcpp/generic/generic_stub.h"

namespace optstate::testing {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  std::string out;
  if (!buffer.Dump(&slices).ok()) return out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

}  // namespace

grpc::Status RawUnary(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                      const std::string& request, std::string* reply) {
  std::vector<std::string> replies;
  grpc::Status status = RawStream(channel, method, {request}, &replies);
  if (reply != nullptr) *reply = replies.empty() ? std::string() : replies.front();
  return status;
}

grpc::Status RawStream(const std::shared_ptr<grpc::Channel>& channel, const std::string& method,
                       const std::vector<std::string>& messages,
                       std::vector<std::string>* replies) {
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  context.set_deadline(std::chrono::system_clock::now() + std::chrono::seconds(30));
  auto call = stub.PrepareCall(&context, method, &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  for (const std::string& bytes : messages) {
    if (!ok) break;
    grpc::Slice slice(bytes);
    grpc::ByteBuffer message(&slice, 1);
    call->Write(message, reinterpret_cast<void*>(2));
    cq.Next(&tag, &ok);
  }
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  for (;;) {
    grpc::ByteBuffer reply;
    call->Read(&reply, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
    if (!ok) break;
    if (replies != nullptr) replies->push_back(Flatten(reply));
  }
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

std::shared_ptr<grpc::Channel> OwnChannel(const std::string& target, int max_message_bytes) {
  grpc::ChannelArguments args;
  args.SetMaxReceiveMessageSize(max_message_bytes);
  args.SetMaxSendMessageSize(max_message_bytes);
  args.SetInt(GRPC_ARG_USE_LOCAL_SUBCHANNEL_POOL, 1);
  return grpc::CreateCustomChannel(target, grpc::InsecureChannelCredentials(), args);
}

}  // namespace optstate::testing
