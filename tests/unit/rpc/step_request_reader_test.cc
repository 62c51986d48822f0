// ReadStepRequest against protobuf's own parser: the same bytes, cut into
// slices anywhere, read to the same fields and gradients; bytes protobuf
// refuses are refused.
#include "server/rpc/step_request_reader.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/str_cat.h"
#include "tests/testing/random_cuts.h"
#include "tests/testing/test_seed.h"

namespace optstate {
namespace {

constexpr size_t kMaxPacked = 4096;

using ::optstate::testing::Gather;
using ::optstate::testing::RandomCuts;
using ::optstate::testing::Sliced;
namespace seeds = ::optstate::testing;

// The request as protobuf would hold it: the fields with the gradients put back.
v1::StepRequest Whole(const StepMessage& message) {
  v1::StepRequest whole = message.request;
  EXPECT_EQ(message.gradients.size(), 1u + whole.more_size());
  whole.set_gradient(Gather(message.gradients[0]));
  for (int i = 0; i < whole.more_size(); ++i) {
    whole.mutable_more(i)->set_gradient(Gather(message.gradients[i + 1]));
  }
  return whole;
}

v1::StepRequest RandomChunk(std::mt19937_64& rng) {
  v1::StepRequest chunk;
  chunk.set_group(absl::StrCat("g", rng() % 1000));
  chunk.set_step(rng() % 3 == 0 ? rng() : rng() % 100);
  chunk.set_offset(rng() % 2 == 0 ? rng() : 4096 * (rng() % 50));
  if (rng() % 2 == 0) chunk.set_group_elements(rng() % 3 == 0 ? rng() : rng() % 100000);
  chunk.set_gradient_dtype(static_cast<v1::DType>(static_cast<int>(rng() % 5) - 1));
  chunk.set_param_dtype(static_cast<v1::DType>(rng() % 4));
  std::string gradient(std::uniform_int_distribution<size_t>(0, 3000)(rng), '\0');
  for (char& c : gradient) c = static_cast<char>(rng());
  chunk.set_gradient(gradient);
  if (rng() % 2 == 0) chunk.set_lr(std::uniform_real_distribution<double>(-1, 1)(rng));
  if (rng() % 8 == 0) chunk.set_lr_float32(std::uniform_real_distribution<float>(-1, 1)(rng));
  // The per-step hyperparameters (fields 15-19).
  if (rng() % 2 == 0) chunk.set_beta1(std::uniform_real_distribution<double>(0, 1)(rng));
  if (rng() % 2 == 0) chunk.set_beta2(std::uniform_real_distribution<double>(0, 1)(rng));
  if (rng() % 2 == 0) chunk.set_eps(std::uniform_real_distribution<double>(0, 1e-6)(rng));
  if (rng() % 2 == 0) chunk.set_weight_decay(std::uniform_real_distribution<double>(0, 1)(rng));
  if (rng() % 2 == 0) chunk.set_maximize(rng() % 2 == 0);
  if (rng() % 2 == 0) chunk.set_grad_scale(std::uniform_real_distribution<float>(0, 9)(rng));
  // The same-host data plane's fields: region slices (some partly set) and a
  // session key.
  for (v1::RegionSlice* slice : {chunk.mutable_gradient_region(), chunk.mutable_params_region()}) {
    if (rng() % 3 == 0) continue;
    if (rng() % 2 == 0) slice->set_region(rng() % 5 == 0 ? rng() : rng() % 10);
    if (rng() % 2 == 0) slice->set_offset(rng() % 5 == 0 ? rng() : rng() % 100000);
    if (rng() % 2 == 0) slice->set_bytes(rng() % 5 == 0 ? rng() : rng() % 100000);
  }
  if (rng() % 2 == 0) {
    std::string key(16, '\0');
    for (char& c : key) c = static_cast<char>(rng());
    chunk.set_region_session(key);
  }
  return chunk;
}

v1::StepRequest RandomRequest(std::mt19937_64& rng) {
  v1::StepRequest request = RandomChunk(rng);
  for (int i = static_cast<int>(rng() % 6); i > 0; --i) *request.add_more() = RandomChunk(rng);
  return request;
}

// Fields a newer client might send, and known numbers with another wire type.
std::string UnknownFields(std::mt19937_64& rng) {
  std::string extra;
  extra += "\xa0\x01\x2a";                                 // Field 20, varint.
  extra += "\xaa\x01\x03xyz";                              // Field 21, length-delimited.
  extra += "\xb1\x01" + std::string(8, 'q');               // Field 22, fixed64.
  extra += "\x12\x02hi";                                   // Field 2 (step, a varint) as bytes.
  extra += std::string("\x35\x00\x00\x80\x3f", 5);         // Field 6 (lr_float32, retired), read.
  extra += std::string("\x5d\x00\x00\x80\x3f", 5);         // Field 11 (lr, a double) as fixed32.
  extra += std::string("\x31", 1) + std::string(8, '\0');  // Field 6 as fixed64.
  return rng() % 2 == 0 ? extra : extra.substr(0, 3);
}

TEST(ReadStepRequest, ReadsWhatProtobufReadsCutAnywhere) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (int trial = 0; trial < 400; ++trial) {
    std::string wire = RandomRequest(rng).SerializeAsString();
    if (trial % 3 == 0) wire += UnknownFields(rng);
    if (trial % 4 == 0)
      wire += RandomRequest(rng).SerializeAsString();  // A merge, as protobuf does.
    v1::StepRequest expected;
    ASSERT_TRUE(expected.ParseFromString(wire));
    expected.DiscardUnknownFields();

    grpc::ByteBuffer buffer = Sliced(wire, RandomCuts(wire.size(), trial % 7 == 0 ? 300 : 6, rng));
    StepMessage message;
    ASSERT_TRUE(ReadStepRequest(&buffer, kMaxPacked, &message).ok()) << trial;
    EXPECT_EQ(buffer.Length(), 0u);
    EXPECT_TRUE(message.request.gradient().empty());
    ASSERT_EQ(Whole(message).SerializeAsString(), expected.SerializeAsString()) << trial;
  }
}

TEST(ReadStepRequest, RefusesWhatProtobufRefuses) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  int refused = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    std::string wire = RandomRequest(rng).SerializeAsString();
    if (trial % 2 == 0) {
      wire.resize(std::uniform_int_distribution<size_t>(0, wire.size())(rng));
    } else {
      for (int flips = 1 + static_cast<int>(rng() % 3); flips > 0 && !wire.empty(); --flips) {
        wire[rng() % wire.size()] = static_cast<char>(rng());
      }
    }
    v1::StepRequest expected;
    const bool protobuf_ok = expected.ParseFromString(wire);
    grpc::ByteBuffer buffer = Sliced(wire, RandomCuts(wire.size(), 5, rng));
    StepMessage message;
    const absl::Status status = ReadStepRequest(&buffer, kMaxPacked, &message);
    // A corrupted byte may have made a packed chunk pack chunks itself; the
    // reader leaves those unread (the reactor refuses the message).
    bool nested = false;
    for (const v1::StepRequest& packed : message.request.more()) nested |= !packed.more().empty();
    if (nested) continue;
    ASSERT_EQ(status.ok(), protobuf_ok) << trial << " " << status;
    if (!status.ok()) {
      ++refused;
      EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
      EXPECT_NE(status.message().find("send optstate.v1.StepRequest"), std::string::npos);
      continue;
    }
    expected.DiscardUnknownFields();
    ASSERT_EQ(Whole(message).SerializeAsString(), expected.SerializeAsString()) << trial;
  }
  EXPECT_GT(refused, 1000) << "the corruptions should mostly be refused";
}

