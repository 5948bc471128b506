// CRC-32 by folding with carry-less multiplication (Gopal et al., "Fast CRC Computation for
// Generic Polynomials Using PCLMULQDQ Instruction", Intel, 2009), reflected form.
//
// The message is read 64 bytes a round into four 128-bit lanes; each round multiplies
// every lane's two halves by x^(512+32) and x^(512-32) mod P and adds the next 64 bytes,
// which keeps the whole message's value mod P. The lanes are then folded into one (by
// x^(128+-32) mod P), and the remaining whole 16-byte blocks into that. The last 16 bytes
// so obtained are congruent to the message, so their CRC (zlib's, from the all-ones start
// state) is the message's; the tail of fewer than 16 bytes goes through zlib after it.
// Cost: two multiplications and two xors per 16 bytes, against zlib's table lookups per
// byte; the test compares every length from 0 to 4096 and large buffers with zlib.
#include "train/checkpoint/crc32.h"

#include <zlib.h>

#if defined(__x86_64__)
#include <immintrin.h>
#endif

namespace lockstep::train {
namespace {

uint32_t crc32_zlib(uint32_t crc, const void* p, size_t n) {
  return uint32_t(::crc32_z(crc, static_cast<const Bytef*>(p), n));
}

#if defined(__x86_64__)
// x^k mod P for the fold distances, bit-reflected in 33 bits (P = 0x104C11DB7).
constexpr uint64_t kX544 = 0x154442bd4, kX480 = 0x1c6e41596;  // 512 +- 32: four lanes
constexpr uint64_t kX160 = 0x1751997d0, kX96 = 0x0ccaa009e;   // 128 +- 32: one lane

__attribute__((target("pclmul,sse4.1"))) __m128i fold(__m128i x, __m128i k, __m128i data) {
  const __m128i lo = _mm_clmulepi64_si128(x, k, 0x00);
  const __m128i hi = _mm_clmulepi64_si128(x, k, 0x11);
  return _mm_xor_si128(_mm_xor_si128(lo, hi), data);
}

__attribute__((target("pclmul,sse4.1"))) uint32_t crc32_folded(uint32_t crc, const uint8_t* p,
                                                               size_t n) {
  auto load = [](const uint8_t* q) { return _mm_loadu_si128(reinterpret_cast<const __m128i*>(q)); };
  __m128i x0 = _mm_xor_si128(load(p), _mm_cvtsi32_si128(int(~crc)));
  __m128i x1 = load(p + 16), x2 = load(p + 32), x3 = load(p + 48);
  p += 64, n -= 64;
  const __m128i k4 = _mm_set_epi64x(int64_t(kX480), int64_t(kX544));
  for (; n >= 64; p += 64, n -= 64) {
    x0 = fold(x0, k4, load(p));
    x1 = fold(x1, k4, load(p + 16));
    x2 = fold(x2, k4, load(p + 32));
    x3 = fold(x3, k4, load(p + 48));
  }
  const __m128i k1 = _mm_set_epi64x(int64_t(kX96), int64_t(kX160));
  __m128i x = fold(fold(fold(x0, k1, x1), k1, x2), k1, x3);
  for (; n >= 16; p += 16, n -= 16) x = fold(x, k1, load(p));
  alignas(16) uint8_t last[16];
  _mm_store_si128(reinterpret_cast<__m128i*>(last), x);
  return crc32_zlib(crc32_zlib(0xffffffffu, last, 16), p, n);
}

bool has_pclmul() {
  static const bool yes = __builtin_cpu_supports("pclmul") && __builtin_cpu_supports("sse4.1");
  return yes;
}
#endif

}  // namespace

uint32_t crc32_update(uint32_t crc, const void* p, size_t n) {
#if defined(__x86_64__)
  if (n >= 256 && has_pclmul()) return crc32_folded(crc, static_cast<const uint8_t*>(p), n);
#endif
  return crc32_zlib(crc, p, n);
}

}  // namespace lockstep::train
