// Bytes cut into pieces at random, as a transport delivers a message, and
// gathered back: shared by the tests of everything that reads messages in
// pieces.
#ifndef OPTSTATE_TESTS_TESTING_RANDOM_CUTS_H_
#define OPTSTATE_TESTS_TESTING_RANDOM_CUTS_H_

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "absl/strings/string_view.h"
#include "grpcpp/support/byte_buffer.h"
#include "grpcpp/support/slice.h"
#include "server/base/segmented_bytes.h"

namespace optstate::testing {

// Up to `max_cuts` ascending cut offsets in [0, bytes]. Repeats and cuts at
// either end leave empty pieces, which a transport may deliver too.
inline std::vector<size_t> RandomCuts(size_t bytes, int max_cuts, std::mt19937_64& rng) {
  std::vector<size_t> cuts;
  for (int c = std::uniform_int_distribution<int>(0, max_cuts)(rng); c > 0; --c) {
    cuts.push_back(std::uniform_int_distribution<size_t>(0, bytes)(rng));
  }
  std::sort(cuts.begin(), cuts.end());
  return cuts;
}

// Calls piece(bytes) for each piece of `bytes` cut at `cuts` (ascending), in
// order.
template <typename Piece>
void ForEachPiece(absl::string_view bytes, const std::vector<size_t>& cuts, Piece piece) {
  size_t at = 0;
  for (size_t cut : cuts) {
    piece(bytes.substr(at, cut - at));
    at = cut;
  }
  piece(bytes.substr(at));
}

// `wire` as a ByteBuffer of slices cut at `cuts` (ascending).
inline grpc::ByteBuffer Sliced(absl::string_view wire, const std::vector<size_t>& cuts) {
  std::vector<grpc::Slice> slices;
  ForEachPiece(wire, cuts,
               [&](absl::string_view piece) { slices.emplace_back(piece.data(), piece.size()); });
  return grpc::ByteBuffer(slices.data(), slices.size());
}

// The bytes of `bytes`, gathered from their pieces into one string.
inline std::string Gather(const SegmentedBytes& bytes) {
  std::string whole(bytes.size(), '\0');
  bytes.CopyTo(0, bytes.size(), whole.data());
  return whole;
}

}  // namespace optstate::testing

#endif  // OPTSTATE_TESTS_TESTING_RANDOM_CUTS_H_
