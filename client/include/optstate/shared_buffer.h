// Memory a Client shares with its daemon (the same-host data plane): a
// trainer that keeps its gradients and params in it lets Step name them to
// the daemon instead of copying them.
#ifndef OPTSTATE_SHARED_BUFFER_H_
#define OPTSTATE_SHARED_BUFFER_H_

#include <cstdint>
#include <memory>

namespace optstate {

namespace client_internal {
struct SharedMapping;
}  // namespace client_internal

// Made by Client::AllocateSharedBuffer: `bytes()` bytes (zeroed, 4096-byte
// aligned) in a sealed memfd that the daemon maps too. Step passes a
// GroupStep's gradient or params_out that lies inside one of its Client's
// buffers, in the step's wire type (a float32 view with kFloat32, a 16-bit
// view of the wire's dtype), as a region slice: the daemon's kernel reads
// that gradient and writes those params where they are, and neither is
// copied. Anything else is copied through the Client's own region as before.
// The caller must not change a gradient, or read its params_out, while a
// Step using them runs (as for any buffer). Gradients and params_outs of one
// step must not share bytes (a params_out overlapping its own gradient is
// copied instead). Destroying the buffer unmaps it; the daemon forgets it at
// its Client's next step, or when the Client goes. Neither copied nor
// moved (Client hands it out as a unique_ptr); not thread-safe (the bytes
// are the caller's to synchronize).
class SharedBuffer {
 public:
  ~SharedBuffer();
  SharedBuffer(const SharedBuffer&) = delete;
  SharedBuffer& operator=(const SharedBuffer&) = delete;

  void* data() const;
  uint64_t bytes() const;

 private:
  friend class Client;
  explicit SharedBuffer(std::shared_ptr<client_internal::SharedMapping> mapping);
  std::shared_ptr<client_internal::SharedMapping> mapping_;
};

}  // namespace optstate

#endif  // OPTSTATE_SHARED_BUFFER_H_
