// The typed buffer views GroupStep takes: float buffers pass as they are,
// 16-bit ones only through Of16Bit with their dtype, and nothing else converts.
#include "optstate/buffer_view.h"

#include <gtest/gtest.h>

#include <cstdint>
#include <type_traits>
#include <vector>

namespace optstate {
namespace {

// A 16-bit buffer, or a view of the wrong constness, does not pass for floats.
static_assert(!std::is_convertible_v<std::vector<uint16_t>&, ConstBufferView>);
static_assert(!std::is_convertible_v<absl::Span<const uint16_t>, ConstBufferView>);
static_assert(!std::is_convertible_v<std::vector<uint16_t>&, BufferView>);
static_assert(!std::is_convertible_v<const std::vector<float>&, BufferView>);
static_assert(!std::is_convertible_v<absl::Span<const float>, BufferView>);
static_assert(!std::is_convertible_v<std::vector<double>&, ConstBufferView>);
// Float buffers do.
static_assert(std::is_convertible_v<const std::vector<float>&, ConstBufferView>);
static_assert(std::is_convertible_v<absl::Span<float>, ConstBufferView>);
static_assert(std::is_convertible_v<absl::Span<float>, BufferView>);
// As for absl::Span<float>, a mutable vector passes by absl::MakeSpan, not on its own.
static_assert(!std::is_convertible_v<std::vector<float>&, BufferView>);

TEST(BufferView, DefaultIsAnEmptyFloat32View) {
  EXPECT_TRUE(ConstBufferView().empty());
  EXPECT_EQ(ConstBufferView().dtype(), WireType::kFloat32);
  EXPECT_EQ(ConstBufferView().data(), nullptr);
  EXPECT_TRUE(BufferView().empty());
  EXPECT_EQ(BufferView().dtype(), WireType::kFloat32);
  EXPECT_EQ(BufferView().element_bytes(), 4u);
}

TEST(BufferView, FloatBuffersAreFloat32ViewsOfTheSameMemory) {
  std::vector<float> floats(7, 1.5f);
  const ConstBufferView from_vector = floats;
  EXPECT_EQ(from_vector.data(), floats.data());
  EXPECT_EQ(from_vector.size(), 7u);
  EXPECT_EQ(from_vector.dtype(), WireType::kFloat32);
  EXPECT_EQ(from_vector.element_bytes(), 4u);
  EXPECT_FALSE(from_vector.empty());
  const BufferView mutable_view = absl::MakeSpan(floats).subspan(2);
  EXPECT_EQ(mutable_view.data(), floats.data() + 2);
  EXPECT_EQ(mutable_view.size(), 5u);
  const ConstBufferView from_mutable_span = absl::MakeSpan(floats);
  EXPECT_EQ(from_mutable_span.data(), floats.data());
}

TEST(BufferView, Of16BitKeepsItsDtypeAndCountsElements) {
  std::vector<uint16_t> halves(9);
  const ConstBufferView g = ConstBufferView::Of16Bit(halves, WireType::kBFloat16);
  EXPECT_EQ(g.data(), halves.data());
  EXPECT_EQ(g.size(), 9u);
  EXPECT_EQ(g.dtype(), WireType::kBFloat16);
  EXPECT_EQ(g.element_bytes(), 2u);
  const BufferView p = BufferView::Of16Bit(absl::MakeSpan(halves), WireType::kFloat16);
  EXPECT_EQ(p.data(), halves.data());
  EXPECT_EQ(p.dtype(), WireType::kFloat16);
  EXPECT_EQ(p.element_bytes(), 2u);
  // A dtype that is not 16-bit is kept as given, and still reads as 16-bit elements, so
  // Client::Step can refuse it.
  const ConstBufferView wrong = ConstBufferView::Of16Bit(halves, WireType::kFloat32);
  EXPECT_EQ(wrong.dtype(), WireType::kFloat32);
  EXPECT_EQ(wrong.element_bytes(), 2u);
}

}  // namespace
}  // namespace optstate
