// Bad Step calls: the Step rows of the bad-input table, raw bytes that are
// not a StepRequest, packed chunks, and random requests. Each refusal gets
// its code and leaves the victim's state byte-identical.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>

#include "absl/base/casts.h"
#include "grpcpp/generic/generic_stub.h"
#include "grpcpp/grpcpp.h"
#include "optstate/dtype.h"
#include "optstate/v1/optstate.grpc.pb.h"
#include "server/server.h"
#include "tests/testing/bad_input_fixture.h"

namespace optstate::testing {

std::vector<BadInput> StepBadInputs() {
  static constexpr float nan = std::numeric_limits<float>::quiet_NaN();
  static constexpr float inf = std::numeric_limits<float>::infinity();
  static const auto good = [](uint64_t n) { return std::vector<float>(n, 0.02f); };
  using T = BadInputTest;
  return {
      {"unknown group", grpc::StatusCode::NOT_FOUND,
       [&](T& t) { return t.StepOne(Chunk("nobody", 3, 0, good(kPage))); }},
      {"offset past the end", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 3, 4 * kPage, good(kPage))); }},
      {"chunk runs past the end", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 3, 2 * kPage, good(kPage))); }},
      {"data length not a multiple of the dtype size", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.mutable_gradient()->pop_back();
         return t.StepOne(r);
       }},
      {"unknown gradient dtype", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_gradient_dtype(static_cast<v1::DType>(7));
         return t.StepOne(r);
       }},
      {"unknown param dtype", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_param_dtype(static_cast<v1::DType>(9));
         return t.StepOne(r);
       }},
      {"chunk not on a page boundary", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 3, 512, good(kPage))); }},
      {"chunk ends inside a page", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 3, 0, good(1000))); }},
      {"empty gradient", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 3, 0, {})); }},
      {"NaN in the last page of a multi-page chunk", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         std::vector<float> g = good(kElements);
         g.back() = nan;
         return t.StepOne(Chunk("victim", 3, 0, g));
       }},
      {"infinite bfloat16 gradient", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         std::vector<uint16_t> g(kPage, FloatToBFloat16(0.01f));
         g[17] = FloatToBFloat16(inf);
         v1::StepRequest r = Chunk("victim", 3, 0, {});
         r.set_gradient_dtype(v1::DTYPE_BFLOAT16);
         r.set_gradient(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 2));
         return t.StepOne(r);
       }},
      {"NaN in a chunk packed behind a good one", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         std::vector<float> g = good(kPage);
         g[5] = nan;
         *r.add_more() = Chunk("victim", 3, kPage, g);
         return t.StepOne(r);
       }},
      {"unknown group packed behind a good chunk", grpc::StatusCode::NOT_FOUND,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         *r.add_more() = Chunk("nobody", 3, 0, good(kPage));
         return t.StepOne(r);
       }},
      {"unknown dtype packed behind a good chunk", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         *r.add_more() = Chunk("victim", 3, kPage, good(kPage));
         r.mutable_more(0)->set_gradient_dtype(static_cast<v1::DType>(999));
         return t.StepOne(r);
       }},
      {"message whose reply would pass the daemon's message limit",
       grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         // 300 bf16 pages (600 KiB) asking for float32 params (1.2 MiB).
         const std::vector<uint16_t> g(kPage, FloatToBFloat16(0.01f));
         v1::StepRequest one = Chunk("victim", 3, 0, {});
         one.set_gradient_dtype(v1::DTYPE_BFLOAT16);
         one.set_gradient(std::string(reinterpret_cast<const char*>(g.data()), g.size() * 2));
         v1::StepRequest r = one;
         for (int i = 1; i < 300; ++i) {
           *r.add_more() = one;
           r.mutable_more(i - 1)->set_offset((i % 2) * kPage);
         }
         return t.StepOne(r);
       }},
      {"group_elements other than the group's size", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_group_elements(kElements + kPage);
         return t.StepOne(r);
       }},
      {"more packed chunks than a message may carry", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         for (int i = 0; i < 4097; ++i) *r.add_more() = Chunk("victim", 3, kPage, {});
         return t.StepOne(r);
       }},
      {"finite gradient overflowing after grad_scale", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         std::vector<float> g = good(kPage);
         g[3] = 1e30f;
         v1::StepRequest r = Chunk("victim", 3, 0, g);
         r.set_grad_scale(1e10f);
         return t.StepOne(r);
       }},
      {"non-finite grad_scale", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_grad_scale(nan);
         return t.StepOne(r);
       }},
      {"negative per-step lr", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_lr(-1e-3f);
         return t.StepOne(r);
       }},
      {"per-step lr in the retired float32 field", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_lr_float32(1e-3f);
         return t.StepOne(r);
       }},
      {"per-step lr beyond float32's range", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.set_lr(1e39);
         return t.StepOne(r);
       }},
      {"step 0", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) { return t.StepOne(Chunk("victim", 0, 0, good(kPage))); }},
      {"step that skips ahead", grpc::StatusCode::FAILED_PRECONDITION,
       [&](T& t) { return t.StepOne(Chunk("victim", 4, 0, good(kPage))); }},
      {"stale step behind the page", grpc::StatusCode::FAILED_PRECONDITION,
       [&](T& t) { return t.StepOne(Chunk("victim", 1, 0, good(kPage))); }},
      // The same-host data plane (shared_memory_hostile_test.cc has the rows
      // that need a registered region).
      {"gradient_region naming no registered region", grpc::StatusCode::NOT_FOUND,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, {});
         r.set_region_session(std::string(16, 'k'));
         v1::RegionSlice* g = r.mutable_gradient_region();
         g->set_region(1);
         g->set_bytes(kPage * 4);
         return t.StepOne(r);
       }},
      {"a gradient and a gradient_region both", grpc::StatusCode::INVALID_ARGUMENT,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.mutable_gradient_region()->set_bytes(kPage * 4);
         return t.StepOne(r);
       }},
      {"params_region naming no registered region", grpc::StatusCode::NOT_FOUND,
       [&](T& t) {
         v1::StepRequest r = Chunk("victim", 3, 0, good(kPage));
         r.mutable_params_region()->set_region(7);
         r.mutable_params_region()->set_bytes(kPage * 4);
         return t.StepOne(r);
       }},
  };
}