// Bytes random corruption rarely makes: over-long varints, nesting at the
// parser's depth limit, groups that do not close. Read exactly as protobuf
// reads them (accepted or refused alike).
TEST(ReadStepRequest, LimitsOfVarintsAndNestingAreProtobufs) {
  auto groups = [](int n) {
    std::string open, close;
    for (int i = 0; i < n; ++i) {
      open += "\xa3\x01";   // Field 20, start group.
      close += "\xa4\x01";  // Field 20, end group.
    }
    return open + close;
  };
  auto packed = [](const std::string& body) {
    v1::StepRequest outer;
    outer.set_group("g");
    return outer.SerializeAsString() + "\x4a" +
           std::string(1, static_cast<char>(0x80 | (body.size() & 0x7f))) +
           std::string(1, static_cast<char>(body.size() >> 7)) + body;
  };
  // A StepRequest.gradient_region (field 12) holding `body`.
  auto region = [](const std::string& body) {
    return "\x62" + std::string(1, static_cast<char>(0x80 | (body.size() & 0x7f))) +
           std::string(1, static_cast<char>(body.size() >> 7)) + body;
  };
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"a 6-byte group length", std::string("\x0a\x81\x80\x80\x80\x10\x61", 7)},
      {"a 6-byte tag", std::string("\x90\x80\x80\x80\x80\x00\x01", 7)},
      {"a 5-byte tag past 32 bits", std::string("\x90\x80\x80\x80\x10\x01", 6)},
      {"a 5-byte tag with every bit set past 32", std::string("\x90\x80\x80\x80\x7f\x01", 6)},
      {"a 5-byte tag within 32 bits", std::string("\x90\x80\x80\x80\x00\x01", 6)},
      {"a 6-byte length of an unknown field",
       std::string("\xaa\x01\x83\x80\x80\x80\x80\x00xyz", 11)},
      {"a 5-byte length of an unknown field", std::string("\xaa\x01\x83\x80\x80\x80\x00xyz", 10)},
      {"a 6-byte gradient length", std::string("\x2a\x81\x80\x80\x80\x80\x00\x61", 8)},
      {"100 nested groups", groups(100)},
      {"101 nested groups", groups(101)},
      {"99 nested groups in a packed chunk", packed(groups(99))},
      {"100 nested groups in a packed chunk", packed(groups(100))},
      {"99 nested groups in a gradient_region", region(groups(99))},
      {"100 nested groups in a gradient_region", region(groups(100))},
      {"a gradient_region whose bytes field is length-delimited",
       region(std::string("\x1a\x01\x01", 3))},
      {"a gradient_region that runs past its length", region(std::string("\x08\xff", 2))},
      {"a gradient_region twice (merged)",
       region(std::string("\x08\x07\x10\x09", 4)) + region(std::string("\x18\x05", 2))},
      {"a group that does not close", std::string("\xa3\x01\x10\x01", 4)},
      {"a group closed by another field's end", std::string("\xa3\x01\xac\x01", 4)},
      {"an end group with no start", std::string("\xa4\x01", 2)},
      {"wire type 6", std::string("\x16\x01", 2)},
  };
  for (const auto& [what, wire] : cases) {
    v1::StepRequest expected;
    const bool protobuf_ok = expected.ParseFromString(wire);
    grpc::ByteBuffer buffer = Sliced(wire, {});
    StepMessage message;
    const absl::Status status = ReadStepRequest(&buffer, kMaxPacked, &message);
    EXPECT_EQ(status.ok(), protobuf_ok) << what << ": " << status;
    if (status.ok() && protobuf_ok) {
      expected.DiscardUnknownFields();
      EXPECT_EQ(Whole(message).SerializeAsString(), expected.SerializeAsString()) << what;
    }
  }
}

