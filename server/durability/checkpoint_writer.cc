// The checkpoint writer. Why a crash at any moment leaves either the new
// checkpoint whole or the previous one (LevelDB's way; docs/durability.md):
//
// 1. Everything is written into a temporary directory ckpt-<N>.tmp, which a
//    restore never reads (it reads only names ckpt-<16 digits or more>). A stale
//    temporary directory of an earlier crash is removed first.
// 2. Each group's data file is written page by page: a run of pages is
//    copied under their page mutexes, one page at a time (CapturePages), into
//    a bounded buffer (max(buffer_bytes, one page)), checksummed (CRC32C over
//    the bytes in file order), then written with writev while steps go on.
//    Two such buffers make a pipeline: run k is captured and checksummed on
//    the calling thread while a writer thread writes run k - 1, and asks the
//    kernel to start putting it on disk (sync_file_range, advice only). A
//    page's record holds the step it was copied at, so the file is
//    consistent per page.
// 3. Each data file is fsynced before the manifest is written: the manifest
//    never names bytes that are not yet on disk. Groups deleted meanwhile
//    are then left out, and deletes wait from there until step 5's rename.
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
//    temporary directory (removed by the next Prune, or by RemoveUnfinished
//    at the next start), never a damaged checkpoint under a name a restore
//    reads.
// 7. A restore verifies every size and checksum before it installs
//    anything (checkpoint_reader.cc), so even a checkpoint damaged after it
//    was written (a flipped byte, a truncated or deleted file) is refused,
//    never half-loaded.
//
// The test-only environment variable OPTSTATE_TEST_CHECKPOINT_PAUSE="N:point"
// makes the writer of checkpoint N stop for good at the named point (after
// writing the point's name to OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE), so tests
// can kill the daemon there; with OPTSTATE_TEST_CHECKPOINT_RESUME set too, it
// goes on once that file is removed, so tests can act in the middle of it. Points: dir_created,
// run:<group>:<k> (after the k-th run of pages of a group is written), data_synced:<group>,
// manifest_written, manifest_synced, manifest_renamed, dir_renamed,
// dir_synced, and in Prune: pruned:<k> (after removing the k-th directory).
#include "server/durability/checkpoint_writer.h"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <system_error>
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
  const char* file = std::getenv("OPTSTATE_TEST_CHECKPOINT_PAUSE_FILE");
  const bool resumes = std::getenv("OPTSTATE_TEST_CHECKPOINT_RESUME") != nullptr;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    if (resumes && file != nullptr && access(file, F_OK) != 0) return;
  }
}

// ckpt-<16 digits>.tmp: a checkpoint being written or removed.
bool IsTemporaryName(const std::string& name) {
  const size_t n = sizeof(kTemporarySuffix) - 1;
  return name.size() > n && name.compare(name.size() - n, n, kTemporarySuffix) == 0 &&
         ParseCheckpointDirName(name.substr(0, name.size() - n)).has_value();
}

}  // namespace

CheckpointWriter::CheckpointWriter(std::string state_dir, uint64_t page_elements,
                                   StepBackend* backend, uint64_t buffer_bytes,
                                   absl::Mutex* commit_gate)
    : state_dir_(std::move(state_dir)),
      page_elements_(page_elements),
      backend_(backend),
      buffer_bytes_(buffer_bytes),
      commit_gate_(commit_gate) {}

namespace {

// `mu` (may be null) held exclusively until Release() or the end of scope.
class GateHold {
 public:
  explicit GateHold(absl::Mutex* mu) : mu_(mu) {
    if (mu_ != nullptr) mu_->Lock();
  }
  GateHold(const GateHold&) = delete;
  GateHold& operator=(const GateHold&) = delete;
  ~GateHold() { Release(); }
  void Release() {
    if (mu_ != nullptr) mu_->Unlock();
    mu_ = nullptr;
  }

 private:
  absl::Mutex* mu_;
};

// One run of captured pages and the iovecs that write its records.
struct Run {
  CapturedPages pages;
  std::vector<uint64_t> headers;
  std::vector<iovec> pieces;
  uint64_t offset = 0, bytes = 0;
};

// Starts the disk writing [offset, offset + bytes) of `fd` now, without
// waiting, so that the fsync at the end finds little left to do. Advice
// only: durability still comes from that fsync, which reports any error.
void StartWriteback(int fd, uint64_t offset, uint64_t bytes) {
#if defined(__linux__)
  (void)sync_file_range(fd, static_cast<off64_t>(offset), static_cast<off64_t>(bytes),
                        SYNC_FILE_RANGE_WRITE);
#else
  (void)fd;
  (void)offset;
  (void)bytes;
#endif
}

}  // namespace

