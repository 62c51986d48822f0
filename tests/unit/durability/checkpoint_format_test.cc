// The manifest: what is written reads back field for field, and each way a
// manifest can be damaged is refused with its own message.
#include "server/durability/checkpoint_format.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_replace.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/durability/crc32c.h"

namespace optstate {
namespace {

using ::testing::HasSubstr;

Manifest Example() {
  Manifest m;
  m.id = "ckpt-0000000000000042";
  m.step = 1234;
  m.page_elements = 262144;
  m.created_unix_micros = 1796110000123456;
  ManifestGroup a;
  a.key = {"", "model.layers.0.q_proj.weight"};
  a.config.num_elements = 1000003;
  a.config.hyperparameters = {1e-3, 0.9, 0.999, 1e-8, 0.1};
  a.config.has_initial_values = true;
  a.min_step = 1233;
  a.max_step = 1234;
  a.file = "group-0.data";
  a.bytes = DataFileBytes(1000003, 262144);
  a.crc32c = 0xDEADBEEF;
  ManifestGroup b = a;
  b.key = {"tenant a", "b"};
  b.config.hyperparameters.lr = 0.1f;  // Not a short decimal: must survive exactly.
  b.config.has_initial_values = false;
  b.config.hyperparameters.maximize = true;
  b.file = "group-1.data";
  m.groups = {a, b};
  return m;
}

TEST(CheckpointFormatTest, AManifestReadsBackExactly) {
  const Manifest m = Example();
  absl::StatusOr<Manifest> back = ParseManifest(EncodeManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, kCheckpointFormatVersion);
  EXPECT_EQ(back->id, m.id);
  EXPECT_EQ(back->step, m.step);
  EXPECT_EQ(back->page_elements, m.page_elements);
  EXPECT_EQ(back->created_unix_micros, m.created_unix_micros);
  ASSERT_EQ(back->groups.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    const ManifestGroup& g = back->groups[i];
    const ManifestGroup& e = m.groups[i];
    EXPECT_TRUE(g.key == e.key) << i;
    EXPECT_TRUE(g.config == e.config) << i;
    EXPECT_EQ(g.min_step, e.min_step);
    EXPECT_EQ(g.max_step, e.max_step);
    EXPECT_EQ(g.file, e.file);
    EXPECT_EQ(g.bytes, e.bytes);
    EXPECT_EQ(g.crc32c, e.crc32c);
  }
  EXPECT_EQ(back->groups[1].config.hyperparameters.lr, static_cast<double>(0.1f));
}

TEST(CheckpointFormatTest, DataFileBytesCountsRecordHeadersAndThreeTensors) {
  EXPECT_EQ(DataFileBytes(1, 64), 16u + 12u);
  EXPECT_EQ(DataFileBytes(128, 64), 2 * 16u + 128 * 12u);
  EXPECT_EQ(DataFileBytes(129, 64), 3 * 16u + 129 * 12u);
}

TEST(CheckpointFormatTest, DamagedManifestsAreRefusedEachWithItsReason) {
  const std::string good = EncodeManifest(Example());
  auto refusal = [](const std::string& text) {
    absl::StatusOr<Manifest> m = ParseManifest(text);
    EXPECT_FALSE(m.ok());
    EXPECT_EQ(m.status().code(), absl::StatusCode::kDataLoss);
    return std::string(m.status().message());
  };
  EXPECT_THAT(refusal(""), HasSubstr("not a checkpoint manifest"));
  EXPECT_THAT(refusal("garbage\n"), HasSubstr("not a checkpoint manifest"));
  EXPECT_THAT(refusal(good.substr(0, good.size() / 2)), HasSubstr("truncated"));
  EXPECT_THAT(refusal(good.substr(0, good.size() - 1)), HasSubstr("truncated"));
  std::string flipped = good;
  flipped[good.find("step 1234") + 5] = '9';
  EXPECT_THAT(refusal(flipped), HasSubstr("manifest checksum mismatch"));
  // A newer format is no damage: a newer optstated reads it.
  std::string future = good;
  future.replace(future.find("format_version 3"), 16, "format_version 7");
  absl::StatusOr<Manifest> newer = ParseManifest(future);
  EXPECT_EQ(newer.status().code(), absl::StatusCode::kFailedPrecondition);
  EXPECT_THAT(std::string(newer.status().message()),
              HasSubstr("format version 7 is newer than this daemon reads (3)"));
  std::string no_version = good;
  no_version.replace(no_version.find("format_version"), 14, "formot_version");
  EXPECT_THAT(refusal(no_version), HasSubstr("format_version N"));
}

// A manifest as daemons before format version 2 wrote it: group lines
// without maximize and amsgrad, which read as false.
TEST(CheckpointFormatTest, AVersionOneManifestStillReadsWithMaximizeAndAmsgradOff) {
  Manifest m = Example();
  m.groups[1].config.hyperparameters.maximize = false;
  std::string text = EncodeManifest(m);
  text.replace(text.find("format_version 3"), 16, "format_version 1");
  text.erase(text.rfind("end "));
  std::string v1;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "group ")) {
      ASSERT_TRUE(absl::ConsumeSuffix(&line, " 0 0 0 0 0 0 0 0 0")) << line;
      absl::StrAppend(&v1, "group ", line, "\n");
    } else {
      absl::StrAppend(&v1, line, "\n");
    }
  }
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08" PRIx32, Crc32cExtend(0, v1.data(), v1.size()));
  absl::StrAppend(&v1, "end ", crc, "\n");
  absl::StatusOr<Manifest> back = ParseManifest(v1);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 1);
  ASSERT_EQ(back->groups.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(back->groups[i].config == m.groups[i].config) << i;
    EXPECT_FALSE(back->groups[i].config.hyperparameters.maximize);
    EXPECT_FALSE(back->groups[i].config.hyperparameters.amsgrad);
  }
  // A version-3 line short of its fields does not parse.
  std::string short_line = EncodeManifest(Example());
  EXPECT_FALSE(ParseManifest(absl::StrReplaceAll(short_line, {{" 0 0\n", "\n"}})).ok());
}

