// MessageStep on a large message (4 MiB of gradients or more), which it
// spreads over the pool: the values of every chunk checked in parts on
// several threads, chunks that share no page (of distinct groups, or of
// disjoint pages of one) applied at once. The
// answers must be those of the message applied in order on one thread: the
// same state bit for bit, the same refusal (the first bad chunk and its
// first bad element; a value refusal before an earlier-checked field
// refusal only when it comes first), nothing applied on a refusal before
// the update, and a message that covers a page more than once applied in
// order. And on any message: a chunk the transport could not read is
// refused in its turn, and a refusal says what it left applied. A message
// whose sender checked its values (SenderChecked::kValues) steps the same
// bits; its small chunks are checked as they are applied, so a bad value
// there refuses that chunk unapplied and leaves others applied, while a
// bad value in a large chunk still refuses the whole message.
#include "server/engine/message_step.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kGroups = 8;
constexpr uint64_t kElements = (1 << 20) + 123;  // 4 MiB and a short last page per group.
constexpr uint64_t kRegion = 7;                  // The id of the test's stand-in region.

class MessageStepTest : public ::testing::Test {
 protected:
  MessageStepTest()
      : pool_(2),
        backend_(&pool_),
        store_(&backend_, uint64_t{8} << 30, kPage),
        engine_(&store_, &backend_, &pool_) {
    const uint64_t seed = testing::TestSeed();
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.0f, 1e-2f);
    grads_.resize(kGroups);
    for (std::vector<float>& grad : grads_) {
      grad.resize(kElements);
      for (float& g : grad) g = normal(rng);
    }
  }

  void Register(const std::string& prefix) {
    for (uint64_t g = 0; g < kGroups; ++g) {
      GroupConfig config;
      config.num_elements = kElements;
      ASSERT_TRUE(store_.Register(GroupKey{"", absl::StrCat(prefix, g)}, config).ok());
    }
  }

  Group& GroupOf(const std::string& name) { return **store_.Find(GroupKey{"", name}); }

  // The bits of a group's params, m and v.
  std::vector<uint32_t> StateBits(const std::string& name) {
    Group& group = GroupOf(name);
    std::vector<uint32_t> bits(3 * kElements);
    std::memcpy(bits.data(), group.params(), kElements * 4);
    std::memcpy(bits.data() + kElements, group.exp_avg(), kElements * 4);
    std::memcpy(bits.data() + 2 * kElements, group.exp_avg_sq(), kElements * 4);
    return bits;
  }

  // Appends a chunk of `name` at `step` over grad[begin, end).
  static void AddChunk(std::vector<MessageChunk>* message, const std::string& name, uint64_t step,
                       const std::vector<float>& grad, uint64_t begin, uint64_t end) {
    MessageChunk& chunk = message->emplace_back();
    chunk.chunk.group = GroupKey{"", name};
    chunk.chunk.step = step;
    chunk.chunk.offset = begin;
    chunk.chunk.gradient = SegmentedBytes(absl::string_view(
        reinterpret_cast<const char*>(grad.data() + begin), (end - begin) * sizeof(float)));
  }

  // One message: the first kSmallChunk elements of every group at `step`
  // (chunks of kCheckedAsAppliedBytes: checked as applied when the sender
  // checked them; 8 MiB in all, so spread and applied at once).
  static constexpr uint64_t kSmallChunk = kCheckedAsAppliedBytes / sizeof(float);
  std::vector<MessageChunk> SmallChunkStep(const std::string& prefix, uint64_t step,
                                           const std::vector<std::vector<float>>& grads) {
    std::vector<MessageChunk> message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddChunk(&message, absl::StrCat(prefix, g), step, grads[g], 0, kSmallChunk);
    }
    return message;
  }

  // One message: every group's whole gradient at `step`.
  std::vector<MessageChunk> WholeStep(const std::string& prefix, uint64_t step,
                                      const std::vector<std::vector<float>>& grads) {
    std::vector<MessageChunk> message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddChunk(&message, absl::StrCat(prefix, g), step, grads[g], 0, kElements);
    }
    return message;
  }

  // Checks and applies `message`, as the transport does, the params for
  // the reply written to buffers of its own.
  MessageRefusal Step(std::vector<MessageChunk> message,
                      SenderChecked sender_checked = SenderChecked::kNothing) {
    MessageStep step(&engine_, std::move(message), sender_checked);
    MessageRefusal refusal = step.Check();
    if (!refusal.ok()) return refusal;
    std::vector<std::string> out(step.size());
    return step.Apply([&out](size_t i, size_t bytes) {
      out[i].resize(bytes);
      return out[i].data();
    });
  }

  // That `refusal` is of chunk `chunk` for a non-finite value at `element`,
  // with `applied` left as it says.
  static void ExpectBadValue(const MessageRefusal& refusal, size_t chunk, uint64_t element,
                             MessageApplied applied) {
    EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
    EXPECT_EQ(refusal.chunk, chunk);
    EXPECT_EQ(refusal.applied, applied);
    EXPECT_NE(refusal.status.message().find(absl::StrCat("at element ", element, " ")),
              std::string::npos)
        << refusal.status;
  }

  // Region tests: a buffer standing in for region kRegion, of `slices`
  // slices of one group's float32 elements, slice i holding grads_[i %
  // kGroups].
  static constexpr uint64_t kSlice = kElements * sizeof(float);

  std::vector<float> NewRegion(uint64_t slices) {
    std::vector<float> region(slices * kElements);
    for (uint64_t i = 0; i < slices; ++i) {
      std::memcpy(SliceOf(region, i), grads_[i % kGroups].data(), kSlice);
    }
    return region;
  }

  static char* SliceOf(std::vector<float>& region, uint64_t slice) {
    return reinterpret_cast<char*>(region.data() + slice * kElements);
  }

  // Appends a chunk of `name` reading its gradient from slice `gradient` of
  // `region` and writing its params into slice `params`.
  static void AddRegionChunk(std::vector<MessageChunk>* message, const std::string& name,
                             std::vector<float>& region, uint64_t gradient, uint64_t params,
                             uint64_t step = 1) {
    MessageChunk& chunk = message->emplace_back();
    chunk.chunk.group = GroupKey{"", name};
    chunk.chunk.step = step;
    chunk.chunk.gradient = SegmentedBytes(absl::string_view(SliceOf(region, gradient), kSlice));
    chunk.params_out = SliceOf(region, params);
    chunk.gradient_region = RegionSpan{kRegion, gradient * kSlice, kSlice};
    chunk.params_region = RegionSpan{kRegion, params * kSlice, kSlice};
  }

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  StepEngine engine_;
  std::vector<std::vector<float>> grads_;
};

