// <state_dir>/MOVES: the moves a daemon knows of (StateStore::MoveNotes: the
// groups sealed for a move, and notes of those deleted after one), so that a
// restart keeps them. Without it, a daemon restored from a checkpoint
// written before a move held a copy of a moved group that stepped (sealed no
// more) and let a rewind make moved groups again (docs/scale-out.md).
//
// Text, written whole under a temporary name, fsynced and renamed over the
// last (so it is always one whole version): a header line, one line per
// note (TENANT<tab>NAME<tab>MOVED_TO; the tenant empty without tenants), and
// a last line counting them, with the CRC32C of every byte before it (a
// flipped byte would otherwise seal or unseal another group). A file that
// does not read back so is refused whole, never half-applied. Files of
// version 1 (no CRC), written by earlier daemons, are still read.
#ifndef OPTSTATE_SERVER_DURABILITY_MOVE_NOTES_FILE_H_
#define OPTSTATE_SERVER_DURABILITY_MOVE_NOTES_FILE_H_

#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/status/statusor.h"
#include "server/engine/state_store.h"

namespace optstate {

inline constexpr char kMoveNotesFileName[] = "MOVES";

// Replaces <state_dir>/MOVES with `notes` (removes it when there are none).
absl::Status WriteMoveNotes(const std::string& state_dir,
                            const std::vector<StateStore::MoveNote>& notes);

// The notes of <state_dir>/MOVES; none when there is no such file.
// DATA_LOSS naming the line for a file that is not one whole version.
absl::StatusOr<std::vector<StateStore::MoveNote>> ReadMoveNotes(const std::string& state_dir);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_MOVE_NOTES_FILE_H_
