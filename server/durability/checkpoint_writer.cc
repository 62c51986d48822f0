// The checkpoint writer. Why a crash at any moment leaves either the new
// checkpoint whole or the previous one (LevelDB's way; docs/durability.md):
//
// 1. Everything is written into a temporary directory ckpt-<N>.tmp, which a
//    restore never reads (it reads only names ckpt-<16 digits>). A stale
//    temporary directory of an earlier crash is removed first.
// 2. Each group's data file is written page by page: a run of pages is
//    copied under their page mutexes, one page at a time (CapturePages), into
//    one bounded buffer (max(buffer_bytes, one page)), then written with
//    writev while steps go on. The CRC32C is computed over the bytes as they
//    are written. A page's record holds the step it was copied at, so the
//    file is consistent per page.
// 3. Each data file is fsynced before the manifest is written: the manifest
//    never names bytes that are not yet on disk.
// 4. The manifest (every file's name, size and CRC32C, the format version,
//    the page size, its own CRC32C in its last line) is written to
//    MANIFEST.tmp, fsynced, renamed to MANIFEST, and the temporary directory
//    is fsynced, so the name MANIFEST is durable.
// 5. The temporary directory is renamed to ckpt-<N> (rename is atomic: a
//    crash leaves one name or the other) and state_dir is fsynced, making
//    the new name durable. Only now is the checkpoint complete, and only now
//    does Write return it.
// 6. Older checkpoints are removed (Prune) only after step 5, the oldest
//    first, so the previous complete checkpoint exists until the new one is
//    durable. Each is first renamed to a temporary name (atomic), then its
//    files are removed, so a crash part-way through a removal leaves a
//    temporary directory (removed by the next Prune), never a damaged
//    checkpoint under a name a restore reads.
// 7. A restore verifies every size and checksum before it installs
//    anything (checkpoint_reader.cc), so even a checkpoint damaged after it
//    was written (a flipped byte, a truncated or deleted file) is refused,
//    never half-loaded.
//
// The test-only environment variable OPTSTATE_TEST_CHECKPOINT_PAUSE="N:point"
// makes the writer of checkpoint N stop for good at the named point (after
// writing the point's name to OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE), so tests
// can kill the daemon there. Points: dir_created, run:<group>:<k> (after the
// k-th run of pages of a group is written), data_synced:<group>,
// manifest_written, manifest_synced, manifest_renamed, dir_renamed,
// dir_synced, and in Prune: pruned:<k> (after removing the k-th directory).
#include "server/durability/checkpoint_writer.h"

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <thread>

#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/durability/crc32c.h"
#include "server/durability/file_util.h"
#include "server/durability/page_capture.h"

namespace optstate {
namespace {

void TestPause(uint64_t sequence, const std::string& point) {
  static const char* const wanted = std::getenv("OPTSTATE_TEST_CHECKPOINT_PAUSE");
  if (wanted == nullptr || absl::StrCat(sequence, ":", point) != wanted) return;
  if (const char* file = std::getenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE")) {
    const int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd >= 0) {
      (void)!write(fd, point.data(), point.size());
      close(fd);
    }
  }
  Log(LogLevel::kWarning, "checkpoint writer paused at ", point, " for a test");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string state_dir, uint64_t page_elements,
                                   StepBackend* backend, uint64_t buffer_bytes)
    : state_dir_(std::move(state_dir)),
      page_elements_(page_elements),
      backend_(backend),
      buffer_bytes_(buffer_bytes) {}

absl::Status CheckpointWriter::WriteGroup(uint64_t sequence, size_t index,
                                          const CheckpointTarget& target, const std::string& path,
                                          ManifestGroup* entry) {
  Group& group = *target.group;
  absl::StatusOr<ScopedFd> fd = CreateFile(path);
  if (!fd.ok()) return fd.status();
  const uint64_t per_run = PagesPerCapture(group, buffer_bytes_);
  CapturedPages pages;
  uint32_t crc = 0;
  uint64_t bytes = 0;
  entry->min_step = UINT64_MAX;
  entry->max_step = 0;
  std::vector<uint64_t> headers;
  std::vector<iovec> pieces;
  uint64_t run = 0;
  for (uint64_t first = 0; first < group.num_pages(); first += per_run, ++run) {
    const uint64_t end = std::min(group.num_pages(), first + per_run);
    absl::Status captured = CapturePages(*backend_, group, first, end, &pages);
    if (absl::IsNotFound(captured)) {
      return absl::AbortedError(absl::StrCat("group '", group.key().name,
                                             "' was deleted while it was checkpointed; retry"));
    }
    if (!captured.ok()) return captured;
    headers.assign(2 * (end - first), 0);
    pieces.clear();
    for (uint64_t p = first; p < end; ++p) {
      const uint64_t step = pages.steps[p - first];
      if (target.exact_step && step != *target.exact_step) {
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", group.key().name, "' page ", p, " was at step ", step,
            " when the checkpoint copied it, not ", *target.exact_step, "; send step ",
            *target.exact_step + 1, " only after Checkpoint{wait_for_step: ", *target.exact_step,
            "} has returned. Nothing was written"));
      }
      entry->min_step = std::min(entry->min_step, step);
      entry->max_step = std::max(entry->max_step, step);
      headers[2 * (p - first)] = step;
      headers[2 * (p - first) + 1] = pages.has_values[p - first] ? kPageHasValues : 0;
      const uint64_t at = group.PageBegin(p) - pages.begin;
      const size_t n = (group.PageEnd(p) - group.PageBegin(p)) * sizeof(float);
      pieces.push_back({&headers[2 * (p - first)], kPageRecordHeaderBytes});
      pieces.push_back({pages.params.data() + at, n});
      pieces.push_back({pages.exp_avg.data() + at, n});
      pieces.push_back({pages.exp_avg_sq.data() + at, n});
    }
    for (const iovec& piece : pieces) {
      crc = Crc32cExtend(crc, piece.iov_base, piece.iov_len);
      bytes += piece.iov_len;
    }
    if (absl::Status s = WriteAll(fd->get(), pieces, path); !s.ok()) return s;
    TestPause(sequence, absl::StrCat("run:", index, ":", run));
  }
  if (absl::Status s = SyncFile(fd->get(), path); !s.ok()) return s;
  TestPause(sequence, absl::StrCat("data_synced:", index));
  entry->key = group.key();
  entry->config = group.config();
  entry->bytes = bytes;
  entry->crc32c = crc;
  return absl::OkStatus();
}