// Three steps of one 32 MiB message against the same steps in messages of
// 256 Ki elements (1 MiB: not spread), each applied on its own.
TEST_F(MessageStepTest, ASpreadMessageStepsBitIdenticallyToSmallMessagesInOrder) {
  Register("spread.");
  Register("small.");
  for (uint64_t step = 1; step <= 3; ++step) {
    MessageStep spread(&engine_, WholeStep("spread.", step, grads_));
    ASSERT_TRUE(spread.Check().ok());
    std::vector<std::string> out(kGroups);
    ASSERT_TRUE(spread
                    .Apply([&out](size_t i, size_t bytes) {
                      out[i].resize(bytes);
                      return out[i].data();
                    })
                    .ok());
    for (uint64_t g = 0; g < kGroups; ++g) {
      const std::string name = absl::StrCat("spread.", g);
      EXPECT_EQ(spread.result(g).pages_applied, (kElements + kPage - 1) / kPage);
      EXPECT_EQ(spread.reply_params_bytes(g), kElements * 4);
      ASSERT_EQ(out[g].size(), kElements * 4);
      EXPECT_EQ(std::memcmp(out[g].data(), GroupOf(name).params(), kElements * 4), 0)
          << "the params written are those after the step";
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      for (uint64_t begin = 0; begin < kElements; begin += 256 * 1024) {
        std::vector<MessageChunk> small;
        AddChunk(&small, absl::StrCat("small.", g), step, grads_[g], begin,
                 std::min(kElements, begin + 256 * 1024));
        ASSERT_TRUE(Step(std::move(small)).ok());
      }
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      ASSERT_EQ(StateBits(absl::StrCat("spread.", g)), StateBits(absl::StrCat("small.", g)))
          << "group " << g << " after step " << step;
    }
  }
}

