// CRC-32C (Castagnoli, reflected polynomial 0x82F63B78), the checksum of iSCSI, ext4 and SSE4.2's crc32
// instruction. Saved caches carry it over their payload.
#pragma once

#include <cstddef>
#include <cstdint>

namespace kvq {

/// CRC-32C of n bytes, continuing from `crc`, the value returned for the bytes before (0 to start):
/// crc32c(b, nb, crc32c(a, na)) equals the CRC of a followed by b. crc32c("123456789", 9) == 0xE3069283.
uint32_t crc32c(const void* data, size_t n, uint32_t crc = 0);

}  // namespace kvq
