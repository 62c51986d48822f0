// CRC32C (Castagnoli), the checksum of checkpoint files: SSE4.2's crc32
// instruction where the CPU has it, a table otherwise; both give the same bits.
#ifndef OPTSTATE_SERVER_DURABILITY_CRC32C_H_
#define OPTSTATE_SERVER_DURABILITY_CRC32C_H_

#include <cstddef>
#include <cstdint>

namespace optstate {

// The CRC32C of `crc`'s data followed by `data[0, n)`; Crc32cExtend(0, ...)
// starts a new one. Crc32cExtend(0, "123456789", 9) == 0xE3069283.
uint32_t Crc32cExtend(uint32_t crc, const void* data, size_t n);

// The CRC32C of A followed by B, from crc_a = CRC32C(A), crc_b = CRC32C(B)
// and B's length (zlib's crc32_combine, for the Castagnoli polynomial): lets
// pieces of a file be checked in parallel.
uint32_t Crc32cCombine(uint32_t crc_a, uint32_t crc_b, uint64_t length_b);

// The table path alone, for tests that hold the two paths against each other.
uint32_t Crc32cExtendPortable(uint32_t crc, const void* data, size_t n);

}  // namespace optstate

#endif  // OPTSTATE_SERVER_DURABILITY_CRC32C_H_
