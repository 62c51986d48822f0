// The client's raw Step messages (client/step_wire.h) against protobuf's own
// serializer and parser: requests parse back to the fields and the narrowed
// gradient; replies split into slices anywhere (an element may straddle two)
// widen into params_out exactly as DecodeToFloat does; malformed replies are
// INTERNAL errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "client/transport/wire/step_wire.h"
#include "optstate/v1/dtype_proto.h"
#include "tests/testing/random_cuts.h"
#include "tests/testing/step_wire_one_chunk.h"
#include "tests/testing/test_seed.h"

namespace optstate::client_internal {
namespace {

namespace seeds = ::optstate::testing;

std::string Flatten(const grpc::ByteBuffer& buffer) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  std::string out;
  for (const grpc::Slice& s : slices)
    out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

using ::optstate::testing::RandomCuts;
using ::optstate::testing::Sliced;

std::vector<float> RandomFloats(size_t n, std::mt19937_64& rng) {
  std::normal_distribution<float> normal(0.0f, 3.0f);
  std::vector<float> v(n);
  for (float& x : v) x = normal(rng);
  return v;
}

std::string Encoded(WireType type, const std::vector<float>& values) {
  std::string bytes(values.size() * WireTypeSize(type), '\0');
  EncodeFromFloat(type, values.data(), bytes.data(), values.size());
  return bytes;
}

absl::Status AcceptAll(const v1::StepResponse&) { return absl::OkStatus(); }

constexpr WireType kTypes[] = {WireType::kFloat32, WireType::kBFloat16, WireType::kFloat16};

TEST(SerializeStepRequest, ParsesBackToTheFieldsAndTheNarrowedGradient) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (WireType type : kTypes) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const std::vector<float> gradient = RandomFloats(1031, rng);
    v1::StepRequest fields;
    fields.set_group("model.w");
    fields.set_step(12);
    fields.set_offset(262144);
    fields.set_gradient_dtype(WireTypeToProto(type));
    fields.set_param_dtype(v1::DTYPE_BFLOAT16);
    fields.set_grad_scale(0.25f);
    v1::StepRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(SerializeStepRequest(fields, type, gradient))));
    v1::StepRequest expected = fields;
    expected.set_gradient(Encoded(type, gradient));
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
  }
}

TEST(SerializeStepRequest, ThePayloadPointerIsTheNarrowedGradientEvenInATinyMessage) {
  for (WireType type : kTypes) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const std::vector<float> gradient = {0.375f};
    v1::StepRequest fields;
    fields.set_group("g");
    const unsigned char* payload = nullptr;
    grpc::ByteBuffer request = SerializeStepRequest(fields, type, gradient, &payload);
    grpc::ByteBuffer copy = request;  // Copies share the bytes.
    request.Clear();
    const std::string want = Encoded(type, gradient);
    ASSERT_NE(payload, nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(payload), want.size()), want);
    const std::string wire = Flatten(copy);
    EXPECT_EQ(wire.substr(wire.size() - want.size()), want);
  }
}

v1::StepResponse ResponseFields() {
  v1::StepResponse fields;
  fields.set_group("model.w");
  fields.set_step(3);
  fields.set_offset(524288);
  fields.set_num_elements(1031);
  fields.set_param_dtype(v1::DTYPE_FLOAT16);
  fields.set_pages_applied(1);
  fields.set_pages_replayed(2);
  return fields;
}

TEST(ParseStepResponse, WidensParamsSplitAnywhereExactlyAsDecodeToFloat) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  constexpr size_t kN = 1031;
  for (WireType type : kTypes) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    const std::string params = Encoded(type, RandomFloats(kN, rng));
    std::vector<float> want(kN);
    DecodeToFloat(type, params.data(), want.data(), kN);
    v1::StepResponse message = ResponseFields();
    message.set_params(params);
    const std::string wire = message.SerializeAsString();
    for (int trial = 0; trial < 200; ++trial) {
      grpc::ByteBuffer reply = Sliced(wire, RandomCuts(wire.size(), 6, rng));
      std::vector<float> got(kN, -1.0f);
      v1::StepResponse fields;
      ASSERT_TRUE(
          ParseStepResponse(&reply, type, kN, absl::MakeSpan(got), AcceptAll, &fields).ok());
      ASSERT_EQ(std::memcmp(got.data(), want.data(), kN * sizeof(float)), 0) << trial;
      EXPECT_EQ(fields.SerializeAsString(), ResponseFields().SerializeAsString());
      EXPECT_EQ(reply.Length(), 0u);
    }
  }
}

