// ApplyStepMessage on a large message (4 MiB of gradients or more), which it
// spreads over the pool: the values of every chunk checked in parts on
// several threads, the chunks of distinct groups applied at once. The
// answers must be those of the message applied in order on one thread: the
// same state bit for bit, the same refusal (the first bad chunk and its
// first bad element; a value refusal before an earlier-checked field
// refusal only when it comes first), nothing applied on a refusal before
// the update, and a message that names a group more than once applied in
// order.
#include "server/rpc/step_message.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "grpcpp/support/slice.h"
#include "server/backends/cpu/cpu_backend.h"
#include "server/base/thread_pool.h"
#include "server/engine/state_store.h"
#include "server/regions/region_registry.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

constexpr uint64_t kPage = 4096;
constexpr uint64_t kGroups = 8;
constexpr uint64_t kElements = (1 << 20) + 123;  // 4 MiB and a short last page per group.

class StepMessageTest : public ::testing::Test {
 protected:
  StepMessageTest()
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

  // Appends a chunk of `name` at `step` over grad[begin, end) to `message`
  // (its own, or packed after it).
  static void AddChunk(StepMessage* message, const std::string& name, uint64_t step,
                       const std::vector<float>& grad, uint64_t begin, uint64_t end) {
    v1::StepRequest* fields =
        message->gradients.empty() ? &message->request : message->request.add_more();
    fields->set_group(name);
    fields->set_step(step);
    fields->set_offset(begin);
    fields->set_gradient_dtype(v1::DTYPE_FLOAT32);
    fields->set_param_dtype(v1::DTYPE_FLOAT32);
    message->gradients.emplace_back(absl::string_view(
        reinterpret_cast<const char*>(grad.data() + begin), (end - begin) * sizeof(float)));
  }

  // One message: every group's whole gradient at `step`.
  StepMessage WholeStep(const std::string& prefix, uint64_t step,
                        const std::vector<std::vector<float>>& grads) {
    StepMessage message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddChunk(&message, absl::StrCat(prefix, g), step, grads[g], 0, kElements);
    }
    return message;
  }

  absl::Status Apply(const StepMessage& message, std::vector<grpc::Slice>* reply) {
    return ApplyStepMessage(&engine_, "", uint64_t{1} << 30, message, reply);
  }

  // Region tests: a sealed memfd region of `slices` slices of one group's
  // float32 elements, registered in session_, slice 0 holding grads_[0] and
  // every other slice grads_[g] for g = slice % kGroups.
  static constexpr uint64_t kSlice = kElements * sizeof(float);

  std::shared_ptr<const MappedRegion> NewRegion(uint64_t slices) {
    const int fd = memfd_create("step-message-test", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    EXPECT_EQ(ftruncate(fd, static_cast<off_t>(slices * kSlice)), 0);
    EXPECT_EQ(fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK), 0);
    absl::StatusOr<std::shared_ptr<const MappedRegion>> mapped = registry_.Register(session_, fd);
    EXPECT_TRUE(mapped.ok()) << mapped.status();
    for (uint64_t i = 0; i < slices; ++i) {
      std::memcpy(SliceOf(**mapped, i), grads_[i % kGroups].data(), kSlice);
    }
    return *mapped;
  }

  static char* SliceOf(const MappedRegion& region, uint64_t slice) {
    return *region.Slice(slice * kSlice, kSlice, "test");
  }

  // Appends a chunk of `name` reading its gradient from slice `gradient` of
  // region `id` and writing its params into slice `params`.
  void AddRegionChunk(StepMessage* message, const std::string& name, uint64_t id, uint64_t gradient,
                      uint64_t params, uint64_t step = 1) {
    v1::StepRequest* fields =
        message->gradients.empty() ? &message->request : message->request.add_more();
    fields->set_group(name);
    fields->set_step(step);
    fields->set_gradient_dtype(v1::DTYPE_FLOAT32);
    fields->set_param_dtype(v1::DTYPE_FLOAT32);
    fields->set_region_session(session_);
    fields->mutable_gradient_region()->set_region(id);
    fields->mutable_gradient_region()->set_offset(gradient * kSlice);
    fields->mutable_gradient_region()->set_bytes(kSlice);
    fields->mutable_params_region()->set_region(id);
    fields->mutable_params_region()->set_offset(params * kSlice);
    fields->mutable_params_region()->set_bytes(kSlice);
    message->gradients.emplace_back();
  }

  absl::Status ApplyWithRegions(const StepMessage& message, std::vector<grpc::Slice>* reply) {
    return ApplyStepMessage(&engine_, "", uint64_t{1} << 30, message, reply, &registry_);
  }

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  StepEngine engine_;
  std::vector<std::vector<float>> grads_;
  RegionRegistry registry_{RegionLimits{}};
  const std::string session_ = registry_.OpenSession("");
};

