// lockstep/compress/cuda_codec.h: the QSGD codec on CUDA device memory (docs/gpu.md).
//
// The same contract and the same bytes as qsgd_codec.h's CPU codec: for equal input,
// CodecOptions, StreamKey and first_bucket, encode() writes exactly the bytes the CPU's
// encode() writes (docs/wire-format.md), and decode()/decode_add() produce exactly the
// CPU's floats; one side may encode and the other decode. (Exception: a NaN-marked
// bucket decoded into bfloat16/float16 may carry a different NaN payload.)
//
// Every pointer is device memory of the current CUDA device. The functions only enqueue
// work on `stream` (a cudaStream_t passed as void*, so that this header needs no CUDA
// header; nullptr is the legacy default stream) and return at once: the result is ready
// when the stream gets there. Instead of the CPU's return value, `first_bad` (optional, one
// device int64) ends as the index of the first NaN-marked bucket or -1, read when the
// stream is done, so no call synchronises the host.
//
// Defined only in a build with LOCKSTEP_CUDA on, where LOCKSTEP_HAVE_CUDA is defined (to 1)
// for every user of lockstep; guard calls with #if LOCKSTEP_HAVE_CUDA. Arguments are checked as the
// CPU codec checks them (InvalidArgument); a failed launch throws lockstep::Error with CUDA's
// message.
#pragma once

#include <lockstep/compress/qsgd_codec.h>

#include <c10/core/ScalarType.h>

#include <cstdint>

namespace lockstep::compress::cuda {

// Encodes x[0, n) (float32, bfloat16 or float16 of `dtype`) into out[0, encoded_bytes(n, o)).
void encode(const void* x, c10::ScalarType dtype, int64_t n, const CodecOptions& o,
            const StreamKey& key, uint64_t first_bucket, uint8_t* out, void* stream,
            int64_t* first_bad = nullptr);
// Decodes in[0, encoded_bytes(n, o)) into out[0, n) of `dtype` (round to nearest even).
void decode(const uint8_t* in, int64_t n, const CodecOptions& o, void* out, c10::ScalarType dtype,
            void* stream, int64_t* first_bad = nullptr);
// acc[i] += decoded[i] in float32, as the CPU's decode_add.
void decode_add(const uint8_t* in, int64_t n, const CodecOptions& o, float* acc, void* stream,
                int64_t* first_bad = nullptr);

}  // namespace lockstep::compress::cuda