TEST(ParseStepResponse, ParamsFirstAndUnknownFieldsAreFine) {
  const std::vector<float> values = {1.5f, -2.0f, 3.25f};
  const std::string params = Encoded(WireType::kFloat32, values);
  // Params first (as optstated writes them), then the fields, then field 15.
  v1::StepResponse only_params;
  only_params.set_params(params);
  const std::string wire = only_params.SerializeAsString() + ResponseFields().SerializeAsString() +
                           std::string("\x78\x05", 2);
  grpc::ByteBuffer reply = Sliced(wire, {5});
  std::vector<float> got(3);
  v1::StepResponse fields;
  ASSERT_TRUE(
      ParseStepResponse(&reply, WireType::kFloat32, 3, absl::MakeSpan(got), AcceptAll, &fields)
          .ok());
  EXPECT_EQ(got, values);
  EXPECT_EQ(fields.SerializeAsString(), ResponseFields().SerializeAsString());
}

TEST(ParseStepResponse, AnEmptyParamsOutSkipsTheParams) {
  v1::StepResponse message = ResponseFields();
  message.set_params(std::string(8, '\x11'));
  grpc::ByteBuffer reply = Sliced(message.SerializeAsString(), {});
  v1::StepResponse fields;
  ASSERT_TRUE(ParseStepResponse(&reply, WireType::kBFloat16, 4, {}, AcceptAll, &fields).ok());
  EXPECT_EQ(fields.offset(), 524288u);
}

