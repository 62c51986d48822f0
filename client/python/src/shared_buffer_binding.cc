// Client.allocate_shared_buffer: a SharedBuffer (optstate/shared_buffer.h)
// as a writable numpy uint8 array that owns it.
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <memory>

#include "errors.h"
#include "optstate/shared_buffer.h"
#include "py_client.h"

namespace nb = nanobind;

namespace optstate::python {

void BindSharedBuffer(nb::class_<PyClient>& cls) {
  cls.def(
      "allocate_shared_buffer",
      [](PyClient& self, uint64_t nbytes) {
        absl::StatusOr<std::unique_ptr<SharedBuffer>> buffer;
        {
          const std::shared_ptr<Client> live = self.live();
          nb::gil_scoped_release release;
          buffer = live->AllocateSharedBuffer(nbytes);
        }
        ThrowIfError(buffer.status(), self.target);
        SharedBuffer* owned = buffer->release();
        // The array owns the buffer: it is unmapped when the last array or
        // tensor viewing it goes.
        nb::capsule owner(owned, [](void* p) noexcept { delete static_cast<SharedBuffer*>(p); });
        return nb::ndarray<nb::numpy, uint8_t, nb::ndim<1>>(
            owned->data(), {static_cast<size_t>(owned->bytes())}, owner);
      },
      nb::arg("nbytes"),
      "Memory shared with the daemon (the same-host data plane), as a writable numpy\n"
      "uint8 array of `nbytes` rounded up to 4096, zeroed and 4096-byte aligned.\n\n"
      "A step whose gradients and params lie in such buffers, in the wire dtype (float32\n"
      "views for float32, bfloat16 views with wire_dtype='bfloat16'), copies nothing: the\n"
      "daemon reads the gradients and writes the params where they are, and a step wholly\n"
      "in buffers goes as one message the daemon checks before applying any of it. Views\n"
      "(numpy's .view(np.float32)[a:b], torch.from_numpy(array).view(torch.float32)) work\n"
      "the same; anything else steps as before, copied through the client's own region.\n"
      "Do not change a gradient or read its params while a step using them runs. The\n"
      "buffer is unmapped when the array and every view of it are gone; the daemon forgets\n"
      "it at this client's next step. FailedPrecondition on a data_plane='wire' client or\n"
      "without a usable region socket; ResourceExhausted past the daemon's region limits.");
}

}  // namespace optstate::python
