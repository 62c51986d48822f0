// Step messages built with protobuf, for the groups StepInputTarget holds.
#include "tests/fuzz/step_input_seeds.h"

#include <cmath>
#include <cstdint>
#include <limits>

#include "optstate/dtype.h"
#include "optstate/v1/optstate.pb.h"

namespace optstate::fuzz {
namespace {

v1::StepRequest Chunk(const std::string& group, uint64_t step, uint64_t offset, size_t elements,
                      v1::DType dtype = v1::DTYPE_FLOAT32) {
  v1::StepRequest chunk;
  chunk.set_group(group);
  chunk.set_step(step);
  chunk.set_offset(offset);
  chunk.set_gradient_dtype(dtype);
  std::vector<float> values(elements);
  for (size_t i = 0; i < elements; ++i) values[i] = 0.01f * std::sin(0.1f * i);
  std::string bytes(elements * (dtype == v1::DTYPE_FLOAT32 ? 4 : 2), '\0');
  const WireType type = dtype == v1::DTYPE_BFLOAT16  ? WireType::kBFloat16
                        : dtype == v1::DTYPE_FLOAT16 ? WireType::kFloat16
                                                     : WireType::kFloat32;
  EncodeFromFloat(type, values.data(), bytes.data(), elements);
  chunk.set_gradient(bytes);
  return chunk;
}

std::string Input(uint8_t cut, const v1::StepRequest& request, const std::string& extra = "") {
  return std::string(1, static_cast<char>(cut)) + request.SerializeAsString() + extra;
}

}  // namespace

std::vector<std::string> StepInputSeeds() {
  std::vector<std::string> seeds;
  seeds.push_back(Input(0x00, Chunk("a", 1, 0, 1024)));
  seeds.push_back(Input(0x37, Chunk("a", 1, 0, 1024)));  // The same again: a replay.
  v1::StepRequest last = Chunk("a", 1, 2048, 952, v1::DTYPE_BFLOAT16);
  last.set_param_dtype(v1::DTYPE_BFLOAT16);
  seeds.push_back(Input(0x5a, last));
  v1::StepRequest packed = Chunk("b", 1, 0, 1024, v1::DTYPE_FLOAT16);
  *packed.add_more() = Chunk("a", 1, 1024, 1024);
  *packed.add_more() = Chunk("a", 2, 0, 3000);
  packed.mutable_more(1)->set_lr(0.5f);
  packed.mutable_more(1)->set_grad_scale(0.25f);
  packed.mutable_more(1)->set_group_elements(3000);
  packed.mutable_more(1)->set_param_dtype(v1::DTYPE_FLOAT16);
  seeds.push_back(Input(0xc4, packed));
  seeds.push_back(Input(0x11, Chunk("c", 1, 0, 1024)));  // Awaits initial values.
  v1::StepRequest not_finite = Chunk("b", 2, 0, 1024);
  float nan = std::numeric_limits<float>::quiet_NaN();
  not_finite.mutable_gradient()->replace(40, 4, reinterpret_cast<const char*>(&nan), 4);
  seeds.push_back(Input(0x80, not_finite));
  v1::StepRequest other_size = Chunk("b", 2, 0, 1024);
  other_size.set_group_elements(2048);
  seeds.push_back(Input(0x08, other_size));
  // Unknown fields: a varint, bytes, a fixed64 and a known number with another wire type.
  seeds.push_back(Input(0x26, Chunk("b", 2, 0, 1024),
                        std::string("\xa0\x01\x2a\xaa\x01\x03xyz\xb1\x01", 11) +
                            std::string(8, 'q') + std::string("\x12\x02hi", 4)));
  seeds.push_back(Input(0xff, Chunk("a", 3, 0, 3000)));  // Skips ahead.
  // The same-host data plane: chunks naming StepInputTarget's region (id 1;
  // the target fills in its session key) for the gradient and the params,
  // for the gradient only, and past the region's end.
  auto in_region = [](v1::StepRequest chunk, uint64_t gradient_at, uint64_t params_at) {
    v1::RegionSlice* g = chunk.mutable_gradient_region();
    g->set_region(1);
    g->set_offset(gradient_at);
    g->set_bytes(chunk.gradient().size());
    if (params_at != UINT64_MAX) {
      const uint64_t elements =
          chunk.gradient().size() / (chunk.gradient_dtype() == v1::DTYPE_FLOAT32 ? 4 : 2);
      v1::RegionSlice* p = chunk.mutable_params_region();
      p->set_region(1);
      p->set_offset(params_at);
      p->set_bytes(elements * (chunk.param_dtype() == v1::DTYPE_FLOAT32 ||
                                       chunk.param_dtype() == v1::DTYPE_UNSPECIFIED
                                   ? 4
                                   : 2));
    }
    chunk.clear_gradient();
    return chunk;
  };
  seeds.push_back(Input(0x00, in_region(Chunk("b", 3, 0, 1024), 0, 8192)));
  seeds.push_back(
      Input(0x21, in_region(Chunk("a", 2, 1024, 1024, v1::DTYPE_BFLOAT16), 4096, UINT64_MAX)));
  seeds.push_back(Input(0x00, in_region(Chunk("b", 4, 0, 1024), 65536 - 100, 8192)));
  // Step plans: b's chunk kept as plan 3, a use of it with an lr, and a use
  // of a plan never defined.
  v1::StepRequest definition = in_region(Chunk("b", 3, 0, 1024), 0, 8192);
  definition.set_plan(3);
  seeds.push_back(Input(0x00, definition));
  v1::StepRequest use;
  use.set_plan(3);
  use.set_step(4);
  use.set_lr(5e-4);
  seeds.push_back(Input(0x00, use));
  use.set_plan(4);
  seeds.push_back(Input(0x00, use));
  return seeds;
}

}  // namespace optstate::fuzz