TEST(ParseStepResponse, MalformedRepliesAreInternalErrorsAndLeaveParamsOutAlone) {
  v1::StepResponse good = ResponseFields();
  good.set_params(std::string(16, '\x3f'));
  const std::string wire = good.SerializeAsString();
  v1::StepResponse params_only;
  params_only.set_params(std::string(16, '\x3f'));
  const std::string params_wire = params_only.SerializeAsString();
  // Field 15 (unknown, varint 5), then a byte protobuf refuses.
  const std::string unknown = std::string("\x78\x05", 2);
  struct Case {
    const char* what;
    std::string bytes;
    size_t elements;
    const char* says;
  };
  const Case cases[] = {
      {"params of another length", wire, 5, "16 bytes of params; expected 20"},
      {"no params", ResponseFields().SerializeAsString(), 4, "no params"},
      {"params with the wrong wire type (an unknown field, so none)", std::string("\x30\x05", 2), 4,
       "no params"},
      {"truncated inside the params", params_wire.substr(0, params_wire.size() - 3), 4,
       "past the end"},
      {"truncated after the params", wire.substr(0, wire.size() - 1), 4, "field 8"},
      {"a zero tag", std::string("\x00\x01", 2), 4, "zero field tag"},
      {"a trailing zero byte", params_wire + unknown + std::string(1, '\0'), 4, "zero field tag"},
      {"a tag cut off at the end", params_wire + unknown + std::string("\x80", 1), 4,
       "zero field tag"},
      {"field number 0", params_wire + std::string("\x02\x00", 2), 4, "zero field tag"},
      {"a params length over 32 bits",
       std::string("\x32\x90\x80\x80\x80\x10", 6) + std::string(16, '\0'), 4,
       "4294967312 bytes of params"},
      {"a truncated group",
       std::string("\x0a\x10"
                   "abc"),
       4, "field 1"},
      {"a group that is not UTF-8", params_wire + std::string("\x0a\x02\xc3\x28", 4), 4, "field 1"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    // v1::StepResponse's own parser refuses these too, or finds no params of that size.
    grpc::ByteBuffer reply = Sliced(c.bytes, {});
    std::vector<float> out(c.elements, 7.0f);
    v1::StepResponse fields;
    absl::Status s = ParseStepResponse(&reply, WireType::kFloat32, c.elements, absl::MakeSpan(out),
                                       AcceptAll, &fields);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    EXPECT_EQ(out, std::vector<float>(c.elements, 7.0f)) << "params_out was written";
  }
}

TEST(ParseStepResponse, AReplyTheCheckRefusesLeavesParamsOutAlone) {
  v1::StepResponse message = ResponseFields();
  message.set_params(std::string(8, '\x3f'));
  grpc::ByteBuffer reply = Sliced(message.SerializeAsString(), {3});
  std::vector<float> out(2, 7.0f);
  v1::StepResponse fields;
  absl::Status s = ParseStepResponse(
      &reply, WireType::kFloat32, 2, absl::MakeSpan(out),
      [](const v1::StepResponse& f) {
        return f.offset() == 0 ? absl::OkStatus() : absl::InternalError("another chunk's reply");
      },
      &fields);
  EXPECT_EQ(s.message(), "another chunk's reply");
  EXPECT_EQ(out, std::vector<float>(2, 7.0f));
}

// Packed chunks (StepRequest.more / StepResponse.more).

TEST(SerializeStepRequest, PackedPiecesParseBackAsMoreWithTheirGradients) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  for (WireType type : kTypes) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    // Sizes around the one- and two-byte lengths of a `more` field.
    const std::vector<size_t> sizes = {1031, 1, 50, 64, 8000, 0, 3};
    std::vector<std::vector<float>> gradients;
    std::vector<v1::StepRequest> fields(sizes.size());
    std::vector<RequestPiece> pieces;
    v1::StepRequest expected;
    for (size_t k = 0; k < sizes.size(); ++k) {
      gradients.push_back(RandomFloats(sizes[k], rng));
      fields[k].set_group("layers." + std::to_string(k));
      fields[k].set_step(9);
      fields[k].set_offset(4096 * k);
      fields[k].set_gradient_dtype(WireTypeToProto(type));
      v1::StepRequest& want = k == 0 ? expected : *expected.add_more();
      want = fields[k];
      want.set_gradient(Encoded(type, gradients[k]));
    }
    for (size_t k = 0; k < sizes.size(); ++k) pieces.push_back({&fields[k], gradients[k]});
    std::vector<const unsigned char*> payloads;
    grpc::ByteBuffer request = SerializeStepRequest(pieces, type, &payloads);
    v1::StepRequest parsed;
    ASSERT_TRUE(parsed.ParseFromString(Flatten(request)));
    EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
    ASSERT_EQ(payloads.size(), sizes.size());
    for (size_t k = 0; k < sizes.size(); ++k) {
      const std::string want = Encoded(type, gradients[k]);
      EXPECT_EQ(std::string(reinterpret_cast<const char*>(payloads[k]), want.size()), want) << k;
    }
  }
}

// A reply packing `counts.size() - 1` replies, params of `type` from `rng`;
// `want` gets each one's params widened.
v1::StepResponse PackedReply(WireType type, const std::vector<size_t>& counts, std::mt19937_64& rng,
                             std::vector<std::vector<float>>* want) {
  v1::StepResponse outer;
  for (size_t k = 0; k < counts.size(); ++k) {
    v1::StepResponse& reply = k == 0 ? outer : *outer.add_more();
    reply.set_group("layers." + std::to_string(k));
    reply.set_offset(4096 * k);
    reply.set_num_elements(counts[k]);
    reply.set_params(Encoded(type, RandomFloats(counts[k], rng)));
    want->emplace_back(counts[k]);
    DecodeToFloat(type, reply.params().data(), want->back().data(), counts[k]);
  }
  return outer;
}