// The values are checked in parts of 256 Ki elements on two threads: the
// refusal is the first chunk with a bad value and that chunk's first bad
// element, whichever part finishes first, and nothing is applied.
TEST_F(MessageStepTest, ABadValueAnywhereRefusesTheWholeSpreadMessageNamingTheFirst) {
  Register("g.");
  std::vector<std::vector<float>> grads = grads_;
  grads[5][17] = std::nanf("");
  grads[2][900000] = INFINITY;
  grads[2][300001] = -INFINITY;
  MessageRefusal refusal = Step(WholeStep("g.", 1, grads));
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
  EXPECT_EQ(refusal.chunk, 2u);
  EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
  EXPECT_NE(
      refusal.status.message().find("gradient of group 'g.2' at element 300001 is not finite"),
      std::string::npos)
      << refusal.status;
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
  }
}

// A chunk refused for its fields (here: planned for another group size) is
// checked in order with the others' values: a bad value before it is the
// refusal, one after it is not.
TEST_F(MessageStepTest, AFieldRefusalAndABadValueAreReportedInMessageOrder) {
  Register("g.");
  for (uint64_t bad_chunk : {1, 6}) {
    SCOPED_TRACE(absl::StrCat("bad value in chunk ", bad_chunk));
    std::vector<std::vector<float>> grads = grads_;
    grads[bad_chunk][42] = std::nanf("");
    std::vector<MessageChunk> message = WholeStep("g.", 1, grads);
    message[3].chunk.group_elements = kElements + 1;
    MessageRefusal refusal = Step(std::move(message));
    EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
    EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
    if (bad_chunk == 1) {
      EXPECT_EQ(refusal.chunk, 1u);
      EXPECT_NE(refusal.status.message().find("gradient of group 'g.1' at element 42 "),
                std::string::npos)
          << refusal.status;
    } else {
      EXPECT_EQ(refusal.chunk, 3u);
      EXPECT_NE(refusal.status.message().find("group 'g.3' has "), std::string::npos)
          << refusal.status;
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }
}

// A chunk the transport could not read is refused in its turn, as one that
// Validate refuses: after the bad values of the chunks before it, and
// before those of the chunks after it; nothing is applied.
TEST_F(MessageStepTest, AChunkTheTransportCouldNotReadIsRefusedInItsTurn) {
  Register("g.");
  const absl::Status unread = absl::InvalidArgumentError("param_dtype 99 is not a dtype");
  for (uint64_t bad_chunk : {1, 6}) {
    SCOPED_TRACE(absl::StrCat("bad value in chunk ", bad_chunk));
    std::vector<std::vector<float>> grads = grads_;
    grads[bad_chunk][42] = std::nanf("");
    std::vector<MessageChunk> message = WholeStep("g.", 1, grads);
    message[3].read_status = unread;
    MessageRefusal refusal = Step(std::move(message));
    EXPECT_EQ(refusal.chunk, bad_chunk == 1 ? 1u : 3u);
    EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
    if (bad_chunk == 1) {
      EXPECT_NE(refusal.status.message().find("at element 42 "), std::string::npos)
          << refusal.status;
    } else {
      EXPECT_EQ(refusal.status, unread);
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }
}

// Applied at once, a chunk refused for its pages' state leaves the others
// applied, and the refusal says so.
TEST_F(MessageStepTest, APageRefusalInASpreadMessageLeavesTheOtherChunksApplied) {
  Register("g.");
  std::vector<MessageChunk> first;
  AddChunk(&first, "g.4", 1, grads_[4], 0, kElements);
  ASSERT_TRUE(Step(std::move(first)).ok());
  // Step 1 for all: g.4 replays it.
  MessageRefusal refusal = Step(WholeStep("g.", 1, grads_));
  ASSERT_TRUE(refusal.ok()) << refusal.status << " (g.4 replays step 1)";
  std::vector<MessageChunk> skip = WholeStep("g.", 2, grads_);
  skip[4].chunk.step = 4;  // g.4, at step 1: a step skipped.
  refusal = Step(std::move(skip));
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kFailedPrecondition) << refusal.status;
  EXPECT_EQ(refusal.chunk, 4u);
  EXPECT_EQ(refusal.applied, MessageApplied::kOthers);
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), g == 4 ? 1u : 2u) << "group " << g;
  }
  // The message's own chunk refused: the same.
  std::vector<MessageChunk> first_refused = WholeStep("g.", 3, grads_);
  first_refused[0].chunk.step = 5;  // g.0, at step 2.
  refusal = Step(std::move(first_refused));
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kFailedPrecondition) << refusal.status;
  EXPECT_EQ(refusal.chunk, 0u);
  EXPECT_EQ(refusal.applied, MessageApplied::kOthers);
  EXPECT_NE(refusal.status.message().find("group 'g.0'"), std::string::npos) << refusal.status;
  EXPECT_EQ(GroupOf("g.0").page_step(0), 2u);
  EXPECT_EQ(GroupOf("g.1").page_step(0), 3u);
}

