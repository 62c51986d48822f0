// ApplyStepMessage: a Step message read into the engine's chunks, its
// regions looked up, its reply bounded and written. What is checked and
// applied at once is MessageStep's (tests/unit/engine/message_step_test.cc);
// here: the reply packs every chunk's response in `more`, a refusal names
// the packed chunk in the request's terms and says what of the message was
// applied, a chunk whose fields do not convert is refused in its turn, a
// reply too large is refused before anything is applied, and region chunks
// read their gradient from, and write their params into, the registry's
// mappings.
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
    Register();
  }

  void Register() {
    for (uint64_t g = 0; g < kGroups; ++g) {
      GroupConfig config;
      config.num_elements = kElements;
      EXPECT_TRUE(store_.Register(GroupKey{"", absl::StrCat("g.", g)}, config).ok());
    }
  }

  Group& GroupOf(const std::string& name) { return **store_.Find(GroupKey{"", name}); }

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

  // One message: every group's whole gradient at `step` (32 MiB: spread).
  StepMessage WholeStep(uint64_t step, const std::vector<std::vector<float>>& grads) {
    StepMessage message;
    for (uint64_t g = 0; g < kGroups; ++g) {
      AddChunk(&message, absl::StrCat("g.", g), step, grads[g], 0, kElements);
    }
    return message;
  }

  absl::Status Apply(const StepMessage& message, std::vector<grpc::Slice>* reply,
                     size_t max_reply_bytes = size_t{1} << 30) {
    return ApplyStepMessage(&engine_, "", max_reply_bytes, message, reply, &registry_);
  }

  // The reply's slices parsed as one StepResponse.
  static v1::StepResponse Parse(const std::vector<grpc::Slice>& reply) {
    std::string bytes;
    for (const grpc::Slice& slice : reply) {
      bytes.append(reinterpret_cast<const char*>(slice.begin()), slice.size());
    }
    v1::StepResponse response;
    EXPECT_TRUE(response.ParseFromString(bytes));
    return response;
  }

  void ExpectNothingApplied() {
    for (uint64_t g = 0; g < kGroups; ++g) {
      EXPECT_EQ(GroupOf(absl::StrCat("g.", g)).page_step(0), 0u) << "group " << g;
    }
  }

  // Region tests: a sealed memfd region of `slices` slices of one group's
  // float32 elements, registered in session_, slice i holding grads_[i %
  // kGroups].
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
                      uint64_t params) {
    v1::StepRequest* fields =
        message->gradients.empty() ? &message->request : message->request.add_more();
    fields->set_group(name);
    fields->set_step(1);
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

  ThreadPool pool_;
  CpuBackend backend_;
  StateStore store_;
  StepEngine engine_;
  std::vector<std::vector<float>> grads_;
  RegionRegistry registry_{RegionLimits{}};
  const std::string session_ = registry_.OpenSession("");
};

// One reply for the message: the first chunk's response, the others' in
// `more`, in message order, each with the params as they are after the step.
TEST_F(StepMessageTest, TheReplyPacksEveryChunksResponseInMore) {
  std::vector<grpc::Slice> reply;
  ASSERT_TRUE(Apply(WholeStep(1, grads_), &reply).ok());
  const v1::StepResponse response = Parse(reply);
  ASSERT_EQ(response.more_size(), static_cast<int>(kGroups - 1));
  for (uint64_t g = 0; g < kGroups; ++g) {
    const v1::StepResponse& r = g == 0 ? response : response.more(static_cast<int>(g - 1));
    EXPECT_EQ(r.group(), absl::StrCat("g.", g));
    EXPECT_EQ(r.step(), 1u);
    EXPECT_EQ(r.offset(), 0u);
    EXPECT_EQ(r.num_elements(), kElements);
    EXPECT_EQ(r.param_dtype(), v1::DTYPE_FLOAT32);
    EXPECT_EQ(r.pages_applied(), (kElements + kPage - 1) / kPage);
    EXPECT_EQ(r.pages_replayed(), 0u);
    EXPECT_FALSE(r.params_in_region());
    ASSERT_EQ(r.params().size(), kElements * 4);
    EXPECT_EQ(std::memcmp(r.params().data(), GroupOf(r.group()).params(), kElements * 4), 0);
  }
}

