// The three ways the CUDA backend may place state (--paging): always in VRAM,
// in VRAM while the budget allows, or always on the host behind a staging pool.
#ifndef OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_STRATEGY_H_
#define OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_STRATEGY_H_

#include "absl/status/statusor.h"
#include "absl/strings/string_view.h"

namespace optstate {

enum class PagingStrategy {
  kNone,        // Every group resident for its whole life; refuse what does not fit.
  kAdaptive,    // Resident while the budget allows, else paged.
  kFullyPaged,  // All state on the host; steps go through the staging pool.
};

// "none", "adaptive" or "fully_paged"; INVALID_ARGUMENT naming them otherwise.
absl::StatusOr<PagingStrategy> ParsePagingStrategy(absl::string_view text);

// The flag spelling of `strategy`.
absl::string_view PagingStrategyName(PagingStrategy strategy);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_BACKENDS_CUDA_PAGING_PAGING_STRATEGY_H_