// Three steps of one 32 MiB message against the same steps in messages of
// 256 Ki elements (1 MiB: not spread), each applied on its own.
TEST_F(StepMessageTest, ASpreadMessageStepsBitIdenticallyToSmallMessagesInOrder) {
  Register("spread.");
  Register("small.");
  for (uint64_t step = 1; step <= 3; ++step) {
    std::vector<grpc::Slice> reply;
    ASSERT_TRUE(Apply(WholeStep("spread.", step, grads_), &reply).ok());
    std::string bytes;
    for (const grpc::Slice& slice : reply) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    v1::StepResponse response;
    ASSERT_TRUE(response.ParseFromString(bytes));
    ASSERT_EQ(response.more_size(), static_cast<int>(kGroups - 1));
    for (uint64_t g = 0; g < kGroups; ++g) {
      const v1::StepResponse& r = g == 0 ? response : response.more(static_cast<int>(g - 1));
      EXPECT_EQ(r.group(), absl::StrCat("spread.", g));
      EXPECT_EQ(r.pages_applied(), (kElements + kPage - 1) / kPage);
      ASSERT_EQ(r.params().size(), kElements * 4);
      EXPECT_EQ(std::memcmp(r.params().data(), GroupOf(r.group()).params(), kElements * 4), 0)
          << "the reply carries the params as they are after the step";
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      for (uint64_t begin = 0; begin < kElements; begin += 256 * 1024) {
        StepMessage small;
        AddChunk(&small, absl::StrCat("small.", g), step, grads_[g], begin,
                 std::min(kElements, begin + 256 * 1024));
        std::vector<grpc::Slice> small_reply;
        ASSERT_TRUE(Apply(small, &small_reply).ok());
      }
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      ASSERT_EQ(StateBits(absl::StrCat("spread.", g)), StateBits(absl::StrCat("small.", g)))
          << "group " << g << " after step " << step;
    }
  }
}

// The values are checked in parts of 256 Ki elements on two threads: the
// error names the first chunk with a bad value and that chunk's first bad
// element, whichever part finishes first, and nothing is applied.
TEST_F(StepMessageTest, ABadValueAnywhereRefusesTheWholeSpreadMessageNamingTheFirst) {
  Register("g.");
  std::vector<std::vector<float>> grads = grads_;
  grads[5][17] = std::nanf("");
  grads[2][900000] = INFINITY;
  grads[2][300001] = -INFINITY;
  std::vector<grpc::Slice> reply;
  absl::Status status = Apply(WholeStep("g.", 1, grads), &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("StepRequest.more[1] (group 'g.2')"), std::string::npos)
      << status;
  EXPECT_NE(status.message().find("at element 300001 is not finite"), std::string::npos) << status;
  EXPECT_NE(status.message().find("nothing in its message was applied"), std::string::npos)
      << status;
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
  }
}

