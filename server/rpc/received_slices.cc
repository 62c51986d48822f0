#include "server/rpc/received_slices.h"

#include <utility>

namespace optstate {

ReceivedSlices::ReceivedSlices(ReceivedSlices&& other) noexcept
    : slices_(std::move(other.slices_)) {
  other.slices_.clear();
}

ReceivedSlices& ReceivedSlices::operator=(ReceivedSlices&& other) noexcept {
  if (this != &other) {
    Clear();
    slices_ = std::move(other.slices_);
    other.slices_.clear();
  }
  return *this;
}

grpc::Status ReceivedSlices::TakeFrom(grpc::ByteBuffer* buffer) {
  Clear();
  grpc::Status dumped = buffer->Dump(&slices_);
  buffer->Clear();  // grpc_byte_buffer_destroy: its references go in an ExecCtx.
  if (!dumped.ok()) Clear();
  return dumped;
}

void ReceivedSlices::Clear() {
  if (slices_.empty()) return;
  // The holder takes a reference to each slice, so clearing the vector drops
  // none of the last ones; the holder's destructor drops them in an ExecCtx.
  grpc::ByteBuffer holder(slices_.data(), slices_.size());
  slices_.clear();
}

}  // namespace optstate