// Version 3: a group's last step's record, read back exactly; a version-2
// manifest (without it) reads as none.
TEST(CheckpointFormatTest, TheLastStepRecordReadsBackAndAVersionTwoManifestHasNone) {
  Manifest m = Example();
  m.groups[0].min_step = m.groups[0].max_step = 1234;
  SteppedWith last;
  last.step = 1234;
  last.hyperparameters = {0.1f, 0.85, 0.995, 1e-6, 0.05};
  last.hyperparameters.maximize = true;
  m.groups[0].last_step = last;
  absl::StatusOr<Manifest> back = ParseManifest(EncodeManifest(m));
  ASSERT_TRUE(back.ok()) << back.status();
  ASSERT_TRUE(back->groups[0].last_step.has_value());
  EXPECT_EQ(back->groups[0].last_step->step, 1234u);
  EXPECT_TRUE(back->groups[0].last_step->hyperparameters == last.hyperparameters);
  EXPECT_FALSE(back->groups[1].last_step.has_value());

  std::string text = EncodeManifest(Example());
  text.replace(text.find("format_version 3"), 16, "format_version 2");
  text.erase(text.rfind("end "));
  std::string v2;
  for (absl::string_view line : absl::StrSplit(text, '\n', absl::SkipEmpty())) {
    if (absl::ConsumePrefix(&line, "group ")) {
      ASSERT_TRUE(absl::ConsumeSuffix(&line, " 0 0 0 0 0 0 0")) << line;
      absl::StrAppend(&v2, "group ", line, "\n");
    } else {
      absl::StrAppend(&v2, line, "\n");
    }
  }
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08" PRIx32, Crc32cExtend(0, v2.data(), v2.size()));
  absl::StrAppend(&v2, "end ", crc, "\n");
  back = ParseManifest(v2);
  ASSERT_TRUE(back.ok()) << back.status();
  EXPECT_EQ(back->version, 2);
  EXPECT_FALSE(back->groups[0].last_step.has_value());
  EXPECT_TRUE(back->groups[1].config.hyperparameters.maximize);
}