// A chunk refused for its fields (here: planned for another group size) is
// checked in order with the others' values: a bad value before it is the
// refusal, one after it is not.
TEST_F(StepMessageTest, AFieldRefusalAndABadValueAreReportedInMessageOrder) {
  Register("g.");
  for (uint64_t bad_chunk : {1, 6}) {
    SCOPED_TRACE(absl::StrCat("bad value in chunk ", bad_chunk));
    std::vector<std::vector<float>> grads = grads_;
    grads[bad_chunk][42] = std::nanf("");
    StepMessage message = WholeStep("g.", 1, grads);
    message.request.mutable_more(2)->set_group_elements(kElements + 1);  // Chunk 3.
    std::vector<grpc::Slice> reply;
    absl::Status status = Apply(message, &reply);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    if (bad_chunk == 1) {
      EXPECT_NE(status.message().find("(group 'g.1'): gradient of group 'g.1' at element 42 "),
                std::string::npos)
          << status;
    } else {
      EXPECT_NE(status.message().find("(group 'g.3'): group 'g.3' has "), std::string::npos)
          << status;
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }
}

// Applied at once, a chunk refused for its pages' state leaves the others
// applied, and the error says so.
TEST_F(StepMessageTest, APageRefusalInASpreadMessageLeavesTheOtherChunksApplied) {
  Register("g.");
  std::vector<grpc::Slice> reply;
  StepMessage first;
  AddChunk(&first, "g.4", 1, grads_[4], 0, kElements);
  ASSERT_TRUE(Apply(first, &reply).ok());
  reply.clear();
  // Step 1 for all: g.4 replays it.
  absl::Status status = Apply(WholeStep("g.", 1, grads_), &reply);
  ASSERT_TRUE(status.ok()) << status << " (g.4 replays step 1)";
  reply.clear();
  StepMessage skip = WholeStep("g.", 2, grads_);
  skip.request.mutable_more(3)->set_step(4);  // g.4, at step 1: a step skipped.
  status = Apply(skip, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("(group 'g.4')"), std::string::npos) << status;
  EXPECT_NE(status.message().find("the other chunks of its message were applied"),
            std::string::npos)
      << status;
  for (uint64_t g = 0; g < kGroups; ++g) {
    EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), g == 4 ? 1u : 2u) << "group " << g;
  }
  // The message's own chunk refused: the error says the same.
  reply.clear();
  StepMessage first_refused = WholeStep("g.", 3, grads_);
  first_refused.request.set_step(5);  // g.0, at step 2.
  status = Apply(first_refused, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_NE(status.message().find("group 'g.0'"), std::string::npos) << status;
  EXPECT_NE(status.message().find("the other chunks of its message were applied"),
            std::string::npos)
      << status;
  EXPECT_EQ(GroupOf("g.0").page_step(0), 2u);
  EXPECT_EQ(GroupOf("g.1").page_step(0), 3u);
}

// A message that names one group several times (steps 1 to 6 of it) is
// applied in order even when large: every step applies, as one at a time.
TEST_F(StepMessageTest, ALargeMessageNamingAGroupSeveralTimesIsAppliedInOrder) {
  Register("repeated.");
  Register("once.");
  constexpr uint64_t kSteps = 6;
  StepMessage message;
  for (uint64_t step = 1; step <= kSteps; ++step) {
    AddChunk(&message, "repeated.0", step, grads_[step - 1], 0, kElements);
  }
  std::vector<grpc::Slice> reply;
  ASSERT_TRUE(Apply(message, &reply).ok());
  for (uint64_t step = 1; step <= kSteps; ++step) {
    StepMessage one;
    AddChunk(&one, "once.0", step, grads_[step - 1], 0, kElements);
    ASSERT_TRUE(Apply(one, &reply).ok());
  }
  EXPECT_EQ(GroupOf("repeated.0").page_step(0), kSteps);
  EXPECT_EQ(StateBits("repeated.0"), StateBits("once.0"));
}

