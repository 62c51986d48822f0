// Parsing and naming of --paging values.
#include "server/backends/cuda/paging/paging_strategy.h"

#include "absl/strings/str_cat.h"

namespace optstate {

absl::StatusOr<PagingStrategy> ParsePagingStrategy(absl::string_view text) {
  if (text == "none") return PagingStrategy::kNone;
  if (text == "adaptive") return PagingStrategy::kAdaptive;
  if (text == "fully_paged") return PagingStrategy::kFullyPaged;
  return absl::InvalidArgumentError(
      absl::StrCat("--paging must be none, adaptive or fully_paged, got '", text, "'"));
}

absl::string_view PagingStrategyName(PagingStrategy strategy) {
  switch (strategy) {
    case PagingStrategy::kNone:
      return "none";
    case PagingStrategy::kAdaptive:
      return "adaptive";
    case PagingStrategy::kFullyPaged:
      return "fully_paged";
  }
  return "unknown";
}

}  // namespace optstate