absl::Status CheckpointWriter::WriteGroup(uint64_t sequence, size_t index,
                                          const CheckpointTarget& target, const std::string& path,
                                          ManifestGroup* entry, WriteTimes* times) {
  Group& group = *target.group;
  absl::StatusOr<ScopedFd> fd = CreateFile(path);
  if (!fd.ok()) return fd.status();
  const uint64_t per_run = PagesPerCapture(group, buffer_bytes_);
  entry->min_step = UINT64_MAX;
  entry->max_step = 0;

  // Step 2's pipeline: this thread captures and checksums run k into buffer
  // k % 2 while a writer thread writes run k - 1 from the other buffer; a
  // buffer is refilled only after the run in it has been written.
  Run buffers[2];
  absl::Mutex mu;
  bool busy[2] = {false, false};  // Handed to the writer, not yet written.
  uint64_t handed = 0;            // Runs handed to the writer so far.
  bool no_more = false;           // Nothing more will be handed over.
  absl::Status write_error;       // The writer's first error; it then stops.
  absl::Duration write_time;
  auto write_loop = [&] {
    for (uint64_t k = 0;; ++k) {
      {
        absl::MutexLock lock(&mu);
        auto due = [&] { return handed > k || no_more; };
        mu.Await(absl::Condition(&due));
        if (handed <= k) return;
      }
      Run& run = buffers[k % 2];
      const absl::Time started = absl::Now();
      absl::Status s = WriteAll(fd->get(), run.pieces, path);
      if (s.ok()) StartWriteback(fd->get(), run.offset, run.bytes);
      write_time += absl::Now() - started;
      if (s.ok()) TestPause(sequence, absl::StrCat("run:", index, ":", k));
      absl::MutexLock lock(&mu);
      busy[k % 2] = false;
      if (!s.ok()) {
        write_error = s;
        return;
      }
    }
  };
  // A group of one run (most small groups) has nothing to overlap: its run
  // is written on this thread by stop_writer, and no thread is started.
  std::thread writer;
  if (group.num_pages() > per_run) {
    try {
      writer = std::thread(write_loop);
    } catch (const std::system_error& e) {
      return absl::ResourceExhaustedError(absl::StrCat(
          "no thread could be started to write checkpoint file ", path, ": ", e.what()));
    }
  }
  // Lets the writer write what was handed over, then stops it.
  auto stop_writer = [&] {
    {
      absl::MutexLock lock(&mu);
      no_more = true;
    }
    if (writer.joinable()) {
      writer.join();
    } else {
      write_loop();
    }
    times->write += write_time;
    return write_error;
  };

  uint32_t crc = 0;
  uint64_t bytes = 0;
  uint64_t k = 0;
  for (uint64_t first = 0; first < group.num_pages(); first += per_run, ++k) {
    Run& run = buffers[k % 2];
    {
      absl::MutexLock lock(&mu);
      auto free = [&] { return !busy[k % 2] || !write_error.ok(); };
      mu.Await(absl::Condition(&free));
      if (!write_error.ok()) break;
    }
    const uint64_t end = std::min(group.num_pages(), first + per_run);
    absl::Time started = absl::Now();
    absl::Status captured = CapturePages(*backend_, group, first, end, &run.pages);
    times->capture += absl::Now() - started;
    if (absl::IsNotFound(captured)) {
      (void)stop_writer();
      return absl::NotFoundError(
          absl::StrCat("group '", group.key().name, "' was deleted while it was checkpointed"));
    }
    if (!captured.ok()) {
      (void)stop_writer();
      return captured;
    }
    CapturedPages& pages = run.pages;
    run.headers.assign(2 * (end - first), 0);
    run.pieces.clear();
    for (uint64_t p = first; p < end; ++p) {
      const uint64_t step = pages.steps[p - first];
      if (target.exact_step && step > *target.exact_step) {
        (void)stop_writer();
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", group.key().name, "' page ", p, " was at step ", step,
            " when the checkpoint copied it, not ", *target.exact_step, "; send step ",
            *target.exact_step + 1, " only after Checkpoint{wait_for_step: ", *target.exact_step,
            "} has returned. Nothing was written"));
      }
      if (target.exact_step && step < *target.exact_step) {
        // It reached the step, then went back: its whole state was replaced.
        (void)stop_writer();
        return absl::FailedPreconditionError(absl::StrCat(
            "group '", group.key().name, "' page ", p, " was at step ", step,
            " when the checkpoint copied it, not ", *target.exact_step,
            ": an ImportState or RewindJob replaced the group's state after it reached step ",
            *target.exact_step,
            ". Nothing was written; call Checkpoint again once the group "
            "is at the step to keep"));
      }
      entry->min_step = std::min(entry->min_step, step);
      entry->max_step = std::max(entry->max_step, step);
      run.headers[2 * (p - first)] = step;
      run.headers[2 * (p - first) + 1] = pages.has_values[p - first] ? kPageHasValues : 0;
      const uint64_t at = group.PageBegin(p) - pages.begin;
      const size_t n = (group.PageEnd(p) - group.PageBegin(p)) * sizeof(float);
      run.pieces.push_back({&run.headers[2 * (p - first)], kPageRecordHeaderBytes});
      run.pieces.push_back({pages.params.data() + at, n});
      run.pieces.push_back({pages.exp_avg.data() + at, n});
      run.pieces.push_back({pages.exp_avg_sq.data() + at, n});
      if (!pages.max_exp_avg_sq.empty()) {
        run.pieces.push_back({pages.max_exp_avg_sq.data() + at, n});
      }
    }
    started = absl::Now();
    run.offset = bytes;
    for (const iovec& piece : run.pieces) {
      crc = Crc32cExtend(crc, piece.iov_base, piece.iov_len);
      bytes += piece.iov_len;
    }
    run.bytes = bytes - run.offset;
    times->checksum += absl::Now() - started;
    absl::MutexLock lock(&mu);
    busy[k % 2] = true;
    ++handed;
  }
  if (absl::Status s = stop_writer(); !s.ok()) return s;
  const absl::Time started = absl::Now();
  if (absl::Status s = SyncFile(fd->get(), path); !s.ok()) return s;
  times->sync += absl::Now() - started;
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
  std::vector<const CheckpointTarget*> written_targets;  // Of manifest.groups, in order.
  for (size_t i = 0; i < targets.size(); ++i) {
    ManifestGroup entry;
    entry.file = absl::StrCat("group-", i, ".data");
    const std::string path = absl::StrCat(temporary, "/", entry.file);
    if (absl::Status s = WriteGroup(sequence, i, targets[i], path, &entry, &written.times);
        !s.ok()) {
      if (absl::IsNotFound(s) && !targets[i].named) {
        // Deleted meanwhile: the checkpoint holds the state as if the
        // delete came first.
        (void)unlink(path.c_str());
        continue;
      }
      if (absl::IsNotFound(s)) {
        s = absl::NotFoundError(absl::StrCat(s.message(), "; nothing was written"));
      }
      return fail(s);
    }
    written.bytes += entry.bytes;
    // The last step's record, when the capture holds that very step whole.
    if (std::optional<SteppedWith> last = targets[i].group->last_step().Get();
        last.has_value() && entry.min_step == entry.max_step && last->step == entry.max_step) {
      entry.last_step = *last;
    }
    manifest.groups.push_back(std::move(entry));
    written_targets.push_back(&targets[i]);
  }
  // A group deleted after its pages were captured, while the others were
  // written: the delete was answered before this checkpoint, so it holds the
  // state as if the delete came first. From here until the directory is
  // renamed into place deletes wait (the gate), so one answered later comes
  // after the checkpoint, as a step then would.
  GateHold gate(commit_gate_);
  for (size_t j = manifest.groups.size(); j-- > 0;) {
    if (!written_targets[j]->group->deleted()) continue;
    if (written_targets[j]->named) {
      return fail(absl::NotFoundError(
          absl::StrCat("group '", manifest.groups[j].key.name,
                       "' was deleted while it was checkpointed; nothing was written")));
    }
    (void)unlink(absl::StrCat(temporary, "/", manifest.groups[j].file).c_str());
    written.bytes -= manifest.groups[j].bytes;
    manifest.groups.erase(manifest.groups.begin() + j);
    written_targets.erase(written_targets.begin() + j);
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
  gate.Release();
  TestPause(sequence, "dir_renamed");
  if (absl::Status s = SyncDirectory(state_dir_); !s.ok()) return s;
  TestPause(sequence, "dir_synced");
  return written;
}

absl::Status CheckpointWriter::Prune(int keep, const std::string& except,
                                     const std::vector<uint64_t>& refused) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(state_dir_);
  if (!names.ok()) return names.status();
  std::vector<uint64_t> complete;
  std::vector<std::string> temporary;
  for (const std::string& name : *names) {
    if (std::optional<uint64_t> seq = ParseCheckpointDirName(name)) {
      if (std::find(refused.begin(), refused.end(), *seq) == refused.end()) {
        complete.push_back(*seq);
      }
    } else if (IsTemporaryName(name) && name != except) {
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

absl::StatusOr<std::vector<std::string>> CheckpointWriter::RemoveUnfinished() {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(state_dir_);
  if (!names.ok()) return names.status();
  std::vector<std::string> removed;
  for (const std::string& name : *names) {
    if (!IsTemporaryName(name)) continue;
    if (absl::Status s = RemoveTree(absl::StrCat(state_dir_, "/", name)); !s.ok()) return s;
    removed.push_back(name);
  }
  if (removed.empty()) return removed;
  if (absl::Status s = SyncDirectory(state_dir_); !s.ok()) return s;
  std::sort(removed.begin(), removed.end());
  return removed;
}

}  // namespace optstate
