#include "server/durability/move_notes_file.h"

#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "absl/strings/strip.h"
#include "server/durability/crc32c.h"
#include "server/durability/file_util.h"

namespace optstate {
namespace {

constexpr char kHeader[] = "optstate-moves 2";
constexpr char kHeaderWithoutCrc[] = "optstate-moves 1";  // Read, not written.
// A tenant (128), a name and a destination (512 each), two tabs and a
// newline, for each of the notes a store keeps, and the first and last line.
constexpr uint64_t kMaxMoveNotesFileBytes = StateStore::kMaxMoveNotes * (128 + 512 + 512 + 3) + 64;

// Printable ASCII without spaces (what tenants, names and destinations are).
bool IsWord(absl::string_view text) {
  for (char c : text) {
    if (c <= ' ' || c > '~') return false;
  }
  return true;
}

}  // namespace

absl::Status WriteMoveNotes(const std::string& state_dir,
                            const std::vector<StateStore::MoveNote>& notes) {
  const std::string path = absl::StrCat(state_dir, "/", kMoveNotesFileName);
  if (notes.empty()) {
    if (unlink(path.c_str()) != 0 && errno != ENOENT) {
      return absl::InternalError(absl::StrCat("cannot remove ", path, ": ", std::strerror(errno)));
    }
    return SyncDirectory(state_dir);
  }
  std::string text = absl::StrCat(kHeader, "\n");
  for (const StateStore::MoveNote& note : notes) {
    absl::StrAppend(&text, note.key.tenant, "\t", note.key.name, "\t", note.moved_to, "\n");
  }
  const uint32_t crc = Crc32cExtend(0, text.data(), text.size());
  absl::StrAppend(&text, "end ", notes.size(), " crc32c ", absl::Hex(crc, absl::kZeroPad8), "\n");
  const std::string temporary = path + ".new";
  absl::StatusOr<ScopedFd> fd = CreateFile(temporary);
  if (!fd.ok()) return fd.status();
  if (absl::Status s = WriteAll(fd->get(), {iovec{text.data(), text.size()}}, temporary); !s.ok()) {
    return s;
  }
  if (absl::Status s = SyncFile(fd->get(), temporary); !s.ok()) return s;
  if (absl::Status s = Rename(temporary, path); !s.ok()) return s;
  return SyncDirectory(state_dir);
}

absl::StatusOr<std::vector<StateStore::MoveNote>> ReadMoveNotes(const std::string& state_dir) {
  const std::string path = absl::StrCat(state_dir, "/", kMoveNotesFileName);
  std::vector<StateStore::MoveNote> notes;
  struct stat file;
  if (lstat(path.c_str(), &file) != 0) {
    if (errno == ENOENT) return notes;
    return absl::InternalError(absl::StrCat("cannot read ", path, ": ", std::strerror(errno)));
  }
  // Only what WriteMoveNotes writes: a regular file, at most the store's
  // notes' worth (a link to /dev/zero or a FIFO would never end).
  if (!S_ISREG(file.st_mode)) {
    return absl::DataLossError(
        absl::StrCat(path, " is not a regular file; its notes of moves are not used"));
  }
  if (static_cast<uint64_t>(file.st_size) > kMaxMoveNotesFileBytes) {
    return absl::DataLossError(absl::StrCat(path, " holds ", file.st_size, " bytes, more than ",
                                            kMaxMoveNotesFileBytes,
                                            " notes of moves take; its notes are not used"));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::InternalError(absl::StrCat("cannot read ", path));
  std::stringstream stream;
  stream << in.rdbuf();
  const std::string text = stream.str();  // What `lines` views.
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  auto refuse = [&](size_t line, absl::string_view why) {
    return absl::DataLossError(
        absl::StrCat(path, " line ", line, ": ", why, "; its notes of moves are not used"));
  };
  const bool with_crc = !lines.empty() && lines[0] == kHeader;
  if (!with_crc && (lines.empty() || lines[0] != kHeaderWithoutCrc)) {
    return refuse(1, "not a file of moves");
  }
  // The last line is empty (the file ends in a newline); the one before it
  // counts the notes (and holds the CRC32C of every byte before it).
  if (lines.size() < 3 || !lines.back().empty()) return refuse(lines.size(), "cut short");
  absl::string_view end = lines[lines.size() - 2];
  absl::string_view crc_text;
  if (with_crc) {
    std::vector<absl::string_view> parts = absl::StrSplit(end, absl::MaxSplits(" crc32c ", 1));
    if (parts.size() != 2) {
      return refuse(lines.size() - 1, "cut short (its count of notes and CRC32C are missing)");
    }
    end = parts[0];
    crc_text = parts[1];
  }
  uint64_t count = 0;
  if (!absl::ConsumePrefix(&end, "end ") || !absl::SimpleAtoi(end, &count) ||
      count != lines.size() - 3) {
    return refuse(lines.size() - 1, "cut short (its count of notes is missing or wrong)");
  }
  if (with_crc) {
    const size_t covered = static_cast<size_t>(lines[lines.size() - 2].data() - text.data());
    uint32_t crc = 0;
    if (crc_text.size() != 8 || !absl::SimpleHexAtoi(crc_text, &crc) ||
        crc != Crc32cExtend(0, text.data(), covered)) {
      return refuse(lines.size() - 1,
                    "its CRC32C does not match its notes (a damaged file, or one not written by "
                    "optstated)");
    }
  }
  absl::flat_hash_set<GroupKey> seen;
  for (size_t i = 1; i + 2 < lines.size(); ++i) {
    std::vector<absl::string_view> fields = absl::StrSplit(lines[i], '\t');
    if (fields.size() != 3 || fields[0].size() > 128 || !IsWord(fields[0]) || fields[1].empty() ||
        fields[1].size() > 512 || !IsWord(fields[1]) || fields[2].empty() ||
        fields[2].size() > 512 || !IsWord(fields[2])) {
      return refuse(i + 1,
                    "not TENANT<tab>NAME<tab>MOVED_TO (128, 512 and 512 characters at most)");
    }
    GroupKey key{std::string(fields[0]), std::string(fields[1])};
    if (!seen.insert(key).second) return refuse(i + 1, "a group named a second time");
    notes.push_back(StateStore::MoveNote{std::move(key), std::string(fields[2])});
  }
  return notes;
}

}  // namespace optstate