// A manifest whose checksum matches but whose hyperparameters a register
// would refuse (written by hand, or by a daemon with a bug) is damage: it is
// refused, naming the line and the value, and never loaded.
TEST(CheckpointFormatTest, HyperparametersOutOfRangeAreRefusedThoughTheChecksumMatches) {
  auto refusal = [](const Manifest& m) {
    absl::StatusOr<Manifest> back = ParseManifest(EncodeManifest(m));
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
    return std::string(back.status().message());
  };
  Manifest m = Example();
  m.groups[1].config.hyperparameters.lr = -1;
  EXPECT_THAT(refusal(m), HasSubstr("group line 2 (line 9): lr must be finite and >= 0"));
  m = Example();
  m.groups[0].config.hyperparameters.beta1 = 1;
  EXPECT_THAT(refusal(m), HasSubstr("group line 1 (line 8): beta1 must be in [0, 1)"));
  m = Example();
  m.groups[0].config.hyperparameters.eps = std::nan("");
  EXPECT_THAT(refusal(m), HasSubstr("eps must be finite and > 0"));
  m = Example();
  m.groups[0].config.hyperparameters.weight_decay = 1e300;
  EXPECT_THAT(refusal(m), HasSubstr("weight_decay must be finite and >= 0"));
  m = Example();
  SteppedWith last;
  last.step = 1234;
  last.hyperparameters = {1e-3, 0.9, 1.5, 1e-8, 0.1};
  m.groups[0].min_step = 1234;  // A record is kept of the pages' one step only.
  m.groups[0].last_step = last;
  EXPECT_THAT(refusal(m),
              HasSubstr("group line 1 (line 8), its last step: beta2 must be in [0, 1)"));
}

// What no writer writes, though the checksum matches: a last step's record
// of another step than the pages' one step, and a group named twice.
TEST(CheckpointFormatTest, ALastStepOffThePagesStepAndAGroupNamedTwiceAreRefused) {
  auto refusal = [](const Manifest& m) {
    absl::StatusOr<Manifest> back = ParseManifest(EncodeManifest(m));
    EXPECT_EQ(back.status().code(), absl::StatusCode::kDataLoss);
    return std::string(back.status().message());
  };
  Manifest m = Example();  // Group 0 at steps 1233..1234.
  SteppedWith last;
  last.step = 1234;
  last.hyperparameters = {1e-3, 0.9, 0.999, 1e-8, 0.1};
  m.groups[0].last_step = last;
  EXPECT_THAT(refusal(m), HasSubstr("records its last step as 1234, but its pages are at steps "
                                    "1233..1234"));
  m.groups[0].min_step = 1234;
  m.groups[0].last_step->step = 1233;
  EXPECT_THAT(refusal(m), HasSubstr("records its last step as 1233"));
  m.groups[0].last_step->step = 1234;
  EXPECT_TRUE(ParseManifest(EncodeManifest(m)).ok());
  m = Example();
  m.groups[1].key = m.groups[0].key;
  EXPECT_THAT(refusal(m), HasSubstr("group line 2 (line 9) names group "
                                    "'model.layers.0.q_proj.weight' again"));
  m.groups[1].key.tenant = "another";  // The same name in another tenant: another group.
  EXPECT_TRUE(ParseManifest(EncodeManifest(m)).ok());
}

TEST(CheckpointFormatTest, DirectoryNamesRoundTripAndTemporaryOnesAreNotCheckpoints) {
  EXPECT_EQ(CheckpointDirName(7), "ckpt-0000000000000007");
  EXPECT_EQ(ParseCheckpointDirName("ckpt-0000000000000007"), 7u);
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-0000000000000007.tmp"));
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-7"));
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-000000000000000x"));
  EXPECT_FALSE(ParseCheckpointDirName("MANIFEST"));
  // Past 16 digits the names grow as the writer writes them, and are read
  // back (they were passed over: every checkpoint after the 10^16th lost).
  EXPECT_EQ(CheckpointDirName(10'000'000'000'000'000u), "ckpt-10000000000000000");
  EXPECT_EQ(ParseCheckpointDirName("ckpt-10000000000000000"), 10'000'000'000'000'000u);
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-00000000000000007")) << "a name never written";
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-18446744073709551615")) << "no number follows it";
  EXPECT_FALSE(ParseCheckpointDirName("ckpt-18446744073709551616")) << "past uint64";
}

}  // namespace
}  // namespace optstate
