// The client side of the byte-level benchmark streams (raw echo, minimal
// AdamW service): one bidirectional call that sends a step's chunks in order
// with at most `window` unanswered, as Client::Step does, and hands each reply
// to the subclass.
#ifndef OPTSTATE_BENCH_WINDOWED_STREAM_H_
#define OPTSTATE_BENCH_WINDOWED_STREAM_H_

#include <condition_variable>
#include <cstddef>
#include <memory>
#include <mutex>
#include <string>

#include "absl/status/status.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"

namespace optstate::bench {

// A channel to `target` with the arguments optstate::Client uses: message
// limits of `max_message_bytes` and a connection of its own (else the
// clients of an 8-client run would share one).
std::shared_ptr<grpc::Channel> MakeClientChannel(const std::string& target, int max_message_bytes);

class WindowedStream : public grpc::ClientBidiReactor<grpc::ByteBuffer, grpc::ByteBuffer> {
 public:
  // `chunks` messages per call (at least one), `window` >= 1.
  WindowedStream(size_t chunks, size_t window) : chunks_(chunks), window_(window) {}

  // Runs one call of `method` and returns when it has ended: OK once every
  // reply has arrived and been accepted.
  absl::Status Run(grpc::GenericStub& stub, const char* method);

 protected:
  // The message of chunk `index`; it must stay valid until the next call of
  // Request or the end of the call. Calls come in order, one at a time.
  virtual const grpc::ByteBuffer* Request(size_t index) = 0;
  // Takes the reply to chunk `index`; false cancels the call with `error`.
  // Calls come in order, one at a time.
  virtual bool Accept(size_t index, const grpc::ByteBuffer& reply, absl::Status* error) = 0;

 private:
  // Called with writing_ set by the caller; writes chunk next_.
  void WriteNext();
  // Takes the writer role if a chunk may go now; with mu_ held.
  bool ClaimWrite();
  void OnWriteDone(bool ok) override;
  void OnReadDone(bool ok) override;
  void OnDone(const grpc::Status& status) override;

  const size_t chunks_;
  const size_t window_;
  grpc::ClientContext context_;
  grpc::ByteBuffer reply_;
  std::mutex mu_;
  std::condition_variable finished_;
  size_t next_ = 0;      // Next chunk to write.
  size_t answered_ = 0;  // Replies accepted.
  bool writing_ = false;
  bool done_ = false;
  absl::Status error_;
  grpc::Status status_;
};

}  // namespace optstate::bench

#endif  // OPTSTATE_BENCH_WINDOWED_STREAM_H_
