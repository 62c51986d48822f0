// The slices of a message gRPC received, kept after its ByteBuffer is gone
// (a Step request's gradients are read where they arrived), and released
// where gRPC can account for them from any thread.
//
// Their memory is counted by the server's grpc::ResourceQuota
// (--grpc_buffer_bytes). In gRPC 1.51, giving such memory back may register
// the quota's reclaimer through ExecCtx::Run, which needs an ExecCtx on the
// releasing thread: the daemon's worker threads have none, and a plain
// grpc::Slice destroyed there crashed the daemon (SIGSEGV in
// ReclaimerQueue::Enqueue) under memory pressure. So the slices are
// released through a grpc::ByteBuffer, whose destruction
// (grpc_byte_buffer_destroy) opens an ExecCtx for the last references.
#ifndef OPTSTATE_SERVER_RPC_RECEIVED_SLICES_H_
#define OPTSTATE_SERVER_RPC_RECEIVED_SLICES_H_

#include <vector>

#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "grpcpp/support/status.h"

namespace optstate {

class ReceivedSlices {
 public:
  ReceivedSlices() = default;
  ReceivedSlices(ReceivedSlices&& other) noexcept;
  ReceivedSlices& operator=(ReceivedSlices&& other) noexcept;
  ReceivedSlices(const ReceivedSlices&) = delete;
  ReceivedSlices& operator=(const ReceivedSlices&) = delete;
  ~ReceivedSlices() { Clear(); }

  // Releases what was held, then takes `buffer`'s slices (buffer emptied).
  // Not OK when gRPC cannot read the buffer's bytes; nothing is held then.
  grpc::Status TakeFrom(grpc::ByteBuffer* buffer);

  // Releases every slice, from any thread.
  void Clear();

  const std::vector<grpc::Slice>& slices() const { return slices_; }

 private:
  std::vector<grpc::Slice> slices_;
};

}  // namespace optstate

#endif  // OPTSTATE_SERVER_RPC_RECEIVED_SLICES_H_
