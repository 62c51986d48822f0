// Restore: verify everything, then install everything, or nothing.
//
// The test-only environment variable OPTSTATE_TEST_RESTORE_PAUSE_FILE makes a
// restore that finds a checkpoint stop for good before reading it (after
// creating that file), so tests can signal a daemon that is still starting.
#include "server/durability/checkpoint_reader.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/time/clock.h"
#include "server/base/log.h"
#include "server/durability/crc32c.h"
#include "server/durability/file_util.h"

namespace optstate {
namespace {

void TestPauseBeforeRestore() {
  const char* file = std::getenv("OPTSTATE_TEST_RESTORE_PAUSE_FILE");
  if (file == nullptr) return;
  const int fd = open(file, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd >= 0) close(fd);
  Log(LogLevel::kWarning, "restore paused for a test");
  for (;;) std::this_thread::sleep_for(std::chrono::seconds(1));
}

// The first of `n` squares (exp_avg_sq, max_exp_avg_sq) that no step
// leaves, or n: one below zero (a step adds squares to a non-negative
// value). Nothing else is refused: at float32's edges a step does leave
// params and exp_avg infinite (weight_decay * lr near the largest float) and
// then NaN, and a square NaN (beta2 = 0 times an infinite one), which a
// restore must take as the step left it.
uint64_t FirstSquareBelowZero(const float* values, uint64_t n) {
  for (uint64_t i = 0; i < n; ++i) {
    if (values[i] < 0) return i;
  }
  return n;
}

constexpr const char* kTensorNames[] = {"params", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};

// Where a restore's time went, summed over the threads that read.
struct ReadTimes {
  absl::Mutex mu;
  absl::Duration read ABSL_GUARDED_BY(mu);      // pread into the group's arrays.
  absl::Duration checksum ABSL_GUARDED_BY(mu);  // CRC32C of what was read.
};

absl::Status ReadGroupFile(const std::string& path, const ManifestGroup& entry, Group& group,
                           ThreadPool* pool, ReadTimes* times) {
  // Opened first: a FIFO, a directory or a device there is "not a regular
  // file" (never opened in a way that blocks), not a size that is wrong.
  absl::StatusOr<ScopedFd> fd = OpenForReading(path);
  if (absl::IsNotFound(fd.status())) {
    return absl::DataLossError(absl::StrCat(path, " is missing (the manifest names it)"));
  }
  if (!fd.ok()) return fd.status();
  struct stat file;
  if (fstat(fd->get(), &file) != 0) {
    return absl::InternalError(absl::StrCat("cannot stat ", path, ": ", std::strerror(errno)));
  }
  const uint64_t size = static_cast<uint64_t>(file.st_size);
  const uint64_t expected = DataFileBytes(entry.config.num_elements, group.page_elements(),
                                          entry.config.hyperparameters.amsgrad);
  if (entry.bytes != expected) {
    return absl::DataLossError(absl::StrCat("the manifest gives ", path, " ", entry.bytes,
                                            " bytes, but a group of ", entry.config.num_elements,
                                            " elements takes ", expected));
  }
  if (size != entry.bytes) {
    return absl::DataLossError(absl::StrCat(path, " is ", size, " bytes, the manifest says ",
                                            entry.bytes, size < entry.bytes ? " (truncated)" : ""));
  }
  // Pieces of whole pages read and checked at once, straight into the
  // group's arrays; their CRCs are combined in order. Every page before the
  // last is full, so page p's record starts at p * (16 + 12 * page_elements)
  // (16 per element with amsgrad's max_exp_avg_sq).
  const uint64_t pages = group.num_pages();
  const uint64_t pieces = std::max<uint64_t>(
      1, std::min<uint64_t>(pool == nullptr ? 1 : static_cast<uint64_t>(pool->size()), pages));
  const uint64_t pages_per_piece = (pages + pieces - 1) / pieces;
  const uint64_t record_bytes =
      kPageRecordHeaderBytes + group.page_elements() * StateBytesPerElement(group.config());
  std::vector<uint32_t> crcs(pieces, 0);
  std::vector<uint64_t> lengths(pieces, 0);
  std::vector<absl::Status> errors(pieces);
  // Squares no step leaves, found while the piece is in cache; reported after
  // the checksum (a flipped byte is damage first).
  std::vector<absl::Status> bad_values(pieces);
  std::vector<uint64_t> headers(2 * pages);
  auto read_piece = [&](size_t i) {
    const uint64_t first = i * pages_per_piece;
    const uint64_t end = std::min(pages, first + pages_per_piece);
    uint64_t offset = first * record_bytes;
    uint32_t crc = 0;
    absl::Duration read_time, checksum_time;
    for (uint64_t p = first; p < end && errors[i].ok(); ++p) {
      uint64_t* header = &headers[2 * p];
      errors[i] = PreadExactly(fd->get(), header, kPageRecordHeaderBytes, offset, path);
      if (!errors[i].ok()) break;
      crc = Crc32cExtend(crc, header, kPageRecordHeaderBytes);
      offset += kPageRecordHeaderBytes;
      const uint64_t begin = group.PageBegin(p);
      const uint64_t count = group.PageEnd(p) - begin;
      const size_t n = count * sizeof(float);
      float* const targets[] = {group.params(), group.exp_avg(), group.exp_avg_sq(),
                                group.max_exp_avg_sq()};
      for (int t = 0; t < 4; ++t) {
        float* const target = targets[t];
        if (target == nullptr) break;  // Only amsgrad groups have the fourth.
        const absl::Time t0 = absl::Now();
        errors[i] = PreadExactly(fd->get(), target + begin, n, offset, path);
        const absl::Time t1 = absl::Now();
        read_time += t1 - t0;
        if (!errors[i].ok()) break;
        crc = Crc32cExtend(crc, target + begin, n);
        checksum_time += absl::Now() - t1;
        offset += n;
        if (t < 2 || !bad_values[i].ok()) continue;
        if (const uint64_t at = FirstSquareBelowZero(target + begin, count); at < count) {
          bad_values[i] = absl::DataLossError(
              absl::StrCat(path, " holds ", target[begin + at], " at element ", begin + at, " of ",
                           kTensorNames[t], ", which no step leaves (a square is never below 0)"));
        }
      }
    }
    absl::MutexLock lock(&times->mu);
    times->read += read_time;
    times->checksum += checksum_time;
    crcs[i] = crc;
    lengths[i] = offset - first * record_bytes;
  };
  if (pool == nullptr || pieces == 1) {
    read_piece(0);
  } else {
    pool->ParallelFor(pieces, read_piece);
  }
  for (const absl::Status& e : errors) {
    if (!e.ok()) return e;
  }
  uint32_t crc = crcs[0];
  for (uint64_t i = 1; i < pieces; ++i) crc = Crc32cCombine(crc, crcs[i], lengths[i]);
  if (crc != entry.crc32c) {
    // In hex, as the manifest writes them.
    return absl::DataLossError(absl::StrCat(path, " fails its checksum (CRC32C ",
                                            absl::Hex(crc, absl::kZeroPad8), ", the manifest says ",
                                            absl::Hex(entry.crc32c, absl::kZeroPad8), ")"));
  }
  for (const absl::Status& e : bad_values) {
    if (!e.ok()) return e;
  }
  for (uint64_t p = 0; p < pages; ++p) {
    const uint64_t step = headers[2 * p];
    const uint64_t flags = headers[2 * p + 1];
    // A stepped page has values (a step needs them); no other flag exists.
    if ((flags & ~kPageHasValues) != 0 || (step > 0 && (flags & kPageHasValues) == 0)) {
      return absl::DataLossError(absl::StrCat(path, ": page ", p, " is at step ", step,
                                              " with flags ", flags,
                                              ", which no checkpoint writes (a stepped page has "
                                              "values; the only flag is 1, values)"));
    }
    absl::MutexLock lock(&group.page_mutex(p));
    group.set_page_step(p, step);
    if (flags & kPageHasValues) group.mark_page_has_values(p);
  }
  if (group.MinStep() != entry.min_step || group.MaxStep() != entry.max_step) {
    return absl::DataLossError(absl::StrCat(path, " holds steps ", group.MinStep(), "..",
                                            group.MaxStep(), ", the manifest says ", entry.min_step,
                                            "..", entry.max_step));
  }
  return absl::OkStatus();
}

// Whether a manifest of `size` bytes can be what its header says: at most
// kManifestLineBytes for each of the groups its "groups N" line counts (a
// line holds a name of at most 512 characters, a tenant and numbers), read
// from its first bytes. A grown file (zeros a crash left, gigabytes) is
// refused before it is read into memory.
constexpr uint64_t kManifestLineBytes = 4096;
constexpr uint64_t kManifestHeaderBytes = 4096;

absl::Status CheckManifestSize(int fd, uint64_t size, const std::string& path) {
  if (size <= 2 * kManifestHeaderBytes) return absl::OkStatus();
  std::string head(kManifestHeaderBytes, '\0');
  if (absl::Status s = ReadExactly(fd, head.data(), head.size(), path); !s.ok()) return s;
  if (lseek(fd, 0, SEEK_SET) != 0) {
    return absl::InternalError(absl::StrCat("cannot seek in ", path, ": ", std::strerror(errno)));
  }
  uint64_t groups = 0;
  const size_t at = head.find("\ngroups ");
  const size_t end = at == std::string::npos ? at : head.find('\n', at + 1);
  if (end == std::string::npos ||
      !absl::SimpleAtoi(absl::string_view(head).substr(at + 8, end - at - 8), &groups) ||
      groups > (UINT64_MAX - kManifestHeaderBytes) / kManifestLineBytes ||
      size > kManifestHeaderBytes + groups * kManifestLineBytes) {
    return absl::DataLossError(absl::StrCat(
        path, " is ", size, " bytes, more than a manifest of the groups its header counts takes",
        " (grown, or not a manifest)"));
  }
  return absl::OkStatus();
}

}  // namespace

absl::StatusOr<std::vector<StagedGroup>> LoadCheckpoint(StateStore* store, const std::string& dir,
                                                        Manifest* manifest, ThreadPool* pool,
                                                        const ManifestGroupFilter& wanted) {
  const std::string manifest_path = absl::StrCat(dir, "/", kManifestName);
  // A file or a link to one under a checkpoint's name is damage, not a
  // cause to fix (no flag or upgrade reads it).
  if (struct stat d; stat(dir.c_str(), &d) == 0 && !S_ISDIR(d.st_mode)) {
    return absl::DataLossError(absl::StrCat(dir, " is not a directory"));
  }
  absl::StatusOr<uint64_t> size = FileSize(manifest_path);
  if (absl::IsNotFound(size.status())) {
    return absl::DataLossError(absl::StrCat(manifest_path, " is missing"));
  }
  if (!size.ok()) return size.status();
  std::string text;
  {
    absl::StatusOr<ScopedFd> fd = OpenForReading(manifest_path);
    if (!fd.ok()) return fd.status();
    if (absl::Status s = CheckManifestSize(fd->get(), *size, manifest_path); !s.ok()) return s;
    text.resize(*size);
    if (absl::Status s = ReadExactly(fd->get(), text.data(), text.size(), manifest_path); !s.ok()) {
      return s;
    }
  }
  absl::StatusOr<Manifest> parsed = ParseManifest(text);
  if (!parsed.ok()) {
    // DATA_LOSS for damage, FAILED_PRECONDITION for a newer format.
    return absl::Status(parsed.status().code(),
                        absl::StrCat(manifest_path, ": ", parsed.status().message()));
  }
  // A checkpoint copied or renamed to another number (a backup put back, a
  // link) would be restored in place of the one its name says is newest,
  // which the next checkpoints would then prune.
  const absl::string_view base = absl::string_view(dir).substr(dir.rfind('/') + 1);
  if (parsed->id != base) {
    return absl::FailedPreconditionError(
        absl::StrCat(manifest_path, ": holds checkpoint ", parsed->id, ", not ", base,
                     " (a copy or a rename); put it back under its own name, or move it out of "
                     "--state_dir"));
  }
  if (parsed->page_elements != store->page_elements()) {
    return absl::FailedPreconditionError(absl::StrCat(
        manifest_path, ": written with pages of ", parsed->page_elements,
        " elements, but this daemon runs with --page_elements=", store->page_elements(),
        "; restart with --page_elements=", parsed->page_elements, " to restore it"));
  }
  std::vector<StagedGroup> staged;
  ReadTimes times;
  absl::Duration stage_time;
  for (const ManifestGroup& entry : parsed->groups) {
    if (wanted && !wanted(entry)) continue;
    const absl::Time staging = absl::Now();
    absl::StatusOr<StagedGroup> group = store->Stage(entry.key, entry.config);
    stage_time += absl::Now() - staging;
    if (!group.ok()) {
      return absl::Status(group.status().code(),
                          absl::StrCat(manifest_path, ": group '", entry.key.name,
                                       "' cannot be set up: ", group.status().message()));
    }
    if (absl::Status s =
            ReadGroupFile(absl::StrCat(dir, "/", entry.file), entry, group->group(), pool, &times);
        !s.ok()) {
      return s;
    }
    if (entry.last_step.has_value()) group->group().last_step().Record(*entry.last_step);
    staged.push_back(std::move(*group));
  }
  {
    absl::MutexLock lock(&times.mu);
    Log(LogLevel::kInfo, "loaded ", dir, ": set up groups ", absl::FormatDuration(stage_time),
        ", read ", absl::FormatDuration(times.read), " and checksum ",
        absl::FormatDuration(times.checksum), " summed over the reading threads");
  }
  *manifest = std::move(*parsed);
  return staged;
}

namespace {

// The sequence numbers of the complete checkpoints of `names` (a state_dir's
// entries), newest first, and the next free one (past those being written too).
void ScanCheckpoints(const std::vector<std::string>& names, std::vector<uint64_t>* sequences,
                     uint64_t* next_sequence) {
  for (const std::string& name : names) {
    std::string base = name;
    if (base.size() > 4 && base.substr(base.size() - 4) == kTemporarySuffix) {
      base.resize(base.size() - 4);
    }
    std::optional<uint64_t> seq = ParseCheckpointDirName(base);
    if (!seq) continue;
    *next_sequence = std::max(*next_sequence, *seq + 1);
    if (base == name) sequences->push_back(*seq);
  }
  std::sort(sequences->rbegin(), sequences->rend());
}

}  // namespace

absl::StatusOr<std::vector<std::string>> CompleteCheckpointsNewestFirst(
    const std::string& state_dir) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(state_dir);
  if (!names.ok()) return names.status();
  std::vector<uint64_t> sequences;
  uint64_t next = 1;
  ScanCheckpoints(*names, &sequences, &next);
  std::vector<std::string> out;
  for (uint64_t seq : sequences) out.push_back(absl::StrCat(state_dir, "/", CheckpointDirName(seq)));
  return out;
}