TEST(ParseStepResponse, PackedRepliesWidenIntoEachPiecesParamsOut) {
  const uint64_t seed = seeds::TestSeed();
  SCOPED_TRACE(seeds::SeedTrace(seed));
  std::mt19937_64 rng(seed);
  const std::vector<size_t> counts = {1031, 64, 1, 8000, 5};
  for (WireType type : kTypes) {
    SCOPED_TRACE(std::string(WireTypeName(type)));
    std::vector<std::vector<float>> want;
    const v1::StepResponse message = PackedReply(type, counts, rng, &want);
    const std::string wire = message.SerializeAsString();
    for (int trial = 0; trial < 50; ++trial) {
      grpc::ByteBuffer reply = Sliced(wire, RandomCuts(wire.size(), 8, rng));
      std::vector<std::vector<float>> got;
      std::vector<ReplyPiece> pieces;
      for (size_t n : counts) got.emplace_back(n, -1.0f);
      for (size_t k = 0; k < counts.size(); ++k) {
        // One piece discards its params.
        pieces.push_back({counts[k], k == 1 ? absl::Span<float>() : absl::MakeSpan(got[k])});
      }
      std::vector<size_t> checked;
      v1::StepResponse fields;
      ASSERT_TRUE(ParseStepResponse(
                      &reply, type, pieces,
                      [&](size_t k, const v1::StepResponse& f) {
                        checked.push_back(k);
                        EXPECT_EQ(f.offset(), 4096 * k);
                        return absl::OkStatus();
                      },
                      &fields)
                      .ok());
      EXPECT_EQ(checked, (std::vector<size_t>{0, 1, 2, 3, 4}));
      for (size_t k = 0; k < counts.size(); ++k) {
        if (k == 1) {
          EXPECT_EQ(got[k], std::vector<float>(counts[k], -1.0f));
        } else {
          ASSERT_EQ(std::memcmp(got[k].data(), want[k].data(), counts[k] * 4), 0) << k;
        }
      }
      ASSERT_EQ(fields.more_size(), 4);
      EXPECT_EQ(fields.more(3).group(), "layers.4");
      EXPECT_TRUE(fields.params().empty() && fields.more(0).params().empty());
    }
  }
}