// Region chunks whose params go where the next chunk reads its gradient
// (chunk g writes slice g + 1): applied in order even when large, so each
// chunk reads the params the one before it wrote, as when every chunk comes
// in a message of its own.
TEST_F(StepMessageTest, ALargeMessageWhoseParamsFeedTheNextChunkIsAppliedInOrder) {
  Register("chained.");
  Register("apart.");
  const std::shared_ptr<const MappedRegion> chained = NewRegion(kGroups + 1);
  const std::shared_ptr<const MappedRegion> apart = NewRegion(kGroups + 1);
  StepMessage message;
  for (uint64_t g = 0; g < kGroups; ++g) {
    AddRegionChunk(&message, absl::StrCat("chained.", g), chained->id(), g, g + 1);
  }
  std::vector<grpc::Slice> reply;
  ASSERT_TRUE(ApplyWithRegions(message, &reply).ok());
  for (uint64_t g = 0; g < kGroups; ++g) {
    StepMessage one;
    AddRegionChunk(&one, absl::StrCat("apart.", g), apart->id(), g, g + 1);
    ASSERT_TRUE(ApplyWithRegions(one, &reply).ok());
  }
  for (uint64_t g = 0; g < kGroups; ++g) {
    ASSERT_EQ(StateBits(absl::StrCat("chained.", g)), StateBits(absl::StrCat("apart.", g)))
        << "group " << g;
  }
}

// Region chunks of their own slices (gradients in slices 0..7, params in
// 8..15) are applied at once: the same state and the same params in the
// region as chunk by chunk.
TEST_F(StepMessageTest, ALargeMessageOfDisjointRegionChunksStepsAsChunkByChunk) {
  Register("together.");
  Register("apart.");
  const std::shared_ptr<const MappedRegion> together = NewRegion(2 * kGroups);
  const std::shared_ptr<const MappedRegion> apart = NewRegion(2 * kGroups);
  for (uint64_t step = 1; step <= 2; ++step) {
    StepMessage message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddRegionChunk(&message, absl::StrCat("together.", g), together->id(), g, kGroups + g, step);
    }
    std::vector<grpc::Slice> reply;
    ASSERT_TRUE(ApplyWithRegions(message, &reply).ok());
    for (uint64_t g = 0; g < kGroups; ++g) {
      StepMessage one;
      AddRegionChunk(&one, absl::StrCat("apart.", g), apart->id(), g, kGroups + g, step);
      ASSERT_TRUE(ApplyWithRegions(one, &reply).ok());
    }
    for (uint64_t g = 0; g < kGroups; ++g) {
      ASSERT_EQ(StateBits(absl::StrCat("together.", g)), StateBits(absl::StrCat("apart.", g)))
          << "group " << g << " after step " << step;
      EXPECT_EQ(std::memcmp(SliceOf(*together, kGroups + g), SliceOf(*apart, kGroups + g), kSlice),
                0)
          << "params of group " << g;
      EXPECT_EQ(std::memcmp(SliceOf(*together, kGroups + g),
                            GroupOf(absl::StrCat("together.", g)).params(), kSlice),
                0);
    }
  }
}

// A chunk refused for its params_region's size after passing Validate with
// its value check deferred (both messages here are spread: one chunk of 4
// MiB and more, and eight): a bad value in that same chunk is still the
// refusal, as with ValueCheck::kNow, where Validate checks values first.
TEST_F(StepMessageTest, ABadValueComesBeforeTheSameChunksParamsRegionSize) {
  Register("g.");
  const std::shared_ptr<const MappedRegion> region = NewRegion(2 * kGroups);
  float* bad = reinterpret_cast<float*>(SliceOf(*region, 2));
  bad[7] = std::nanf("");
  for (uint64_t chunks : {uint64_t{1}, kGroups}) {
    SCOPED_TRACE(absl::StrCat(chunks, " chunks"));
    StepMessage message;
    for (uint64_t g = 2; g < 2 + chunks; ++g) {
      AddRegionChunk(&message, absl::StrCat("g.", g % kGroups), region->id(), g % kGroups,
                     kGroups + g % kGroups);
    }
    message.request.mutable_params_region()->set_bytes(kSlice - 4);  // Chunk 0: group g.2.
    std::vector<grpc::Slice> reply;
    absl::Status status = ApplyWithRegions(message, &reply);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    EXPECT_NE(status.message().find("gradient of group 'g.2' at element 7 is not finite"),
              std::string::npos)
        << status;
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }
}

}  // namespace
}  // namespace optstate