TEST(ReadStepRequest, GradientsStayInTheMessageSlicesWhenTheMessageMoves) {
  v1::StepRequest request;
  request.set_group("g");
  request.set_gradient(std::string(100000, '\x5a'));
  request.add_more()->set_gradient("tiny");  // Lands in an inlined slice below.
  const std::string wire = request.SerializeAsString();
  grpc::ByteBuffer buffer = Sliced(wire, {10, 50000, wire.size() - 5});
  StepMessage read;
  ASSERT_TRUE(ReadStepRequest(&buffer, kMaxPacked, &read).ok());
  EXPECT_GE(read.gradients[0].segment_count(), 2u) << "read in place, not gathered";
  std::vector<StepMessage> moved;
  moved.push_back(std::move(read));
  moved.reserve(100);  // Moves the message again.
  EXPECT_EQ(Whole(moved[0]).SerializeAsString(), wire);
}

TEST(ReadStepRequest, MoreThanMaxPackedIsRefusedWhileReading) {
  v1::StepRequest request;
  request.set_group("g");
  for (int i = 0; i < 5; ++i) request.add_more()->set_group("p");
  const std::string wire = request.SerializeAsString();
  grpc::ByteBuffer buffer = Sliced(wire, {});
  StepMessage message;
  absl::Status status = ReadStepRequest(&buffer, 4, &message);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument);
  EXPECT_NE(status.message().find("at most 4"), std::string::npos) << status;
  buffer = Sliced(wire, {});
  EXPECT_TRUE(ReadStepRequest(&buffer, 5, &message).ok());
}

TEST(ReadStepRequest, APackedChunkThatPacksChunksIsLeftForTheCaller) {
  v1::StepRequest request;
  request.set_group("g");
  v1::StepRequest* packed = request.add_more();
  packed->set_group("p");
  packed->add_more()->set_gradient("nested");
  packed->set_step(9);  // After the nested field: still read.
  grpc::ByteBuffer buffer = Sliced(request.SerializeAsString(), {});
  StepMessage message;
  ASSERT_TRUE(ReadStepRequest(&buffer, kMaxPacked, &message).ok());
  ASSERT_EQ(message.request.more_size(), 1);
  EXPECT_EQ(message.request.more(0).more_size(), 1);
  EXPECT_EQ(message.request.more(0).step(), 9u);
  EXPECT_EQ(message.gradients.size(), 2u);
}

TEST(ReadStepRequest, BytesThatAreNotAStepRequestAreInvalidArgument) {
  // Field 1 (group) announces 16 bytes and carries 3.
  grpc::ByteBuffer buffer = Sliced(std::string("\x0a\x10"
                                               "abc"),
                                   {});
  StepMessage message;
  absl::Status status = ReadStepRequest(&buffer, kMaxPacked, &message);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("StepRequest"), std::string::npos) << status;
  EXPECT_TRUE(message.gradients.empty());
  EXPECT_TRUE(message.slices.slices().empty());
}

}  // namespace
}  // namespace optstate