TEST(ParseStepResponse, PackedRepliesThatDoNotMatchTheRequestAreInternalAndWriteNothing) {
  std::mt19937_64 rng(7);
  std::vector<std::vector<float>> unused;
  const v1::StepResponse three = PackedReply(WireType::kFloat32, {4, 4, 4}, rng, &unused);
  v1::StepResponse nested = three;
  *nested.mutable_more(0)->add_more() = three.more(1);
  const std::string wire = three.SerializeAsString();
  // The last `more` field announces one byte past the end.
  std::string overlong = three.SerializeAsString();
  const v1::StepResponse& last = three.more(1);
  overlong.resize(overlong.size() - last.ByteSizeLong() - 1);
  overlong += static_cast<char>(last.ByteSizeLong() + 1);
  overlong += last.SerializeAsString();
  struct Case {
    const char* what;
    std::string bytes;
    size_t pieces;
    const char* says;
  };
  const Case cases[] = {
      {"fewer packed replies than packed chunks", wire, 4, "packs 2 replies"},
      {"more packed replies than packed chunks", wire, 2, "more than the 1 replies"},
      {"a packed reply packing replies", nested.SerializeAsString(), 3, "packs replies itself"},
      {"a more field running past the end", overlong, 3, "malformed `more`"},
      {"a more length over 32 bits (5 + 2^32)",
       wire + std::string("\x4a\x85\x80\x80\x80\x10", 6) + std::string(5, '\0'), 4,
       "malformed `more`"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    grpc::ByteBuffer reply = Sliced(c.bytes, {});
    std::vector<std::vector<float>> out(c.pieces, std::vector<float>(4, 7.0f));
    std::vector<ReplyPiece> pieces;
    for (auto& o : out) pieces.push_back({4, absl::MakeSpan(o)});
    v1::StepResponse fields;
    absl::Status s = ParseStepResponse(
        &reply, WireType::kFloat32, pieces,
        [](size_t, const v1::StepResponse&) { return absl::OkStatus(); }, &fields);
    EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
    EXPECT_NE(s.message().find(c.says), std::string::npos) << s;
    for (const auto& o : out) EXPECT_EQ(o, std::vector<float>(4, 7.0f)) << "params_out was written";
  }
  // The check refusing the last piece: nothing written to any.
  grpc::ByteBuffer reply = Sliced(wire, {});
  std::vector<std::vector<float>> out(3, std::vector<float>(4, 7.0f));
  std::vector<ReplyPiece> pieces;
  for (auto& o : out) pieces.push_back({4, absl::MakeSpan(o)});
  v1::StepResponse fields;
  absl::Status s = ParseStepResponse(
      &reply, WireType::kFloat32, pieces,
      [](size_t k, const v1::StepResponse&) {
        return k == 2 ? absl::InternalError("another chunk's reply") : absl::OkStatus();
      },
      &fields);
  EXPECT_EQ(s.message(), "another chunk's reply");
  for (const auto& o : out) EXPECT_EQ(o, std::vector<float>(4, 7.0f));
}

// 16-bit buffers (gradient16, params_out16): copied as they are.

TEST(SerializeStepRequest, SixteenBitGradientsAreCopiedAsTheyAre) {
  std::vector<uint16_t> bits(1001);
  for (size_t i = 0; i < bits.size(); ++i) bits[i] = static_cast<uint16_t>(i * 40503u);
  v1::StepRequest fields;
  fields.set_group("g");
  fields.set_gradient_dtype(v1::DTYPE_FLOAT16);
  std::vector<float> first = {1.0f, 2.0f};
  v1::StepRequest second_fields = fields;
  const std::vector<RequestPiece> pieces = {{&fields, first, {}}, {&second_fields, {}, bits}};
  v1::StepRequest parsed;
  ASSERT_TRUE(parsed.ParseFromString(Flatten(SerializeStepRequest(pieces, WireType::kFloat16))));
  EXPECT_EQ(parsed.gradient(), Encoded(WireType::kFloat16, first));
  ASSERT_EQ(parsed.more_size(), 1);
  EXPECT_EQ(parsed.more(0).gradient(),
            std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
}

TEST(ParseStepResponse, SixteenBitParamsOutGetsTheBitsSplitAnywhere) {
  std::mt19937_64 rng(11);
  std::vector<uint16_t> bits(777);
  for (uint16_t& b : bits) b = static_cast<uint16_t>(rng());
  v1::StepResponse message = ResponseFields();
  message.set_params(std::string(reinterpret_cast<const char*>(bits.data()), bits.size() * 2));
  const std::string wire = message.SerializeAsString();
  for (size_t cut = 1; cut < wire.size(); cut += 37) {  // Odd and even cuts.
    grpc::ByteBuffer reply = Sliced(wire, {cut});
    std::vector<uint16_t> got(bits.size(), 0);
    const std::vector<ReplyPiece> pieces = {{bits.size(), {}, absl::MakeSpan(got)}};
    v1::StepResponse fields;
    ASSERT_TRUE(ParseStepResponse(
                    &reply, WireType::kBFloat16, pieces,
                    [](size_t, const v1::StepResponse&) { return absl::OkStatus(); }, &fields)
                    .ok());
    ASSERT_EQ(got, bits) << cut;
  }
  // 16-bit params_out16 for a float32 reply is a caller's mistake, refused.
  grpc::ByteBuffer reply = Sliced(wire, {});
  std::vector<uint16_t> got(bits.size(), 0);
  const std::vector<ReplyPiece> pieces = {{bits.size(), {}, absl::MakeSpan(got)}};
  v1::StepResponse fields;
  absl::Status s = ParseStepResponse(
      &reply, WireType::kFloat32, pieces,
      [](size_t, const v1::StepResponse&) { return absl::OkStatus(); }, &fields);
  EXPECT_EQ(s.code(), absl::StatusCode::kInternal) << s;
  EXPECT_EQ(got, std::vector<uint16_t>(bits.size(), 0));
}

}  // namespace
}  // namespace optstate::client_internal