// A small message is applied in order: a chunk refused for its pages' state
// leaves the chunks before it applied and the rest untried.
TEST_F(MessageStepTest, InOrderAPageRefusalLeavesTheChunksBeforeItApplied) {
  Register("g.");
  std::vector<MessageChunk> message;
  for (uint64_t g = 0; g < 3; ++g)
    AddChunk(&message, absl::StrCat("g.", g), 1, grads_[g], 0, kPage);
  message[1].chunk.step = 2;  // g.1, at step 0: a step skipped.
  MessageRefusal refusal = Step(std::move(message));
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kFailedPrecondition) << refusal.status;
  EXPECT_EQ(refusal.chunk, 1u);
  EXPECT_EQ(refusal.applied, MessageApplied::kChunksBefore);
  EXPECT_EQ(GroupOf("g.0").page_step(0), 1u);
  EXPECT_EQ(GroupOf("g.1").page_step(0), 0u);
  EXPECT_EQ(GroupOf("g.2").page_step(0), 0u);
}

// A message that covers a group's pages several times (steps 1 to 6 of it)
// is applied in order even when large: every step applies, as one at a time.
TEST_F(MessageStepTest, ALargeMessageNamingAGroupSeveralTimesIsAppliedInOrder) {
  Register("repeated.");
  Register("once.");
  constexpr uint64_t kSteps = 6;
  std::vector<MessageChunk> message;
  for (uint64_t step = 1; step <= kSteps; ++step) {
    AddChunk(&message, "repeated.0", step, grads_[step - 1], 0, kElements);
  }
  ASSERT_TRUE(Step(std::move(message)).ok());
  for (uint64_t step = 1; step <= kSteps; ++step) {
    std::vector<MessageChunk> one;
    AddChunk(&one, "once.0", step, grads_[step - 1], 0, kElements);
    ASSERT_TRUE(Step(std::move(one)).ok());
  }
  EXPECT_EQ(GroupOf("repeated.0").page_step(0), kSteps);
  EXPECT_EQ(StateBits("repeated.0"), StateBits("once.0"));
}

// Region chunks whose params go where the next chunk reads its gradient
// (chunk g writes slice g + 1): applied in order even when large, so each
// chunk reads the params the one before it wrote, as when every chunk comes
// in a message of its own.
TEST_F(MessageStepTest, ALargeMessageWhoseParamsFeedTheNextChunkIsAppliedInOrder) {
  Register("chained.");
  Register("apart.");
  std::vector<float> chained = NewRegion(kGroups + 1);
  std::vector<float> apart = NewRegion(kGroups + 1);
  std::vector<MessageChunk> message;
  for (uint64_t g = 0; g < kGroups; ++g) {
    AddRegionChunk(&message, absl::StrCat("chained.", g), chained, g, g + 1);
  }
  ASSERT_TRUE(Step(std::move(message)).ok());
  for (uint64_t g = 0; g < kGroups; ++g) {
    std::vector<MessageChunk> one;
    AddRegionChunk(&one, absl::StrCat("apart.", g), apart, g, g + 1);
    ASSERT_TRUE(Step(std::move(one)).ok());
  }
  for (uint64_t g = 0; g < kGroups; ++g) {
    ASSERT_EQ(StateBits(absl::StrCat("chained.", g)), StateBits(absl::StrCat("apart.", g)))
        << "group " << g;
  }
}

