// CRC32C, reflected polynomial 0x82F63B78, initial and final XOR ~0.
#include "server/durability/crc32c.h"

#include <cstring>

#if defined(__x86_64__)
#include <nmmintrin.h>
#endif

namespace optstate {
namespace {

struct Table {
  uint32_t entries[256];
  Table() {
    for (uint32_t i = 0; i < 256; ++i) {
      uint32_t c = i;
      for (int k = 0; k < 8; ++k) c = (c & 1) ? (c >> 1) ^ 0x82F63B78u : c >> 1;
      entries[i] = c;
    }
  }
};

const Table& TheTable() {
  static const Table table;
  return table;
}

// GF(2) 32x32 matrices as 32 columns: appending zero bits to a CRC is a
// linear map, squared to append 2^k zero bits.
uint32_t MatrixTimes(const uint32_t* matrix, uint32_t vector) {
  uint32_t sum = 0;
  for (; vector != 0; vector >>= 1, ++matrix) {
    if (vector & 1) sum ^= *matrix;
  }
  return sum;
}

void MatrixSquare(uint32_t* square, const uint32_t* matrix) {
  for (int n = 0; n < 32; ++n) square[n] = MatrixTimes(matrix, matrix[n]);
}

// The operator that appends `bytes` zero bytes to a CRC register (the
// register before the final XOR), as 32 columns.
struct ZerosOperator {
  uint32_t columns[32];
  explicit ZerosOperator(uint64_t bytes) {
    uint32_t bit[32], square[32];
    bit[0] = 0x82F63B78u;  // One zero bit.
    for (int n = 1; n < 32; ++n) bit[n] = 1u << (n - 1);
    for (int n = 0; n < 32; ++n) columns[n] = 1u << n;  // Identity.
    for (uint64_t bits = bytes * 8; bits != 0; bits >>= 1) {
      if (bits & 1) {
        uint32_t product[32];
        for (int n = 0; n < 32; ++n) product[n] = MatrixTimes(bit, columns[n]);
        std::memcpy(columns, product, sizeof(columns));
      }
      MatrixSquare(square, bit);
      std::memcpy(bit, square, sizeof(bit));
    }
  }
  uint32_t Apply(uint32_t crc) const { return MatrixTimes(columns, crc); }
};

#if defined(__x86_64__)
// Bytes each of the three streams takes per round: the crc32 instruction has
// a latency of 3 cycles and a throughput of 1, so three independent streams
// keep it busy; their registers are joined with ZerosOperator once a round.
constexpr size_t kStreamBytes = 8192;

__attribute__((target("sse4.2"))) uint64_t Sse42Words(uint64_t c, const unsigned char* p,
                                                      size_t n) {
  for (; n >= 8; n -= 8, p += 8) {
    uint64_t word;
    std::memcpy(&word, p, 8);
    c = _mm_crc32_u64(c, word);
  }
  return c;
}

__attribute__((target("sse4.2"))) uint32_t ExtendSse42(uint32_t crc, const unsigned char* p,
                                                       size_t n) {
  static const ZerosOperator shift_one(kStreamBytes), shift_two(2 * kStreamBytes);
  uint64_t c = static_cast<uint32_t>(~crc);
  for (; n >= 3 * kStreamBytes; n -= 3 * kStreamBytes, p += 3 * kStreamBytes) {
    uint64_t c0 = c, c1 = 0, c2 = 0;
    const unsigned char* p1 = p + kStreamBytes;
    const unsigned char* p2 = p + 2 * kStreamBytes;
    for (size_t i = 0; i < kStreamBytes; i += 8) {
      uint64_t w0, w1, w2;
      std::memcpy(&w0, p + i, 8);
      std::memcpy(&w1, p1 + i, 8);
      std::memcpy(&w2, p2 + i, 8);
      c0 = _mm_crc32_u64(c0, w0);
      c1 = _mm_crc32_u64(c1, w1);
      c2 = _mm_crc32_u64(c2, w2);
    }
    // Registers are linear: CRC(r; A B C) = Z2(c0) ^ Z1(c1) ^ c2, where c0
    // ran A from r, c1 ran B and c2 ran C from 0, and Zk appends k streams
    // of zero bytes.
    c = shift_two.Apply(static_cast<uint32_t>(c0)) ^ shift_one.Apply(static_cast<uint32_t>(c1)) ^
        static_cast<uint32_t>(c2);
  }
  c = Sse42Words(c, p, n);
  p += n & ~size_t{7};
  n &= 7;
  uint32_t c32 = static_cast<uint32_t>(c);
  for (; n > 0; --n, ++p) c32 = _mm_crc32_u8(c32, *p);
  return ~c32;
}

bool HaveSse42() {
  static const bool have = __builtin_cpu_supports("sse4.2");
  return have;
}
#endif

}  // namespace

uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b) {
  if (length_b == 0) return crc_a;
  uint32_t even[32], odd[32];
  odd[0] = 0x82F63B78u;  // The operator for one zero bit.
  uint32_t row = 1;
  for (int n = 1; n < 32; ++n, row <<= 1) odd[n] = row;
  MatrixSquare(even, odd);  // Two zero bits.
  MatrixSquare(odd, even);  // Four.
  // Applies length_b zero bytes to crc_a, one power of two at a time.
  do {
    MatrixSquare(even, odd);
    if (length_b & 1) crc_a = MatrixTimes(even, crc_a);
    length_b >>= 1;
    if (length_b == 0) break;
    MatrixSquare(odd, even);
    if (length_b & 1) crc_a = MatrixTimes(odd, crc_a);
    length_b >>= 1;
  } while (length_b != 0);
  return crc_a ^ crc_b;
}

uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n) {
  const Table& table = TheTable();
  const auto* p = static_cast<const unsigned char*>(data);
  uint32_t c = ~crc;
  for (size_t i = 0; i < n; ++i) c = table.entries[(c ^ p[i]) & 0xFF] ^ (c >> 8);
  return ~c;
}

uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n) {
#if defined(__x86_64__)
  if (HaveSse42()) return ExtendSse42(crc, static_cast<const unsigned char*>(data), n);
#endif
  return Crc32cExtendPortable(crc, data, n);
}

}  // namespace optstate
