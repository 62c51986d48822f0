// The step's one finite check against a float64 reference of what the
// daemon reads: each element narrowed to the wire type, widened, times
// grad_scale, finite or not; the refusal names the first bad element.
#include "client/step/finite_check.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>
#include <vector>

#include "absl/strings/str_cat.h"

namespace optstate::client_internal {
namespace {

// The first element at or after `from` that the daemon would find not
// finite, in float64 (n when none).
size_t ReferenceFirstBad(const std::vector<float>& g, WireType type, float scale, size_t from) {
  for (size_t i = from; i < g.size(); ++i) {
    float wire_value = g[i];
    if (type != WireType::kFloat32) {
      uint16_t narrowed;
      EncodeFromFloat(type, &g[i], &narrowed, 1);
      DecodeToFloat(type, &narrowed, &wire_value, 1);
    }
    const double scaled = static_cast<double>(wire_value) * scale;
    if (!(std::fabs(scaled) <= std::numeric_limits<float>::max())) return i;
  }
  return g.size();
}

TEST(FiniteCheckTest, NamesTheFirstElementTheDaemonWouldRefuse) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  for (WireType type : {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16}) {
    for (float scale : {1.0f, 0.5f, 4.0f, 1e30f}) {
      for (size_t bad_at : {size_t{0}, size_t{4095}, size_t{4096}, size_t{9999}}) {
        for (float bad : {inf, -inf, nan, 7e4f, 3.4e38f}) {
          std::vector<float> g(10000, 0.25f);
          g[bad_at] = bad;
          GroupStep group{"g", g, {}};
          StepOptions options;
          options.gradient_dtype = type;
          options.grad_scale = scale;
          const size_t expected = ReferenceFirstBad(g, type, scale, 0);
          absl::Status status = CheckGivenFinite(group, options, 0, g.size());
          const std::string label =
              absl::StrCat(WireTypeName(type), " scale ", scale, " bad ", bad, " at ", bad_at);
          if (expected == g.size()) {
            EXPECT_TRUE(status.ok()) << label << ": " << status;
            continue;
          }
          ASSERT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << label;
          EXPECT_NE(status.message().find(absl::StrCat("at element ", expected, " ")),
                    std::string::npos)
              << label << ": " << status;
          // The same elements already in the wire type give the same answer.
          std::vector<uint16_t> wire16(g.size());
          const void* wire = g.data();
          if (type != WireType::kFloat32) {
            EncodeFromFloat(type, g.data(), wire16.data(), g.size());
            wire = wire16.data();
          }
          EXPECT_EQ(CheckWireFinite(group, options, wire, 0, g.size()), status) << label;
        }
      }
    }
  }
}

TEST(FiniteCheckTest, ChecksOnlyTheRangeAsked) {
  std::vector<float> g(100, 1.0f);
  g[10] = std::numeric_limits<float>::infinity();
  GroupStep group{"g", g, {}};
  StepOptions options;
  EXPECT_TRUE(CheckGivenFinite(group, options, 11, 89).ok());
  EXPECT_TRUE(CheckWireFinite(group, options, g.data() + 11, 11, 89).ok());
  absl::Status status = CheckGivenFinite(group, options, 8, 4);
  EXPECT_NE(status.message().find("at element 10 "), std::string::npos) << status;
  EXPECT_NE(status.message().find("nothing was sent"), std::string::npos) << status;
}

}  // namespace
}  // namespace optstate::client_internal