// A packed chunk refused before anything is applied is named by its place
// in `more` and its group, and the refusal says nothing was applied.
// StepRequest's per-step hyperparameters (fields 15-19, and lr) reach the
// engine for their own chunk only: a packed chunk that sets them steps as the
// kernel does with them, the message's own chunk with its group's.
TEST_F(StepMessageTest, EachChunksHyperparametersStepThatChunkOnly) {
  StepMessage message;
  AddChunk(&message, "g.0", 1, grads_[0], 0, kElements);
  AddChunk(&message, "g.1", 1, grads_[1], 0, kElements);
  v1::StepRequest* packed = message.request.mutable_more(0);
  packed->set_lr(2e-3);
  packed->set_beta1(0.8);
  packed->set_beta2(0.95);
  packed->set_eps(1e-6);
  packed->set_weight_decay(0.1);
  packed->set_maximize(true);
  std::vector<grpc::Slice> reply;
  ASSERT_TRUE(Apply(message, &reply).ok());
  AdamWStepInputs overridden;
  overridden.hyperparameters = {2e-3, 0.8, 0.95, 1e-6, 0.1, true, false};
  for (auto [g, inputs] : {std::pair<uint64_t, AdamWStepInputs>{0, AdamWStepInputs{}},
                           std::pair<uint64_t, AdamWStepInputs>{1, overridden}}) {
    std::vector<float> p(kElements, 0.0f), m(kElements, 0.0f), v(kElements, 0.0f);
    AdamWUpdateScalar(ComputeAdamWConstants(inputs), p.data(), m.data(), v.data(),
                      grads_[g].data(), WireType::kFloat32, kElements);
    const Group& group = GroupOf(absl::StrCat("g.", g));
    EXPECT_EQ(std::memcmp(group.params(), p.data(), kElements * 4), 0) << g;
    EXPECT_EQ(std::memcmp(group.exp_avg(), m.data(), kElements * 4), 0) << g;
    EXPECT_EQ(std::memcmp(group.exp_avg_sq(), v.data(), kElements * 4), 0) << g;
  }
}

TEST_F(StepMessageTest, APackedChunkRefusedBeforeTheUpdateIsNamed) {
  std::vector<std::vector<float>> grads = grads_;
  grads[2][300001] = -INFINITY;
  std::vector<grpc::Slice> reply;
  absl::Status status = Apply(WholeStep(1, grads), &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().find("StepRequest.more[1] (group 'g.2'): gradient of group 'g.2' at "
                                  "element 300001 is not finite"),
            0u)
      << status;
  EXPECT_NE(status.message().find("(nothing in its message was applied)"), std::string::npos)
      << status;
  ExpectNothingApplied();
}

