// The Step reactor's replies (server/rpc/step_reply_builder.h): replies built in place
// parse, with protobuf's own parser, to exactly the fields and params written.
#include "server/rpc/step_reply_builder.h"

#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

namespace optstate {
namespace {

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

std::string Bytes(const grpc::Slice& slice) {
  return std::string(reinterpret_cast<const char*>(slice.begin()), slice.size());
}

void ExpectReply(const grpc::Slice& reply, const v1::StepResponse& fields,
                 const std::string& params) {
  const std::string wire = Bytes(reply);
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

// A reply of one chunk and its packed chunks: the outer reply's bytes, then
// each packed reply's (the reactor sends them as one buffer of slices).
TEST(StepReplyBuilder, PackedRepliesFollowTheOuterOneAsItsMoreField) {
  // Params sizes around the one- and two-byte lengths of the `more` field,
  // a reply without params, a group name longer than announced (with and
  // without params: the copy into a fresh slice keeps the head room).
  const std::vector<size_t> sizes = {2, 60, 100, 127, 128, 16300, 16400, 0, 1 << 20, 0, 40};
  v1::StepResponse expected = Fields("outer");
  expected.set_params("ab");
  std::string wire;
  {
    StepReplyBuilder outer(5);
    std::memcpy(outer.ReserveParams(2), "ab", 2);
    wire = Bytes(outer.Finish(Fields("outer")));
  }
  for (size_t i = 0; i < sizes.size(); ++i) {
    SCOPED_TRACE(sizes[i]);
    const bool long_name = i == 7 || i == 9 || i == 10;
    const std::string name =
        long_name ? std::string(300, 'n') + std::to_string(i) : "packed." + std::to_string(i);
    std::string params(sizes[i], '\0');
    for (size_t k = 0; k < params.size(); ++k) params[k] = static_cast<char>(k * 7 + i);
    StepReplyBuilder packed(long_name ? 1 : name.size(), /*packed=*/true);
    if (!params.empty())
      std::memcpy(packed.ReserveParams(params.size()), params.data(), params.size());
    wire += Bytes(packed.Finish(Fields(name)));
    v1::StepResponse* more = expected.add_more();
    *more = Fields(name);
    more->set_params(params);
  }
  v1::StepResponse parsed;
  ASSERT_TRUE(parsed.ParseFromString(wire));
  EXPECT_EQ(parsed.SerializeAsString(), expected.SerializeAsString());
  EXPECT_EQ(wire.size(), expected.ByteSizeLong()) << "no padding or stray bytes";
}

}  // namespace
}  // namespace optstate
