// The entry points of the freestanding program tests/emulated runs in the
// Bochs CPU emulator: linked with the kernel's own AVX-512 object (no libc,
// no loader), each takes one pointer (rdi) to a call record that the Python
// test fills in guest memory, calls the kernel's leaf function and writes
// its result back into the record. The record layouts are fixed here and
// packed by avx512_kernel_emulated_test.py with the same offsets.
#include <cstddef>
#include <cstdint>

#include "common/cpu_features.h"
#include "server/kernels/adamw_kernel_scalar.h"

namespace {

using optstate::AdamWConstants;
using optstate::ParamsStore;
using optstate::WireType;

// No params out (AdamWUpdateVectorsAvx512 with a null params_out).
constexpr uint32_t kNoParams = 255;

struct UpdateCall {
  float decay, lerp_coefficient, beta2, one_minus_beta2, neg_step_size, bias_correction2_sqrt, eps,
      grad_scale;
  uint32_t lerp_from_gradient;
  uint32_t grad_type;    // WireType's value.
  uint32_t params_type;  // WireType's value, or kNoParams.
  uint32_t store;        // ParamsStore's value.
  uint64_t p, m, v, grad, params_out, count;
  uint64_t span_begin, span_end;  // Written by the call.
  uint64_t vmax;                  // max_exp_avg_sq (amsgrad), or 0 for none.
  // A gradient read ahead (AheadBits), or ahead 0 for none.
  uint64_t ahead, ahead_bytes;
  uint32_t ahead_type;  // WireType's value.
  uint32_t ahead_bad;   // Written by the call: AheadBits::bad.
  uint64_t ahead_read;  // Written by the call: AheadBits::read.
};
static_assert(offsetof(UpdateCall, lerp_from_gradient) == 32);
static_assert(offsetof(UpdateCall, p) == 48);
static_assert(offsetof(UpdateCall, span_begin) == 96);
static_assert(offsetof(UpdateCall, vmax) == 112);
static_assert(offsetof(UpdateCall, ahead) == 120);
static_assert(offsetof(UpdateCall, ahead_type) == 136);
static_assert(offsetof(UpdateCall, ahead_read) == 144);
static_assert(sizeof(UpdateCall) == 152);

struct FindCall {
  uint64_t grad, count;
  uint32_t grad_type;
  float grad_scale;
  uint64_t result;  // Written by the call.
};
static_assert(offsetof(FindCall, grad_type) == 16);
static_assert(offsetof(FindCall, result) == 24);
static_assert(sizeof(FindCall) == 32);

template <typename T>
T* Pointer(uint64_t address) {
  return reinterpret_cast<T*>(static_cast<uintptr_t>(address));
}

}  // namespace

extern "C" void probe_update_vectors(UpdateCall* call) {
  AdamWConstants c;
  c.decay = call->decay;
  c.lerp_coefficient = call->lerp_coefficient;
  c.lerp_from_gradient = call->lerp_from_gradient != 0;
  c.beta2 = call->beta2;
  c.one_minus_beta2 = call->one_minus_beta2;
  c.neg_step_size = call->neg_step_size;
  c.bias_correction2_sqrt = call->bias_correction2_sqrt;
  c.eps = call->eps;
  c.grad_scale = call->grad_scale;
  const bool has_params = call->params_type != kNoParams;
  optstate::kernel_internal::AheadBits ahead;
  ahead.data = Pointer<const unsigned char>(call->ahead);
  ahead.bytes = call->ahead_bytes;
  ahead.type = static_cast<WireType>(call->ahead_type);
  const optstate::kernel_internal::VectorSpan span =
      optstate::kernel_internal::AdamWUpdateVectorsAvx512(
          c, Pointer<float>(call->p), Pointer<float>(call->m), Pointer<float>(call->v),
          call->vmax == 0 ? nullptr : Pointer<float>(call->vmax),
          Pointer<const void>(call->grad), static_cast<WireType>(call->grad_type), call->count,
          has_params ? Pointer<void>(call->params_out) : nullptr,
          has_params ? static_cast<WireType>(call->params_type) : WireType::kFloat32,
          static_cast<ParamsStore>(call->store), call->ahead == 0 ? nullptr : &ahead);
  call->span_begin = span.begin;
  call->span_end = span.end;
  call->ahead_bad = ahead.bad ? 1 : 0;
  call->ahead_read = ahead.read;
}

extern "C" void probe_find_non_finite(FindCall* call) {
  call->result = optstate::kernel_internal::FindNonFiniteVectorsAvx512(
      Pointer<const void>(call->grad), static_cast<WireType>(call->grad_type), call->count,
      call->grad_scale);
}

// optstate::CpuHasAvx512f (CPUID and XGETBV) as the guest's CPU and OS
// answer it: what makes the kernel choose its AVX-512 path.
extern "C" void probe_cpu_has_avx512f(uint64_t* result) {
  *result = optstate::CpuHasAvx512f() ? 1 : 0;
}
