// CRC-32 of checkpoint files (docs/checkpoints.md, "Integrity format"): zlib's crc32_z
// (ISO-HDLC, reflected 0x04C11DB7), by carry-less multiplication where the CPU has it.
#pragma once

#include <cstddef>
#include <cstdint>

namespace lockstep::train {

// The CRC-32 of `n` bytes at `p` continued from `crc` (0 to start), equal to zlib's
// crc32_z(crc, p, n). Runs PCLMULQDQ folding (four 128-bit lanes, 64 bytes a round) on
// x86-64 CPUs with PCLMULQDQ and SSE4.1, zlib's tables elsewhere and for short inputs.
uint32_t crc32_update(uint32_t crc, const void* p, size_t n);

}  // namespace lockstep::train
