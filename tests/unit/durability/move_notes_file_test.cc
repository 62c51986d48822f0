// <state_dir>/MOVES: what WriteMoveNotes writes reads back the same; a file
// that is not one whole version is refused whole, naming the line.
#include "server/durability/move_notes_file.h"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

namespace optstate {
namespace {

using ::testing::HasSubstr;

class MoveNotesFileTest : public ::testing::Test {
 protected:
  void SetUp() override {
    char dir[] = "/tmp/optstate-moves-XXXXXX";
    ASSERT_NE(mkdtemp(dir), nullptr);
    dir_ = dir;
  }
  void TearDown() override { std::filesystem::remove_all(dir_); }
  void WriteRaw(const std::string& text) { std::ofstream(dir_ + "/MOVES") << text; }
  std::string dir_;
};

TEST_F(MoveNotesFileTest, WhatIsWrittenReadsBackAndNoneRemovesTheFile) {
  const std::vector<StateStore::MoveNote> notes = {{GroupKey{"", "job/w"}, "optstated-2"},
                                                   {GroupKey{"team-a", "job/b"}, "10.0.0.3:50051"}};
  ASSERT_TRUE(WriteMoveNotes(dir_, notes).ok());
  absl::StatusOr<std::vector<StateStore::MoveNote>> read = ReadMoveNotes(dir_);
  ASSERT_TRUE(read.ok()) << read.status();
  ASSERT_EQ(read->size(), 2u);
  EXPECT_EQ((*read)[0].key.tenant, "");
  EXPECT_EQ((*read)[0].key.name, "job/w");
  EXPECT_EQ((*read)[1].key.tenant, "team-a");
  EXPECT_EQ((*read)[1].moved_to, "10.0.0.3:50051");
  ASSERT_TRUE(WriteMoveNotes(dir_, {}).ok());
  EXPECT_FALSE(std::filesystem::exists(dir_ + "/MOVES"));
  read = ReadMoveNotes(dir_);
  ASSERT_TRUE(read.ok());
  EXPECT_TRUE(read->empty());
}

// Version 1 (an earlier daemon's, no CRC) is read with the same checks.
TEST_F(MoveNotesFileTest, AFileThatIsNotOneWholeVersionIsRefusedWhole) {
  const std::string header = "optstate-moves 1\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"optstate-moves 3\n\ta\tb\nend 1\n", "line 1"},
      {"optstate-moves 2\n\ta\tb\nend 1\n", "CRC32C are missing"},
      {header + "\ta\tb\n", "cut short"},
      {header + "\ta\tb\nend 2\n", "count of notes"},
      {header + "\ta\tb\nend 1", "cut short"},
      {header + "\ta b\tc\nend 1\n", "line 2"},
      {header + "\ta\t\nend 1\n", "line 2"},
      {header + "\ta\tb\n\ta\tc\nend 2\n", "named a second time"},
      {header + "\t" + std::string(513, 'x') + "\tb\nend 1\n", "line 2"},
  };
  for (const auto& [text, why] : cases) {
    WriteRaw(text);
    absl::StatusOr<std::vector<StateStore::MoveNote>> read = ReadMoveNotes(dir_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << text;
    EXPECT_THAT(read.status().message(), HasSubstr(why)) << text;
  }
  WriteRaw(header + "t\tjob/w\toptstated-2\nend 1\n");
  absl::StatusOr<std::vector<StateStore::MoveNote>> earlier = ReadMoveNotes(dir_);
  ASSERT_TRUE(earlier.ok()) << earlier.status();
  EXPECT_EQ((*earlier)[0].moved_to, "optstated-2");
  std::filesystem::remove(dir_ + "/MOVES");
  std::filesystem::create_directory(dir_ + "/MOVES");
  EXPECT_THAT(ReadMoveNotes(dir_).status().message(), HasSubstr("not a regular file"));
}

// Any byte of a note changed (a group's name, the daemon it moved to, the
// count) no longer matches the CRC32C: refused whole, not another group
// sealed or unsealed.
TEST_F(MoveNotesFileTest, AChangedByteIsRefusedByTheCrc) {
  ASSERT_TRUE(WriteMoveNotes(dir_, {{GroupKey{"", "job/w"}, "optstated-2"},
                                    {GroupKey{"", "job/b"}, "optstated-1"}})
                  .ok());
  std::ifstream in(dir_ + "/MOVES");
  const std::string written((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  EXPECT_THAT(written, HasSubstr(" crc32c "));
  for (size_t at : {written.find("job/w") + 4, written.find("optstated-1") + 10}) {
    std::string changed = written;
    changed[at] = changed[at] == 'w' ? 'x' : '2';
    WriteRaw(changed);
    absl::StatusOr<std::vector<StateStore::MoveNote>> read = ReadMoveNotes(dir_);
    EXPECT_EQ(read.status().code(), absl::StatusCode::kDataLoss) << changed;
    EXPECT_THAT(read.status().message(), HasSubstr("CRC32C does not match")) << changed;
  }
  WriteRaw(written);
  EXPECT_TRUE(ReadMoveNotes(dir_).ok());
}

}  // namespace
}  // namespace optstate
