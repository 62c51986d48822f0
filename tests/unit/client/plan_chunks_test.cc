// PlanChunks against plans worked out by hand: chunks of whole pages,
// chunk_bytes rounded down to pages (at least one, at most what fits a
// message), small chunks packed up to chunk_bytes and 1024 a message, the
// message limit counting the widest payload, the name and 96 bytes a chunk,
// and a group's short tail page.
#include "client/step/plan_chunks.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <string>
#include <vector>

namespace optstate::client_internal {
namespace {

// A message as (group, offset, count) triples, for readable comparisons.
using Triple = std::vector<uint64_t>;
using Plan = std::vector<std::vector<Triple>>;

Plan Flatten(const std::vector<PlannedPieces>& messages) {
  Plan out;
  for (const PlannedPieces& m : messages) {
    std::vector<Triple>& pieces = out.emplace_back();
    for (const ChunkPiece& p : m) pieces.push_back({p.group, p.offset, p.count});
  }
  return out;
}

constexpr uint64_t kRoom = 4096;  // What every message keeps for other fields.

ChunkLimits Limits(uint64_t chunk_bytes, uint64_t max_message_bytes = 64 << 20,
                   WireType gradient = WireType::kFloat32, WireType params = WireType::kFloat32) {
  return {chunk_bytes, max_message_bytes, gradient, params};
}

TEST(PlanChunks, CutsAGroupIntoChunksOfWholePagesWithChunkBytesRoundedDown) {
  // 9,500 elements in pages of 1,000: ten pages, the last 500. A float32
  // page is 4,000 bytes, so 10,000 chunk bytes make two-page chunks; two of
  // them (16,000 bytes) are past chunk_bytes, so none is packed.
  const ChunkGroup groups[] = {{"w", 9500, 1000}};
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, Limits(10000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 2000}},
                                  {{0, 2000, 2000}},
                                  {{0, 4000, 2000}},
                                  {{0, 6000, 2000}},
                                  {{0, 8000, 1500}}}));
  EXPECT_EQ(PagesPerChunk(groups[0], Limits(10000)).value(), 2u);
  EXPECT_EQ(PagesPerChunk(groups[0], Limits(11999)).value(), 2u);
  EXPECT_EQ(PagesPerChunk(groups[0], Limits(12000)).value(), 3u);
}

TEST(PlanChunks, AChunkIsAtLeastOnePage) {
  // 100 chunk bytes are less than one 4,000-byte page: one page a chunk,
  // and no chunk fits beside another.
  const ChunkGroup groups[] = {{"w", 2500, 1000}};
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, Limits(100));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 1000}}, {{0, 1000, 1000}}, {{0, 2000, 500}}}));
}

TEST(PlanChunks, PagesAreCountedInTheGradientsWireType) {
  // A bfloat16 page of 1,000 elements is 2,000 bytes: 10,000 chunk bytes
  // make five-page chunks.
  const ChunkGroup groups[] = {{"w", 12000, 1000}};
  const ChunkLimits limits = Limits(10000, 64 << 20, WireType::kBFloat16, WireType::kBFloat16);
  EXPECT_EQ(PagesPerChunk(groups[0], limits).value(), 5u);
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 5000}}, {{0, 5000, 5000}}, {{0, 10000, 2000}}}));
}

TEST(PlanChunks, ChunksStayWithinTheMessageLimitCountingTheWidestPayload) {
  // bfloat16 gradients but float32 params: a reply page is 4,000 bytes. A
  // message limit of 4,096 + 12,500 bytes holds three such pages, however
  // large chunk_bytes is (it would allow 524 bfloat16 pages).
  const ChunkGroup groups[] = {{"w", 7000, 1000}};
  const ChunkLimits limits = Limits(1 << 20, kRoom + 12500, WireType::kBFloat16);
  EXPECT_EQ(PagesPerChunk(groups[0], limits).value(), 3u);
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 3000}}, {{0, 3000, 3000}}, {{0, 6000, 1000}}}));
}

TEST(PlanChunks, APageThatFitsNoMessageIsRefusedNamingTheGroup) {
  // The second group's float32 page (4,000 bytes) is one byte too many.
  const ChunkGroup groups[] = {{"small", 10, 999}, {"big", 10, 1000}};
  const ChunkLimits limits = Limits(1 << 20, kRoom + 3999);
  EXPECT_TRUE(PagesPerChunk(groups[0], limits).ok());
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, limits);
  EXPECT_EQ(plan.status().code(), absl::StatusCode::kInvalidArgument);
  EXPECT_THAT(std::string(plan.status().message()),
              ::testing::HasSubstr("one page of group 'big' (1000 elements) does not fit "
                                   "ClientOptions.max_message_bytes=8095"));
}

