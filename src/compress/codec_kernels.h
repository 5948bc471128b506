// compress/codec_kernels.h (private): the QSGD codec's SIMD paths and the choice between them.
//
// One kernel source (codec_kernels.inc) is compiled three times with different ISA flags
// (codec_generic.cpp: the baseline x86-64 / any CPU; codec_avx2.cpp; codec_avx512.cpp),
// each into its own namespace, and the path is picked once per process from the CPU's
// features (LOCKSTEP_CODEC_ISA overrides). Every path writes the same bytes for the same
// input: the kernels use only IEEE-exact operations in one fixed order (no FMA contraction,
// no reassociation; min/max are order-free once -0 is canonicalised), and the random stream
// is a function of (key, bucket, index), never of the lane width. docs/compression.md has
// the design; tests/unit/test_compress_codec_isa.cpp checks every path against a plain
// scalar reference byte for byte.
#pragma once

#include <lockstep/compress/qsgd_codec.h>

#include <cstdint>

namespace lockstep::compress::detail {

enum class InType { kF32, kBF16, kF16 };
enum class OutMode { kStoreF32, kAddF32, kStoreBF16, kStoreF16 };

struct CodecKernels {
  const char* name;
  // Encodes x[0, n) of type `in` (options already validated). Returns the first bucket
  // holding NaN/Inf, or -1. Allocates nothing.
  int64_t (*encode)(const void* x, InType in, int64_t n, const CodecOptions& o,
                    const StreamKey& key, uint64_t first_bucket, uint8_t* out);
  // Decodes into `out` (float32 store or accumulate, bf16 or fp16 store). Returns the first
  // NaN-marked bucket, or -1. Allocates nothing.
  int64_t (*decode)(const uint8_t* in, int64_t n, const CodecOptions& o, void* out, OutMode m);
};

// Each path's table; nullptr where the build left the path out (LOCKSTEP_CODEC_SIMD=OFF,
// or a non-x86 target).
namespace generic {
const CodecKernels* table();
}
namespace avx2 {
const CodecKernels* table();
}
namespace avx512 {
const CodecKernels* table();
}

// The path in use: chosen on first use, or by set_codec_isa().
const CodecKernels& active();

}  // namespace lockstep::compress::detail
