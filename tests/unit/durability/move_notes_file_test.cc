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

TEST_F(MoveNotesFileTest, AFileThatIsNotOneWholeVersionIsRefusedWhole) {
  const std::string header = "optstate-moves 1\n";
  const std::vector<std::pair<std::string, std::string>> cases = {
      {"optstate-moves 2\n\ta\tb\nend 1\n", "line 1"},
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
  std::filesystem::remove(dir_ + "/MOVES");
  std::filesystem::create_directory(dir_ + "/MOVES");
  EXPECT_THAT(ReadMoveNotes(dir_).status().message(), HasSubstr("not a regular file"));
}

}  // namespace
}  // namespace optstate
