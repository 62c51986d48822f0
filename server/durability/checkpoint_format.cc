// Manifest text: encoding, and parsing that refuses anything not whole.
#include "server/durability/checkpoint_format.h"

#include <charconv>
#include <cinttypes>
#include <cstdio>

#include "absl/container/flat_hash_set.h"
#include "absl/strings/escaping.h"
#include "absl/strings/numbers.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_split.h"
#include "server/durability/crc32c.h"
#include "server/state/group_config.h"

namespace optstate {
namespace {

constexpr absl::string_view kMagic = "optstate-checkpoint-manifest";

// Tenants may hold any bytes; "-" is the empty tenant.
std::string EncodeTenant(const std::string& tenant) {
  return tenant.empty() ? "-" : absl::BytesToHexString(tenant);
}

bool DecodeTenant(absl::string_view text, std::string* tenant) {
  if (text == "-") {
    tenant->clear();
    return true;
  }
  if (text.size() % 2 != 0) return false;
  for (char c : text) {
    if (!absl::ascii_isxdigit(static_cast<unsigned char>(c))) return false;
  }
  *tenant = absl::HexStringToBytes(text);
  return true;
}

bool ParseDouble(absl::string_view text, double* out) {
  const std::from_chars_result r = std::from_chars(text.data(), text.data() + text.size(), *out);
  return r.ec == std::errc() && r.ptr == text.data() + text.size();
}

absl::Status Bad(absl::string_view what) {
  return absl::DataLossError(absl::StrCat("manifest does not parse: ", what));
}

}  // namespace

uint64_t DataFileBytes(uint64_t num_elements, uint64_t page_elements, bool amsgrad) {
  const uint64_t pages = (num_elements + page_elements - 1) / page_elements;
  return pages * kPageRecordHeaderBytes + num_elements * (amsgrad ? 4 : 3) * sizeof(float);
}

std::string EncodeManifest(const Manifest& m) {
  std::string text =
      absl::StrCat(kMagic, "\n", "format_version ", m.version, "\n", "id ", m.id, "\n", "step ",
                   m.step, "\n", "page_elements ", m.page_elements, "\n", "created_unix_micros ",
                   m.created_unix_micros, "\n", "groups ", m.groups.size(), "\n");
  for (const ManifestGroup& g : m.groups) {
    const AdamWHyperparameters& h = g.config.hyperparameters;
    char crc[9];
    std::snprintf(crc, sizeof(crc), "%08" PRIx32, g.crc32c);
    absl::StrAppend(&text, "group ", EncodeTenant(g.key.tenant), " ", g.key.name, " ",
                    g.config.num_elements, " ", ExactText(h.lr), " ", ExactText(h.beta1), " ",
                    ExactText(h.beta2), " ", ExactText(h.eps), " ", ExactText(h.weight_decay), " ",
                    g.config.has_initial_values ? 1 : 0, " ", g.min_step, " ", g.max_step, " ",
                    g.file, " ", g.bytes, " ", crc, " ", h.maximize ? 1 : 0, " ",
                    h.amsgrad ? 1 : 0);
    if (g.last_step.has_value() && g.last_step->step != 0) {
      const AdamWHyperparameters& l = g.last_step->hyperparameters;
      absl::StrAppend(&text, " ", g.last_step->step, " ", ExactText(l.lr), " ",
                      ExactText(l.beta1), " ", ExactText(l.beta2), " ", ExactText(l.eps), " ",
                      ExactText(l.weight_decay), " ", l.maximize ? 1 : 0, "\n");
    } else {
      absl::StrAppend(&text, " 0 0 0 0 0 0 0\n");
    }
  }
  char crc[9];
  std::snprintf(crc, sizeof(crc), "%08" PRIx32, Crc32cExtend(0, text.data(), text.size()));
  absl::StrAppend(&text, "end ", crc, "\n");
  return text;
}

absl::StatusOr<Manifest> ParseManifest(absl::string_view text) {
  std::vector<absl::string_view> lines = absl::StrSplit(text, '\n');
  if (lines.empty() || lines[0] != kMagic) {
    return absl::DataLossError(
        absl::StrCat("not a checkpoint manifest (the first line is not '", kMagic, "')"));
  }
  Manifest m;
  if (lines.size() < 2 || !absl::ConsumePrefix(&lines[1], "format_version ") ||
      !absl::SimpleAtoi(lines[1], &m.version) || m.version < 1) {
    return Bad("the second line is not 'format_version N'");
  }
  if (m.version > kCheckpointFormatVersion) {
    // Not damage: a newer optstated reads it.
    return absl::FailedPreconditionError(
        absl::StrCat("format version ", m.version, " is newer than this daemon reads (",
                     kCheckpointFormatVersion, "); upgrade optstated"));
  }
  // The last line is "end <crc>" followed by the final newline.
  const size_t end_at = text.rfind("\nend ");
  if (end_at == absl::string_view::npos || text.empty() || text.back() != '\n') {
    return absl::DataLossError("manifest is truncated (no final 'end' line)");
  }
  const absl::string_view body = text.substr(0, end_at + 1);
  absl::string_view crc_text = text.substr(end_at + 5);
  crc_text.remove_suffix(1);
  uint32_t stored = 0;
  if (crc_text.size() != 8 || !absl::SimpleHexAtoi(crc_text, &stored)) {
    return Bad("the 'end' line holds no checksum");
  }
  const uint32_t actual = Crc32cExtend(0, body.data(), body.size());
  if (stored != actual) {
    char message[96];
    std::snprintf(message, sizeof(message),
                  "manifest checksum mismatch (stored %08" PRIx32 ", computed %08" PRIx32 ")",
                  stored, actual);
    return absl::DataLossError(message);
  }
  lines = absl::StrSplit(body, '\n');
  lines.pop_back();  // After the body's final newline.
  auto field = [&](size_t i, absl::string_view name) -> absl::StatusOr<absl::string_view> {
    absl::string_view line = i < lines.size() ? lines[i] : absl::string_view();
    if (!absl::ConsumePrefix(&line, name) || !absl::ConsumePrefix(&line, " ")) {
      return Bad(absl::StrCat("line ", i + 1, " is not '", name, " ...'"));
    }
    return line;
  };
  absl::StatusOr<absl::string_view> id = field(2, "id");
  if (!id.ok()) return id.status();
  m.id = std::string(*id);
  uint64_t num_groups = 0;
  for (auto [i, name, target] : {std::tuple<size_t, const char*, uint64_t*>{3, "step", &m.step},
                                 {4, "page_elements", &m.page_elements},
                                 {6, "groups", &num_groups}}) {
    absl::StatusOr<absl::string_view> value = field(i, name);
    if (!value.ok()) return value.status();
    if (!absl::SimpleAtoi(*value, target)) return Bad(absl::StrCat(name, " is not a number"));
  }
  absl::StatusOr<absl::string_view> created = field(5, "created_unix_micros");
  if (!created.ok()) return created.status();
  if (!absl::SimpleAtoi(*created, &m.created_unix_micros)) {
    return Bad("created_unix_micros is not a number");
  }
  if (m.page_elements == 0) return Bad("page_elements is 0");
  if (lines.size() != 7 + num_groups) {
    return Bad(absl::StrCat("it names ", num_groups, " groups but holds ",
                            lines.size() >= 7 ? lines.size() - 7 : 0, " group lines"));
  }
  for (uint64_t i = 0; i < num_groups; ++i) {
    absl::StatusOr<absl::string_view> line = field(7 + i, "group");
    if (!line.ok()) return line.status();
    std::vector<absl::string_view> f = absl::StrSplit(*line, ' ');
    ManifestGroup g;
    AdamWHyperparameters& h = g.config.hyperparameters;
    int has_values = 0;
    const size_t fields = m.version >= 3 ? 23 : m.version >= 2 ? 16 : 14;
    int maximize = 0, amsgrad = 0;
    if (f.size() != fields ||
        (fields >= 16 && (!absl::SimpleAtoi(f[14], &maximize) || maximize < 0 || maximize > 1 ||
                          !absl::SimpleAtoi(f[15], &amsgrad) || amsgrad < 0 || amsgrad > 1)) || !DecodeTenant(f[0], &g.key.tenant) || f[1].empty() ||
        !absl::SimpleAtoi(f[2], &g.config.num_elements) || g.config.num_elements == 0 ||
        !ParseDouble(f[3], &h.lr) || !ParseDouble(f[4], &h.beta1) || !ParseDouble(f[5], &h.beta2) ||
        !ParseDouble(f[6], &h.eps) || !ParseDouble(f[7], &h.weight_decay) ||
        !absl::SimpleAtoi(f[8], &has_values) || !absl::SimpleAtoi(f[9], &g.min_step) ||
        !absl::SimpleAtoi(f[10], &g.max_step) || f[11].empty() ||
        f[11].find('/') != absl::string_view::npos || !absl::SimpleAtoi(f[12], &g.bytes) ||
        f[13].size() != 8 || !absl::SimpleHexAtoi(f[13], &g.crc32c)) {
      return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i, ") does not parse"));
    }
    g.key.name = std::string(f[1]);
    g.config.has_initial_values = has_values != 0;
    h.maximize = maximize != 0;
    h.amsgrad = amsgrad != 0;
    // A checksum that matches does not make values a register would refuse
    // loadable (a manifest written by hand, or by a daemon with a bug).
    if (absl::Status s = ValidateHyperparameters(h); !s.ok()) {
      return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i, "): ", s.message()));
    }
    g.file = std::string(f[11]);
    if (fields == 23) {
      SteppedWith last;
      AdamWHyperparameters& l = last.hyperparameters;
      int last_maximize = 0;
      if (!absl::SimpleAtoi(f[16], &last.step) || !ParseDouble(f[17], &l.lr) ||
          !ParseDouble(f[18], &l.beta1) || !ParseDouble(f[19], &l.beta2) ||
          !ParseDouble(f[20], &l.eps) || !ParseDouble(f[21], &l.weight_decay) ||
          !absl::SimpleAtoi(f[22], &last_maximize) || last_maximize < 0 || last_maximize > 1 ||
          last.step > g.max_step) {
        return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i,
                                ") has a last step that does not parse"));
      }
      l.maximize = last_maximize != 0;
      l.amsgrad = h.amsgrad;
      if (last.step != 0) {  // Step 0: no record, written as zeros.
        // Written only when every page was captured at that very step.
        if (last.step != g.max_step || g.min_step != g.max_step) {
          return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i,
                                  ") records its last step as ", last.step,
                                  ", but its pages are at steps ", g.min_step, "..", g.max_step,
                                  " (a record is kept only of the pages' one step)"));
        }
        if (absl::Status s = ValidateHyperparameters(l); !s.ok()) {
          return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i,
                                  "), its last step: ", s.message()));
        }
        g.last_step = last;
      }
    }
    m.groups.push_back(std::move(g));
  }
  // One line per group: a second line of a name would be installed over the
  // first (or refused as registered meanwhile, as if a cause to fix).
  absl::flat_hash_set<std::pair<std::string, std::string>> keys;
  for (size_t i = 0; i < m.groups.size(); ++i) {
    if (!keys.emplace(m.groups[i].key.tenant, m.groups[i].key.name).second) {
      return Bad(absl::StrCat("group line ", i + 1, " (line ", 8 + i, ") names group '",
                              m.groups[i].key.name, "' again"));
    }
  }
  return m;
}

std::string CheckpointDirName(uint64_t sequence) {
  char name[32];
  std::snprintf(name, sizeof(name), "ckpt-%016" PRIu64, sequence);
  return name;
}

std::optional<uint64_t> ParseCheckpointDirName(absl::string_view name) {
  const absl::string_view whole = name;
  if (!absl::ConsumePrefix(&name, "ckpt-") || name.size() < 16) return std::nullopt;
  for (char c : name) {
    if (c < '0' || c > '9') return std::nullopt;
  }
  uint64_t sequence = 0;
  if (!absl::SimpleAtoi(name, &sequence)) return std::nullopt;
  // Past 16 digits the names grow (ckpt-10000000000000000), as the writer
  // writes them; a name the writer would not write is no checkpoint, nor is
  // the last number (no next one would follow it).
  if (sequence == UINT64_MAX || CheckpointDirName(sequence) != whole) return std::nullopt;
  return sequence;
}

}  // namespace optstate