TEST(PlanChunks, PagesOfNoElementsAreAnInternalError) {
  const ChunkGroup groups[] = {{"odd", 10, 0}};
  EXPECT_EQ(PlanChunks(groups, Limits(1 << 20)).status().code(), absl::StatusCode::kInternal);
}

TEST(PlanChunks, SmallTensorsArePackedUpToChunkBytes) {
  // Five groups of 100 float32 elements (400 bytes each) and 1,000 chunk
  // bytes: two a message (800 bytes), a third would make 1,200.
  std::vector<ChunkGroup> groups(5, ChunkGroup{"abc", 100, 1000});
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, Limits(1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan),
            (Plan{{{0, 0, 100}, {1, 0, 100}}, {{2, 0, 100}, {3, 0, 100}}, {{4, 0, 100}}}));
  // Exactly chunk_bytes packs: 1,200 bytes take three.
  plan = PlanChunks(groups, Limits(1200));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan),
            (Plan{{{0, 0, 100}, {1, 0, 100}, {2, 0, 100}}, {{3, 0, 100}, {4, 0, 100}}}));
}

TEST(PlanChunks, MessageGradientBytesPacksChunksOfChunkBytesIntoLargerMessages) {
  // 9,500 elements in pages of 1,000, 4,000-byte chunks (one page) packed up
  // to 12,000 bytes of gradient: three chunks a message, the tail of 500
  // with the tenth page's chunk.
  const ChunkGroup groups[] = {{"w", 9500, 1000}};
  ChunkLimits limits = Limits(4000);
  limits.message_gradient_bytes = 12000;
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, limits);
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 1000}, {0, 1000, 1000}, {0, 2000, 1000}},
                                  {{0, 3000, 1000}, {0, 4000, 1000}, {0, 5000, 1000}},
                                  {{0, 6000, 1000}, {0, 7000, 1000}, {0, 8000, 1000}},
                                  {{0, 9000, 500}}}));
}

TEST(PlanChunks, AMessagePacksAtMost1024Chunks) {
  std::vector<ChunkGroup> groups(2000, ChunkGroup{"g", 1, 1000});
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, Limits(1 << 20));
  ASSERT_TRUE(plan.ok()) << plan.status();
  ASSERT_EQ(plan->size(), 2u);
  ASSERT_EQ((*plan)[0].size(), 1024u);
  ASSERT_EQ((*plan)[1].size(), 976u);
  for (size_t i = 0; i < 2000; ++i) {
    const ChunkPiece& p = (*plan)[i / 1024][i % 1024];
    EXPECT_EQ(p.group, i);
    EXPECT_EQ(p.offset, 0u);
    EXPECT_EQ(p.count, 1u);
  }
}

TEST(PlanChunks, PackingCountsNameAndFieldsAgainstTheMessageLimit) {
  // Pages of 200 elements fit a limit of 4,096 + 1,000 bytes (800 bytes a
  // page). A chunk of 100 float32 elements named "name" counts 400 + 4 + 96
  // = 500 bytes: two fill the 1,000, a third goes to a new message though
  // chunk_bytes would take it.
  std::vector<ChunkGroup> groups(3, ChunkGroup{"name", 100, 200});
  absl::StatusOr<std::vector<PlannedPieces>> plan =
      PlanChunks(groups, Limits(1 << 20, kRoom + 1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 100}, {1, 0, 100}}, {{2, 0, 100}}}));
  // A name one byte longer: each chunk counts 501, and two no longer fit.
  groups.assign(3, ChunkGroup{"name5", 100, 200});
  plan = PlanChunks(groups, Limits(1 << 20, kRoom + 1000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan), (Plan{{{0, 0, 100}}, {{1, 0, 100}}, {{2, 0, 100}}}));
}

TEST(PlanChunks, AGroupsShortTailPageSharesAMessageWithTheNextGroup) {
  // One-page chunks (4,000 chunk bytes). Group 0 ends in a tail of 500
  // elements (2,000 bytes); group 1's 100 elements (400 bytes) join it; the
  // full pages before it fill their messages alone.
  const ChunkGroup groups[] = {{"a", 2500, 1000}, {"b", 100, 1000}};
  absl::StatusOr<std::vector<PlannedPieces>> plan = PlanChunks(groups, Limits(4000));
  ASSERT_TRUE(plan.ok()) << plan.status();
  EXPECT_EQ(Flatten(*plan),
            (Plan{{{0, 0, 1000}}, {{0, 1000, 1000}}, {{0, 2000, 500}, {1, 0, 100}}}));
}

TEST(PlanChunks, NoGroupsOrEmptyGroupsPlanNoMessages) {
  EXPECT_TRUE(PlanChunks({}, Limits(1 << 20)).value().empty());
  const ChunkGroup groups[] = {{"empty", 0, 1000}};
  EXPECT_TRUE(PlanChunks(groups, Limits(1 << 20)).value().empty());
}

}  // namespace
}  // namespace optstate::client_internal