// Region chunks of their own slices (gradients in slices 0..7, params in
// 8..15) are applied at once: the same state and the same params in the
// region as chunk by chunk, and no params for the reply.
TEST_F(MessageStepTest, ALargeMessageOfDisjointRegionChunksStepsAsChunkByChunk) {
  Register("together.");
  Register("apart.");
  std::vector<float> together = NewRegion(2 * kGroups);
  std::vector<float> apart = NewRegion(2 * kGroups);
  for (uint64_t step = 1; step <= 2; ++step) {
    std::vector<MessageChunk> message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddRegionChunk(&message, absl::StrCat("together.", g), together, g, kGroups + g, step);
    }
    MessageStep at_once(&engine_, std::move(message));
    ASSERT_TRUE(at_once.Check().ok());
    for (uint64_t g = 0; g < kGroups; ++g) EXPECT_EQ(at_once.reply_params_bytes(g), 0u);
    ASSERT_TRUE(at_once
                    .Apply([](size_t, size_t) -> char* {
                      ADD_FAILURE() << "params of a region chunk asked for the reply";
                      return nullptr;
                    })
                    .ok());
    for (uint64_t g = 0; g < kGroups; ++g) {
      std::vector<MessageChunk> one;
      AddRegionChunk(&one, absl::StrCat("apart.", g), apart, g, kGroups + g, step);
      ASSERT_TRUE(Step(std::move(one)).ok());
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      ASSERT_EQ(StateBits(absl::StrCat("together.", g)), StateBits(absl::StrCat("apart.", g)))
          << "group " << g << " after step " << step;
      EXPECT_EQ(std::memcmp(SliceOf(together, kGroups + g), SliceOf(apart, kGroups + g), kSlice), 0)
          << "params of group " << g;
      EXPECT_EQ(std::memcmp(SliceOf(together, kGroups + g),
                            GroupOf(absl::StrCat("together.", g)).params(), kSlice),
                0);
    }
  }
}

// A chunk refused for its params_region's size after passing Validate with
// its value check deferred (both messages here are spread: one chunk of 4
// MiB and more, and eight): a bad value in that same chunk is still the
// refusal, as with ValueCheck::kNow, where Validate checks values first.
TEST_F(MessageStepTest, ABadValueComesBeforeTheSameChunksParamsRegionSize) {
  Register("g.");
  std::vector<float> region = NewRegion(2 * kGroups);
  reinterpret_cast<float*>(SliceOf(region, 2))[7] = std::nanf("");
  for (uint64_t chunks : {uint64_t{1}, kGroups}) {
    SCOPED_TRACE(absl::StrCat(chunks, " chunks"));
    std::vector<MessageChunk> message;
    for (uint64_t g = 2; g < 2 + chunks; ++g) {
      AddRegionChunk(&message, absl::StrCat("g.", g % kGroups), region, g % kGroups,
                     kGroups + g % kGroups);
    }
    message[0].params_region->bytes = kSlice - 4;  // Group g.2.
    MessageRefusal refusal = Step(message);
    EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
    EXPECT_EQ(refusal.chunk, 0u);
    EXPECT_NE(refusal.status.message().find("gradient of group 'g.2' at element 7 is not finite"),
              std::string::npos)
        << refusal.status;
    // Without the bad value, the size is the refusal.
    reinterpret_cast<float*>(SliceOf(region, 2))[7] = 0.0f;
    refusal = Step(std::move(message));
    reinterpret_cast<float*>(SliceOf(region, 2))[7] = std::nanf("");
    EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
    EXPECT_NE(refusal.status.message().find(absl::StrCat("params_region holds ", kSlice - 4,
                                                         " bytes; the chunk's ", kElements,
                                                         " params in float32 take ", kSlice)),
              std::string::npos)
        << refusal.status;
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }
}

}  // namespace
}  // namespace optstate