namespace {

// Sends `bytes` as one message on the Step stream, bypassing protobuf.
grpc::Status StepRaw(int port, const std::string& bytes) {
  auto channel =
      grpc::CreateChannel("127.0.0.1:" + std::to_string(port), grpc::InsecureChannelCredentials());
  grpc::GenericStub stub(channel);
  grpc::CompletionQueue cq;
  grpc::ClientContext context;
  auto call = stub.PrepareCall(&context, "/optstate.v1.OptimizerState/Step", &cq);
  void* tag;
  bool ok;
  call->StartCall(reinterpret_cast<void*>(1));
  cq.Next(&tag, &ok);
  grpc::Slice slice(bytes);
  grpc::ByteBuffer message(&slice, 1);
  call->Write(message, reinterpret_cast<void*>(2));
  cq.Next(&tag, &ok);
  call->WritesDone(reinterpret_cast<void*>(3));
  cq.Next(&tag, &ok);
  grpc::ByteBuffer reply;
  do {
    call->Read(&reply, reinterpret_cast<void*>(4));
    cq.Next(&tag, &ok);
  } while (ok);
  grpc::Status status;
  call->Finish(&status, reinterpret_cast<void*>(5));
  cq.Next(&tag, &ok);
  return status;
}

TEST_F(BadInputTest, BytesThatAreNotAStepRequestAreInvalidArgumentAndChangeNothing) {
  const Snapshot before = Take();
  // Field 1 (group) announces 16 bytes and carries 3.
  grpc::Status status = StepRaw(server_->port(), std::string("\x0a\x10"
                                                             "abc"));
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("StepRequest"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(Take() == before) << "state changed";
  EXPECT_TRUE(StepOne(Chunk("victim", 3, 0, std::vector<float>(kPage, 0.01f))).ok());
}

// A message packing chunks (StepRequest.more) applies them in order, as if
// each came in its own message, and its reply packs theirs.
TEST_F(BadInputTest, PackedChunksApplyInOrderAndReplyInMore) {
  grpc::ClientContext context;
  auto stream = stub_->Step(&context);
  v1::StepRequest request = Chunk("victim", 3, 0, std::vector<float>(kPage, 0.01f));
  *request.add_more() = Chunk("victim", 3, kPage, std::vector<float>(kPage, 0.02f));
  *request.add_more() =
      Chunk("victim", 3, 2 * kPage, std::vector<float>(kElements - 2 * kPage, 0.03f));
  request.mutable_more(1)->set_param_dtype(v1::DTYPE_BFLOAT16);
  ASSERT_TRUE(stream->Write(request));
  stream->WritesDone();
  v1::StepResponse response;
  ASSERT_TRUE(stream->Read(&response));
  EXPECT_FALSE(stream->Read(&response)) << "one reply per message";
  ASSERT_TRUE(stream->Finish().ok());

  const Snapshot after = Take();
  EXPECT_EQ(after.page_steps, (std::vector<uint64_t>{3, 3, 3}));
  ASSERT_EQ(response.more_size(), 2);
  const v1::StepResponse* replies[] = {&response, &response.more(0), &response.more(1)};
  for (uint64_t k = 0; k < 3; ++k) {
    SCOPED_TRACE(k);
    const v1::StepResponse& reply = *replies[k];
    const uint64_t offset = k * kPage, n = std::min(kPage, kElements - offset);
    EXPECT_EQ(reply.group(), "victim");
    EXPECT_EQ(reply.step(), 3u);
    EXPECT_EQ(reply.offset(), offset);
    EXPECT_EQ(reply.num_elements(), n);
    EXPECT_EQ(reply.pages_applied(), 1u);
    EXPECT_EQ(reply.more_size(), k == 0 ? 2 : 0);
    const WireType type = k == 2 ? WireType::kBFloat16 : WireType::kFloat32;
    ASSERT_EQ(reply.params().size(), n * WireTypeSize(type));
    std::vector<float> params(n);
    DecodeToFloat(type, reply.params().data(), params.data(), n);
    for (uint64_t i = 0; i < n; ++i) {
      float expected = after.params[offset + i];
      if (type == WireType::kBFloat16) expected = BFloat16ToFloat(FloatToBFloat16(expected));
      ASSERT_EQ(params[i], expected) << "element " << offset + i;
    }
  }
}

// The first refused chunk of a message ends the call naming where it sat;
// the chunks packed before it were applied, those from it on were not.
TEST_F(BadInputTest, ARefusedPackedChunkNamesItsPlaceAndTheChunksBeforeItStand) {
  const Snapshot before = Take();
  auto good = [](uint64_t n) { return std::vector<float>(n, 0.02f); };
  v1::StepRequest request = Chunk("victim", 3, 0, good(kPage));
  *request.add_more() = Chunk("victim", 3, kPage, good(kPage));
  *request.add_more() = Chunk("victim", 5, 2 * kPage, good(kElements - 2 * kPage));  // Skips ahead.
  grpc::Status status = StepOne(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::FAILED_PRECONDITION) << status.error_message();
  EXPECT_NE(status.error_message().find("StepRequest.more[1]"), std::string::npos)
      << status.error_message();
  Snapshot after = Take();
  EXPECT_EQ(after.page_steps, (std::vector<uint64_t>{3, 3, 2}));
  for (uint64_t i = 2 * kPage; i < kElements; ++i) {
    ASSERT_EQ(after.params[i], before.params[i]) << "element " << i;
    ASSERT_EQ(after.exp_avg[i], before.exp_avg[i]) << "element " << i;
    ASSERT_EQ(after.exp_avg_sq[i], before.exp_avg_sq[i]) << "element " << i;
  }

  // Refusals that need no page state come before anything is applied: a
  // packed chunk that packs chunks itself refuses the whole message.
  const Snapshot middle = Take();
  request = Chunk("victim", 3, 2 * kPage, good(kElements - 2 * kPage));
  v1::StepRequest* packed = request.add_more();
  *packed = Chunk("victim", 4, 0, good(kPage));
  *packed->add_more() = Chunk("victim", 4, kPage, good(kPage));
  status = StepOne(request);
  EXPECT_EQ(status.error_code(), grpc::StatusCode::INVALID_ARGUMENT) << status.error_message();
  EXPECT_NE(status.error_message().find("packs chunks itself"), std::string::npos)
      << status.error_message();
  EXPECT_NE(status.error_message().find("nothing in its message was applied"), std::string::npos)
      << status.error_message();
  EXPECT_TRUE(Take() == middle) << "state changed";
}

// A message's groups are held back while an earlier message packing one of
// them is applied: a later step of a group packed in both waits its turn.
TEST_F(BadInputTest, AGroupPackedInAnEarlierMessageIsAppliedInStreamOrder) {
  std::vector<float> initial(kPage, 0.5f);
  ASSERT_TRUE(Register(Spec("b", kPage, 1e-3f), {{0, Floats(initial)}}).ok());
  ASSERT_TRUE(Register(Spec("c", kPage, 1e-3f), {{0, Floats(initial)}}).ok());
  const std::vector<float> g(kPage, 0.1f);
  for (uint64_t round = 0; round < 50; ++round) {
    const uint64_t t = 3 + 2 * round;  // The victim's page 0 is at t - 1.
    grpc::ClientContext context;
    auto stream = stub_->Step(&context);
    // [b, more: victim page 0 at t], then [c, more: victim page 0 at t + 1].
    v1::StepRequest first = Chunk("b", round + 1, 0, g);
    *first.add_more() = Chunk("victim", t, 0, g);
    v1::StepRequest second = Chunk("c", round + 1, 0, g);
    *second.add_more() = Chunk("victim", t + 1, 0, g);
    ASSERT_TRUE(stream->Write(first));
    ASSERT_TRUE(stream->Write(second));
    stream->WritesDone();
    v1::StepResponse response;
    int replies = 0;
    while (stream->Read(&response)) ++replies;
    grpc::Status status = stream->Finish();
    ASSERT_TRUE(status.ok()) << "round " << round << ": " << status.error_message();
    EXPECT_EQ(replies, 2);
  }
  EXPECT_EQ(Take().page_steps[0], 102u);
}

TEST_F(BadInputTest, RandomRequestsGetAStatusAndNeverCorruptOrCrash) {
  const uint32_t seed = std::random_device()();
  SCOPED_TRACE(::testing::Message() << "seed " << seed);
  std::mt19937 rng(seed);
  auto pick = [&](uint64_t n) { return std::uniform_int_distribution<uint64_t>(0, n - 1)(rng); };
  const Snapshot before = Take();
  for (int i = 0; i < 300; ++i) {
    v1::StepRequest r;
    r.set_group(pick(4) == 0 ? "nobody" : "victim");
    // The victim is at step 2: every step but 3 is refused whatever the rest.
    const uint64_t step = pick(3) == 0 ? pick(1000) : (pick(2) ? 1 : 5);
    r.set_step(step == 3 ? 4 : step);
    r.set_offset(pick(3) == 0 ? pick(5000) : kPage * pick(4));
    r.set_gradient_dtype(static_cast<v1::DType>(pick(6)));
    r.set_param_dtype(static_cast<v1::DType>(pick(6)));
    std::string bytes(pick(3 * kPage * 4), '\0');
    for (char& c : bytes) c = static_cast<char>(pick(256));
    r.set_gradient(bytes);
    if (pick(2)) r.set_lr(absl::bit_cast<float>(static_cast<uint32_t>(rng())));
    if (pick(2)) r.set_grad_scale(absl::bit_cast<float>(static_cast<uint32_t>(rng())));
    // Sometimes packed after a copy of itself, or under one that packs it.
    if (pick(4) == 0) *r.add_more() = v1::StepRequest(r);
    if (pick(8) == 0) {
      v1::StepRequest outer = r;
      *outer.add_more() = std::move(r);
      r = std::move(outer);
    }
    grpc::Status status = StepOne(r);
    EXPECT_FALSE(status.ok()) << "a random chunk was applied: step " << r.step();
  }
  EXPECT_TRUE(Take() == before) << "state changed";
  grpc::ClientContext context;
  v1::GetStatsResponse stats;
  EXPECT_TRUE(stub_->GetStats(&context, v1::GetStatsRequest(), &stats).ok());
}

}  // namespace
}  // namespace optstate::testing