absl::StatusOr<RestoreOutcome> RestoreNewest(StateStore* store, const std::string& state_dir,
                                             ThreadPool* pool) {
  absl::StatusOr<std::vector<std::string>> names = ListDirectory(state_dir);
  if (!names.ok()) return names.status();
  std::vector<uint64_t> sequences;
  RestoreOutcome outcome;
  ScanCheckpoints(*names, &sequences, &outcome.next_sequence);
  if (!sequences.empty()) TestPauseBeforeRestore();
  for (uint64_t seq : sequences) {
    const std::string dir = absl::StrCat(state_dir, "/", CheckpointDirName(seq));
    Manifest manifest;
    const absl::Time started = absl::Now();
    // Nothing is served until a restore ends, however long it takes: this
    // line tells a slow restore from a hang.
    Log(LogLevel::kInfo, "restoring checkpoint ", dir,
        " (the daemon serves once it is loaded; a SIGTERM now stops it at once)");
    absl::StatusOr<std::vector<StagedGroup>> staged = LoadCheckpoint(store, dir, &manifest, pool);
    absl::Status status = staged.status();
    std::vector<std::shared_ptr<Group>> published;
    if (status.ok()) {
      for (StagedGroup& group : *staged) {
        absl::StatusOr<std::shared_ptr<Group>> p = store->Publish(group);
        if (!p.ok()) {
          status = absl::Status(p.status().code(),
                                absl::StrCat(dir, ": group '", group.group().key().name,
                                             "' cannot be installed: ", p.status().message()));
          break;
        }
        published.push_back(*std::move(p));
      }
    }
    if (!status.ok()) {
      // Never a half-restored store: take back what was installed.
      for (const auto& group : published) (void)store->Delete(group->key());
      const std::string refusal = absl::StrCat("refused checkpoint ", dir, ": ", status.message());
      Log(LogLevel::kError, refusal);
      outcome.refusals.push_back(refusal);
      outcome.refused_sequences.push_back(seq);
      if (!absl::IsDataLoss(status)) outcome.refused_for_a_fixable_cause = true;
      continue;
    }
    outcome.restored_id = manifest.id;
    outcome.restored_step = manifest.step;
    Log(LogLevel::kInfo, "restored checkpoint ", dir, ": ", manifest.groups.size(),
        " groups at step ", manifest.step, " in ", absl::FormatDuration(absl::Now() - started));
    return outcome;
  }
  return outcome;
}

}  // namespace optstate