namespace optstate {
namespace {

// Two steps of small chunks, at once and in order (one group in four
// chunks), sender-checked or not: the same bits.
TEST_F(MessageStepTest, ASenderCheckedMessageStepsTheSameBitsAsAnUncheckedOne) {
  Register("checked.");
  Register("plain.");
  for (uint64_t step = 1; step <= 2; ++step) {
    ASSERT_TRUE(Step(SmallChunkStep("checked.", step, grads_), SenderChecked::kValues).ok());
    ASSERT_TRUE(Step(SmallChunkStep("plain.", step, grads_)).ok());
    std::vector<MessageChunk> checked_in_order, plain_in_order;
    for (uint64_t k = 0; k < 4; ++k) {
      AddChunk(&checked_in_order, "checked.7", step, grads_[7], kSmallChunk * (k + 1),
               std::min(kElements, kSmallChunk * (k + 2)));
      AddChunk(&plain_in_order, "plain.7", step, grads_[7], kSmallChunk * (k + 1),
               std::min(kElements, kSmallChunk * (k + 2)));
    }
    ASSERT_TRUE(Step(std::move(checked_in_order), SenderChecked::kValues).ok());
    ASSERT_TRUE(Step(std::move(plain_in_order)).ok());
    for (uint64_t g = 0; g < kGroups; ++g) {
      ASSERT_EQ(StateBits(absl::StrCat("checked.", g)), StateBits(absl::StrCat("plain.", g)))
          << "group " << g << " after step " << step;
    }
  }
}

// Applied at once: the chunk with the bad value is refused and left as it
// was, bit for bit; the others are applied, and the refusal says so.
TEST_F(MessageStepTest, ABadValueInASenderCheckedSmallChunkRefusesItAndLeavesTheOthersApplied) {
  Register("g.");
  std::vector<std::vector<float>> grads = grads_;
  grads[5][17] = std::nanf("");
  const std::vector<uint32_t> before = StateBits("g.5");
  MessageRefusal refusal = Step(SmallChunkStep("g.", 1, grads), SenderChecked::kValues);
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
  EXPECT_EQ(refusal.chunk, 5u);
  EXPECT_EQ(refusal.applied, MessageApplied::kOthers);
  EXPECT_NE(refusal.status.message().find("gradient of group 'g.5' at element 17 is not finite"),
            std::string::npos)
      << refusal.status;
  EXPECT_EQ(StateBits("g.5"), before) << "the refused chunk changed its group";
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), g == 5 ? 0u : 1u) << "group " << g;
  }
  // Unchecked, the same message is refused whole.
  Register("plain.");
  refusal = Step(SmallChunkStep("plain.", 1, grads));
  EXPECT_EQ(refusal.chunk, 5u);
  EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("plain.", g)).page_step(0), 0u) << "group " << g;
  }
}

