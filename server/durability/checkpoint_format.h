// The on-disk format of a checkpoint (docs/durability.md): a directory
// ckpt-<16 digits> holding one data file per group and a text MANIFEST that
// names each file with its size and CRC32C, under a format version.
#ifndef OPTSTATE_SERVER_DURABILITY_CHECKPOINT_FORMAT_H_
#define OPTSTATE_SERVER_DURABILITY_CHECKPOINT_FORMAT_H_

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"
#include "server/state/group.h"
#include "server/state/last_step_record.h"

namespace optstate {

// The version this daemon writes and the newest it reads. Version 2 adds
// maximize and amsgrad (0 or 1) at the end of each group line; version 1
// lines (without them) read as maximize=0, amsgrad=0. Version 3 adds the
// group's last step's record (ManifestGroup::last_step: its step, 0 for none,
// then lr, beta1, beta2, eps, weight_decay and maximize); older lines read
// as none.
constexpr int kCheckpointFormatVersion = 3;
constexpr char kManifestName[] = "MANIFEST";
// A data file is, for each page in order, a record: uint64 step, uint64
// flags (bit 0: the page has its values), then the page's params, exp_avg
// and exp_avg_sq (and max_exp_avg_sq for an amsgrad group) as float32; all
// little-endian.
constexpr uint64_t kPageRecordHeaderBytes = 16;
constexpr uint64_t kPageHasValues = 1;

uint64_t DataFileBytes(uint64_t num_elements, uint64_t page_elements, bool amsgrad = false);

struct ManifestGroup {
  GroupKey key;
  GroupConfig config;
  uint64_t min_step = 0, max_step = 0;  // Over its pages, as captured.
  std::string file;                     // Name inside the checkpoint's directory.
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
  // What the group's last applied step used, when the checkpoint holds that
  // step (every page captured at it); restored with the group.
  std::optional<SteppedWith> last_step;
};

struct Manifest {
  int version = kCheckpointFormatVersion;
  std::string id;
  uint64_t step = 0;
  uint64_t page_elements = 0;
  int64_t created_unix_micros = 0;
  std::vector<ManifestGroup> groups;
};

// Text, one field a line, ending with a line holding the CRC32C of every
// byte before it.
std::string EncodeManifest(const Manifest& manifest);
// DATA_LOSS saying what is wrong: not a manifest, a format version newer
// than kCheckpointFormatVersion (checked before the checksum, which a newer
// version may compute otherwise), a checksum mismatch, a line that does not
// parse.
absl::StatusOr<Manifest> ParseManifest(absl::string_view text);

// "ckpt-0000000000000007" for 7; ParseCheckpointDirName gives 7 back, and
// nothing for other names (temporary directories included).
std::string CheckpointDirName(uint64_t sequence);
std::optional<uint64_t> ParseCheckpointDirName(absl::string_view name);
constexpr char kTemporarySuffix[] = ".tmp";

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_CHECKPOINT_FORMAT_H_
