// The Step reactor's own message handling (server/step_wire.h): replies built
// in place parse, with protobuf's own parser, to exactly the fields and params
// written; requests parse as gRPC's deserializer would, and bytes that are not
// a StepRequest are refused.
#include "server/step_wire.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace optstate {
namespace {

std::string Flatten(const grpc::ByteBuffer& buffer, size_t* slice_count = nullptr) {
  std::vector<grpc::Slice> slices;
  EXPECT_TRUE(buffer.Dump(&slices).ok());
  if (slice_count != nullptr) *slice_count = slices.size();
  std::string out;
  for (const grpc::Slice& s : slices) out.append(reinterpret_cast<const char*>(s.begin()), s.size());
  return out;
}

v1::StepResponse Fields(const std::string& group) {
  v1::StepResponse fields;
  fields.set_group(group);
  fields.set_step(UINT64_MAX);  // The widest varints.
  fields.set_offset(UINT64_MAX - 1);
  fields.set_num_elements(1ull << 40);
  fields.set_param_dtype(v1::DTYPE_BFLOAT16);
  fields.set_pages_applied(UINT64_MAX);
  fields.set_pages_replayed(3);
  return fields;
}

void ExpectReply(const grpc::ByteBuffer& reply, const v1::StepResponse& fields,
                 const std::string& params) {
  size_t slices = 0;
  const std::string wire = Flatten(reply, &slices);
  EXPECT_EQ(slices, 1u) << "one slice: nothing gathered later";
  v1::StepResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  v1::StepResponse expected = fields;
  expected.set_params(params);
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
  EXPECT_EQ(wire.size(), expected.ByteSizeLong()) << "no padding or stray bytes";
}

TEST(StepReplyBuilder, ParamsWrittenInPlaceAndFieldsParseBack) {
  for (size_t bytes : {size_t{2}, size_t{127}, size_t{128}, size_t{1} << 20}) {
    SCOPED_TRACE(bytes);
    std::string params(bytes, '\0');
    for (size_t i = 0; i < bytes; ++i) params[i] = static_cast<char>(i * 131 + 7);
    const v1::StepResponse fields = Fields("model.layers.0.q_proj");
    StepReplyBuilder builder(fields.group().size());
    std::memcpy(builder.ReserveParams(bytes), params.data(), bytes);
    ExpectReply(builder.Finish(fields), fields, params);
  }
}

TEST(StepReplyBuilder, AGroupNameLongerThanAnnouncedStillSerializesCorrectly) {
  const std::string params = "\x01\x02\x03\x04";
  const v1::StepResponse fields = Fields(std::string(1000, 'g'));
  StepReplyBuilder builder(/*group_name_bytes=*/0);
  std::memcpy(builder.ReserveParams(params.size()), params.data(), params.size());
  ExpectReply(builder.Finish(fields), fields, params);
}

TEST(StepReplyBuilder, ASecondReserveStartsOver) {
  const v1::StepResponse fields = Fields("g");
  StepReplyBuilder builder(1);
  std::memset(builder.ReserveParams(100), 1, 100);
  std::memcpy(builder.ReserveParams(3), "xyz", 3);
  ExpectReply(builder.Finish(fields), fields, "xyz");
}

TEST(StepReplyBuilder, WithoutParamsTheReplyIsJustTheFields) {
  const v1::StepResponse fields = Fields("g");
  StepReplyBuilder builder(1);
  ExpectReply(builder.Finish(fields), fields, "");
}

TEST(ParseStepRequest, ParsesAsProtobufDoesAndEmptiesTheBuffer) {
  v1::StepRequest request;
  request.set_group("g");
  request.set_step(7);
  request.set_offset(1024);
  request.set_gradient(std::string(100000, '\x5a'));
  request.set_grad_scale(0.5f);
  const std::string wire = request.SerializeAsString();
  // Three slices, split inside the gradient, as the transport delivers them.
  std::vector<grpc::Slice> pieces = {grpc::Slice(wire.substr(0, 10)),
                                     grpc::Slice(wire.substr(10, 50000)),
                                     grpc::Slice(wire.substr(50010))};
  grpc::ByteBuffer buffer(pieces.data(), pieces.size());
  v1::StepRequest parsed;
  ASSERT_TRUE(ParseStepRequest(&buffer, &parsed).ok());
  EXPECT_EQ(parsed.SerializeAsString(), wire);
  EXPECT_EQ(buffer.Length(), 0u);
}

TEST(ParseStepRequest, BytesThatAreNotAStepRequestAreInvalidArgument) {
  // Field 1 (group) announces 16 bytes and carries 3.
  grpc::Slice truncated(std::string("\x0a\x10" "abc"));
  grpc::ByteBuffer buffer(&truncated, 1);
  v1::StepRequest parsed;
  absl::Status status = ParseStepRequest(&buffer, &parsed);
  EXPECT_EQ(status.code(), absl::StatusCode::kInvalidArgument) << status;
  EXPECT_NE(status.message().find("StepRequest"), std::string::npos) << status;
}

}  // namespace
}  // namespace optstate