// Applied at once, each thread checks the chunk it takes next while it
// updates the one it holds (CheckAhead: read among the update's own loads
// where the params go to a region and the chunk is no larger than the
// core's L2, here 256 KiB chunks, two a group; after the update where the
// params go into the reply, here 1 MiB chunks): a bad value is still found
// before its chunk's first write wherever the chunk falls (taken first, or
// checked ahead), every bad chunk is refused unapplied (its state and its
// params_region slice as they were), the first in message order is named,
// and the others are applied.
TEST_F(MessageStepTest, EveryBadSenderCheckedChunkIsRefusedUnappliedWhereverItFalls) {
  constexpr uint64_t kRegionChunk = 65536;  // 256 KiB of float32 gradient.
  struct Bad {
    uint64_t chunk, element;  // The chunk's index in the message, its element.
  };
  for (bool regions : {false, true}) {
    // Region chunks: chunk c is group c / 2's elements from (c % 2) *
    // kRegionChunk; reply chunks: chunk c is group c's first kSmallChunk.
    const uint64_t chunk_elements = regions ? kRegionChunk : kSmallChunk;
    const uint64_t chunks = regions ? 2 * kGroups : kGroups;
    const std::vector<std::vector<Bad>> cases = {
        {{0, 0}, {chunks / 2 + 1, chunk_elements - 1}, {chunks - 1, 12345}},
        {{1, chunk_elements - 1}, {2, 0}},
    };
    auto group_of = [&](uint64_t chunk) { return regions ? chunk / 2 : chunk; };
    auto offset_of = [&](uint64_t chunk) { return regions ? chunk % 2 * kRegionChunk : 0; };
    for (size_t c = 0; c < cases.size(); ++c) {
      const std::string prefix = absl::StrCat(regions ? "region" : "reply", c, ".");
      SCOPED_TRACE(prefix);
      Register(prefix);
      std::vector<std::vector<float>> grads = grads_;
      std::vector<bool> bad_chunk(chunks, false);
      for (const Bad& bad : cases[c]) {
        grads[group_of(bad.chunk)][offset_of(bad.chunk) + bad.element] =
            bad.chunk % 2 ? std::nanf("") : -INFINITY;
        bad_chunk[bad.chunk] = true;
      }
      // The bits of each chunk's params, m and v before the step.
      auto chunk_state = [&](uint64_t chunk) {
        Group& group = GroupOf(absl::StrCat(prefix, group_of(chunk)));
        const uint64_t at = offset_of(chunk);
        std::vector<float> state;
        for (const float* array : {group.params(), group.exp_avg(), group.exp_avg_sq()}) {
          state.insert(state.end(), array + at, array + at + chunk_elements);
        }
        std::vector<uint32_t> bits(state.size());
        std::memcpy(bits.data(), state.data(), state.size() * sizeof(float));
        return bits;
      };
      std::vector<std::vector<uint32_t>> before(chunks);
      for (uint64_t k = 0; k < chunks; ++k) before[k] = chunk_state(k);
      // Regions: slot k the gradient of chunk k, slot chunks + k its params,
      // first filled with a pattern.
      const uint64_t slice = chunk_elements * sizeof(float);
      std::vector<float> region(2 * chunks * chunk_elements, -7.0f);
      std::vector<MessageChunk> message;
      if (regions) {
        for (uint64_t k = 0; k < chunks; ++k) {
          std::memcpy(region.data() + k * chunk_elements, grads[group_of(k)].data() + offset_of(k),
                      slice);
          MessageChunk& chunk = message.emplace_back();
          chunk.chunk.group = GroupKey{"", absl::StrCat(prefix, group_of(k))};
          chunk.chunk.step = 1;
          chunk.chunk.offset = offset_of(k);
          chunk.chunk.gradient = SegmentedBytes(absl::string_view(
              reinterpret_cast<const char*>(region.data() + k * chunk_elements), slice));
          chunk.params_out = reinterpret_cast<char*>(region.data() + (chunks + k) * chunk_elements);
          chunk.gradient_region = RegionSpan{kRegion, k * slice, slice};
          chunk.params_region = RegionSpan{kRegion, (chunks + k) * slice, slice};
        }
      } else {
        message = SmallChunkStep(prefix, 1, grads);
      }
      const Bad& first = cases[c].front();
      ExpectBadValue(Step(std::move(message), SenderChecked::kValues), first.chunk,
                     offset_of(first.chunk) + first.element, MessageApplied::kOthers);
      for (uint64_t k = 0; k < chunks; ++k) {
        const Group& group = GroupOf(absl::StrCat(prefix, group_of(k)));
        EXPECT_EQ(group.page_step(offset_of(k) / kPage), bad_chunk[k] ? 0u : 1u) << "chunk " << k;
        if (bad_chunk[k]) {
          EXPECT_EQ(chunk_state(k), before[k]) << "bad chunk " << k;
        }
        if (regions) {
          const float* params = region.data() + (chunks + k) * chunk_elements;
          EXPECT_EQ(bad_chunk[k], std::all_of(params, params + chunk_elements,
                                              [](float x) { return x == -7.0f; }))
              << "params slice of chunk " << k;
        }
      }
    }
  }
}

// Applied in order (a small message): the chunks before the bad one are
// applied, it and those after it are not.
TEST_F(MessageStepTest, InOrderABadValueInASenderCheckedChunkLeavesTheChunksBeforeItApplied) {
  Register("g.");
  std::vector<std::vector<float>> grads = grads_;
  const uint64_t bad = 2 * kSmallChunk + 99;  // In the third chunk.
  grads[3][bad] = INFINITY;
  constexpr uint64_t kChunks = 3;  // 3 MiB: not spread.
  std::vector<MessageChunk> message;
  for (uint64_t k = 0; k < kChunks; ++k) {
    AddChunk(&message, "g.3", 1, grads[3], k * kSmallChunk, (k + 1) * kSmallChunk);
  }
  ExpectBadValue(Step(std::move(message), SenderChecked::kValues), 2, bad,
                 MessageApplied::kChunksBefore);
  Group& group = GroupOf("g.3");
  for (uint64_t page = 0; page < kChunks * kSmallChunk / kPage; ++page) {
    ASSERT_EQ(group.page_step(page), page < 2 * kSmallChunk / kPage ? 1u : 0u) << "page " << page;
  }
}