// The message's own chunk refused before anything is applied: the refusal
// is the engine's, as for a message of one chunk.
TEST_F(StepMessageTest, TheMessagesOwnChunkRefusedBeforeTheUpdateIsTheEnginesRefusal) {
  StepMessage message = WholeStep(1, grads_);
  message.request.set_group_elements(kElements + 1);
  std::vector<grpc::Slice> reply;
  absl::Status status = Apply(message, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_EQ(status.message().find("group 'g.0' has "), 0u) << status;
  EXPECT_EQ(status.message().find("applied"), std::string::npos) << status;
  ExpectNothingApplied();
}

// A packed chunk whose fields do not convert (here: an unknown param_dtype)
// is refused in its turn: after a bad value in a chunk before it, before
// one in a chunk after it.
TEST_F(StepMessageTest, AChunkWhoseFieldsDoNotConvertIsRefusedInItsTurn) {
  for (uint64_t bad_chunk : {1, 6}) {
    SCOPED_TRACE(absl::StrCat("bad value in chunk ", bad_chunk));
    std::vector<std::vector<float>> grads = grads_;
    grads[bad_chunk][42] = std::nanf("");
    StepMessage message = WholeStep(1, grads);
    message.request.mutable_more(2)->set_param_dtype(static_cast<v1::DType>(99));  // Chunk 3.
    std::vector<grpc::Slice> reply;
    absl::Status status = Apply(message, &reply);
    EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
    if (bad_chunk == 1) {
      EXPECT_NE(status.message().find("StepRequest.more[0] (group 'g.1'): gradient of group 'g.1' "
                                      "at element 42 "),
                std::string::npos)
          << status;
    } else {
      EXPECT_NE(status.message().find(
                    "StepRequest.more[2] (group 'g.3'): param_dtype has unknown dtype 99"),
                std::string::npos)
          << status;
    }
    ExpectNothingApplied();
  }
}

// A chunk refused for its pages' state: applied in order (a small message),
// the refusal says the chunks before it were applied; applied at once (a
// large one), that the others were where they could be, also when it is
// the message's own chunk.
TEST_F(StepMessageTest, APageRefusalSaysWhatOfTheMessageWasApplied) {
  std::vector<grpc::Slice> reply;
  StepMessage small;
  for (uint64_t g = 0; g < 3; ++g) AddChunk(&small, absl::StrCat("g.", g), 1, grads_[g], 0, kPage);
  small.request.mutable_more(0)->set_step(2);  // g.1, at step 0.
  absl::Status status = Apply(small, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(status.message().find("StepRequest.more[0] (group 'g.1'): "), 0u) << status;
  EXPECT_NE(status.message().find("(the chunks before it in its message were applied)"),
            std::string::npos)
      << status;

  constexpr absl::string_view kOthers =
      "(the other chunks of its message were applied where they could be)";
  StepMessage packed = WholeStep(1, grads_);
  packed.request.mutable_more(3)->set_step(3);  // g.4, at step 0.
  status = Apply(packed, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(status.message().find("StepRequest.more[3] (group 'g.4'): "), 0u) << status;
  EXPECT_NE(status.message().find(kOthers), std::string::npos) << status;

  StepMessage own = WholeStep(2, grads_);
  own.request.set_step(4);                   // g.0, at step 1.
  own.request.mutable_more(3)->set_step(1);  // g.4, at step 0.
  status = Apply(own, &reply);
  EXPECT_EQ(status.code(), absl::StatusCode::kFailedPrecondition) << status;
  EXPECT_EQ(status.message().find("StepRequest.more"), std::string::npos) << status;
  EXPECT_NE(status.message().find("group 'g.0'"), std::string::npos) << status;
  EXPECT_NE(status.message().find(kOthers), std::string::npos) << status;
}

// A message whose reply could pass max_reply_bytes is refused before
// anything is applied.
TEST_F(StepMessageTest, AReplyTooLargeIsRefusedBeforeTheUpdate) {
  std::vector<grpc::Slice> reply;
  absl::Status status = Apply(WholeStep(1, grads_), &reply, /*max_reply_bytes=*/kSlice * 2);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("the reply to this message would take up to"), std::string::npos)
      << status;
  EXPECT_TRUE(reply.empty());
  ExpectNothingApplied();
}

// Region chunks (gradients in slices 0..7, params in 8..15 of one region)
// step as chunks carrying the same gradients, their params written into the
// region and none into the reply.
TEST_F(StepMessageTest, RegionChunksReadAndWriteTheRegistrysMappings) {
  const std::shared_ptr<const MappedRegion> region = NewRegion(2 * kGroups);
  StepMessage message;
  for (uint64_t g = 0; g < kGroups; ++g) {
    AddRegionChunk(&message, absl::StrCat("g.", g), region->id(), g, kGroups + g);
  }
  std::vector<grpc::Slice> reply;
  ASSERT_TRUE(Apply(message, &reply).ok());
  const v1::StepResponse response = Parse(reply);
  ASSERT_EQ(response.more_size(), static_cast<int>(kGroups - 1));
  for (uint64_t g = 0; g < kGroups; ++g) {
    const v1::StepResponse& r = g == 0 ? response : response.more(static_cast<int>(g - 1));
    EXPECT_TRUE(r.params_in_region());
    EXPECT_TRUE(r.params().empty());
    EXPECT_EQ(r.pages_applied(), (kElements + kPage - 1) / kPage);
    EXPECT_EQ(std::memcmp(SliceOf(*region, kGroups + g), GroupOf(r.group()).params(), kSlice), 0)
        << "group " << g;
  }
  // The same gradients carried in the message give the same state.
  CpuBackend backend(&pool_);
  StateStore store(&backend, uint64_t{8} << 30, kPage);
  StepEngine engine(&store, &backend, &pool_);
  GroupConfig config;
  config.num_elements = kElements;
  ASSERT_TRUE(store.Register(GroupKey{"", "g.3"}, config).ok());
  StepMessage carried;
  AddChunk(&carried, "g.3", 1, grads_[3], 0, kElements);
  ASSERT_TRUE(ApplyStepMessage(&engine, "", size_t{1} << 30, carried, &reply).ok());
  Group& reference = **store.Find(GroupKey{"", "g.3"});
  EXPECT_EQ(std::memcmp(reference.params(), GroupOf("g.3").params(), kSlice), 0);
  EXPECT_EQ(std::memcmp(reference.exp_avg_sq(), GroupOf("g.3").exp_avg_sq(), kSlice), 0);
}

}  // namespace
}  // namespace optstate