absl::StatusOr<WrittenCheckpoint> CheckpointWriter::Write(
    uint64_t sequence, uint64_t step, const std::vector<CheckpointTarget>& targets) {
  WrittenCheckpoint written;
  written.id = CheckpointDirName(sequence);
  const std::string temporary = absl::StrCat(state_dir_, "/", written.id, kTemporarySuffix);
  const std::string final_dir = absl::StrCat(state_dir_, "/", written.id);
  auto fail = [&](absl::Status status) {
    (void)RemoveTree(temporary);
    return status;
  };
  // Step 1.
  if (absl::Status s = RemoveTree(temporary); !s.ok()) return s;
  if (absl::Status s = MakeDirectory(temporary); !s.ok()) return s;
  TestPause(sequence, "dir_created");
  // Steps 2 and 3.
  Manifest& manifest = written.manifest;
  manifest.id = written.id;
  manifest.step = step;
  manifest.page_elements = page_elements_;
  for (size_t i = 0; i < targets.size(); ++i) {
    ManifestGroup entry;
    entry.file = absl::StrCat("group-", i, ".data");
    if (absl::Status s =
            WriteGroup(sequence, i, targets[i], absl::StrCat(temporary, "/", entry.file), &entry);
        !s.ok()) {
      return fail(s);
    }
    written.bytes += entry.bytes;
    manifest.groups.push_back(std::move(entry));
  }
  // Step 4.
  manifest.created_unix_micros = absl::ToUnixMicros(absl::Now());
  const std::string text = EncodeManifest(manifest);
  const std::string manifest_temporary = absl::StrCat(temporary, "/", kManifestName, ".tmp");
  {
    absl::StatusOr<ScopedFd> fd = CreateFile(manifest_temporary);
    if (!fd.ok()) return fail(fd.status());
    if (absl::Status s = WriteAll(fd->get(), {{const_cast<char*>(text.data()), text.size()}},
                                  manifest_temporary);
        !s.ok()) {
      return fail(s);
    }
    TestPause(sequence, "manifest_written");
    if (absl::Status s = SyncFile(fd->get(), manifest_temporary); !s.ok()) return fail(s);
  }
  TestPause(sequence, "manifest_synced");
  if (absl::Status s = Rename(manifest_temporary, absl::StrCat(temporary, "/", kManifestName));
      !s.ok()) {
    return fail(s);
  }
  TestPause(sequence, "manifest_renamed");
  if (absl::Status s = SyncDirectory(temporary); !s.ok()) return fail(s);
  written.bytes += text.size();
  // Step 5.
  if (absl::Status s = Rename(temporary, final_dir); !s.ok()) return fail(s);
  TestPause(sequence, "dir_renamed");
  if (absl::Status s = SyncDirectory(state_dir_); !s.ok()) return s;
  TestPause(sequence, "dir_synced");
  return written;
}

absl::Status CheckpointWriter::Prune(int keep, const std::string& except) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(state_dir_);
  if (!names.ok()) return names.status();
  std::vector<uint64_t> complete;
  std::vector<std::string> temporary;
  for (const std::string& name : *names) {
    if (std::optional<uint64_t> seq = ParseCheckpointDirName(name)) {
      complete.push_back(*seq);
    } else if (name.size() > 4 && name.substr(name.size() - 4) == kTemporarySuffix &&
               ParseCheckpointDirName(name.substr(0, name.size() - 4)) && name != except) {
      temporary.push_back(name);
    }
  }
  std::sort(complete.begin(), complete.end());
  const size_t remove = complete.size() > static_cast<size_t>(std::max(1, keep))
                            ? complete.size() - std::max(1, keep)
                            : 0;
  int removed = 0;
  for (size_t i = 0; i < remove; ++i) {
    const std::string dir = absl::StrCat(state_dir_, "/", CheckpointDirName(complete[i]));
    if (absl::Status s = Rename(dir, dir + kTemporarySuffix); !s.ok()) return s;
    if (absl::Status s = RemoveTree(dir + kTemporarySuffix); !s.ok()) return s;
    TestPause(complete.back(), absl::StrCat("pruned:", removed++));
  }
  for (const std::string& name : temporary) {
    if (absl::Status s = RemoveTree(absl::StrCat(state_dir_, "/", name)); !s.ok()) return s;
  }
  return SyncDirectory(state_dir_);
}

}  // namespace optstate