// One group cut into chunks of disjoint pages (as a sender that vouched for
// its gradients cuts a large group) in a spread message: applied at once,
// with the bits of the whole group stepped in one chunk; a bad value in one
// of them refuses only that chunk, unapplied, and the others are applied.
TEST_F(MessageStepTest, ChunksOfOneGroupsDisjointPagesAreAppliedAtOnce) {
  Register("cut.");
  Register("whole.");
  constexpr uint64_t kChunks = 4;  // 4 MiB: spread.
  auto cut_step = [&](const std::string& name, uint64_t step, const std::vector<float>& grad) {
    std::vector<MessageChunk> message;
    for (uint64_t k = 0; k < kChunks; ++k) {
      AddChunk(&message, name, step, grad, k * kSmallChunk,
               k + 1 == kChunks ? kElements : (k + 1) * kSmallChunk);
    }
    return message;
  };
  for (uint64_t step = 1; step <= 3; ++step) {
    ASSERT_TRUE(Step(cut_step("cut.0", step, grads_[step]), SenderChecked::kValues).ok());
    std::vector<MessageChunk> whole;
    AddChunk(&whole, "whole.0", step, grads_[step], 0, kElements);
    ASSERT_TRUE(Step(std::move(whole)).ok());
  }
  EXPECT_EQ(StateBits("cut.0"), StateBits("whole.0"));

  std::vector<float> grad = grads_[4];
  const uint64_t bad = kSmallChunk + 5;  // In the second chunk.
  grad[bad] = NAN;
  const std::vector<uint32_t> before = StateBits("cut.1");
  ExpectBadValue(Step(cut_step("cut.1", 1, grad), SenderChecked::kValues), 1, bad,
                 MessageApplied::kOthers);
  Group& group = GroupOf("cut.1");
  const std::vector<uint32_t> after = StateBits("cut.1");
  for (uint64_t page = 0; page < (kElements + kPage - 1) / kPage; ++page) {
    const bool in_bad_chunk = page >= kSmallChunk / kPage && page < 2 * kSmallChunk / kPage;
    ASSERT_EQ(group.page_step(page), in_bad_chunk ? 0u : 1u) << "page " << page;
  }
  for (uint64_t i = kSmallChunk; i < 2 * kSmallChunk; ++i) {  // The refused chunk's state.
    for (uint64_t array = 0; array < 3; ++array) {
      ASSERT_EQ(after[array * kElements + i], before[array * kElements + i]) << "element " << i;
    }
  }
}

// A chunk larger than kCheckedAsAppliedBytes is checked before anything is
// applied even when the sender checked: a bad value in it refuses the whole
// message, and a field refusal after the small chunks still comes first.
TEST_F(MessageStepTest, SenderCheckedLargeChunksAndFieldsAreStillCheckedBeforeAnyIsApplied) {
  Register("g.");
  std::vector<std::vector<float>> grads = grads_;
  grads[6][kElements - 1] = std::nanf("");
  MessageRefusal refusal = Step(WholeStep("g.", 1, grads), SenderChecked::kValues);
  EXPECT_EQ(refusal.status.code(), absl::StatusCode::kInvalidArgument) << refusal.status;
  EXPECT_EQ(refusal.chunk, 6u);
  EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
  std::vector<MessageChunk> message = SmallChunkStep("g.", 1, grads_);
  message[7].chunk.group_elements = kElements + 1;
  refusal = Step(std::move(message), SenderChecked::kValues);
  EXPECT_EQ(refusal.chunk, 7u);
  EXPECT_EQ(refusal.applied, MessageApplied::kNothing);
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
  }
}

}  // namespace
}  // namespace optstate
