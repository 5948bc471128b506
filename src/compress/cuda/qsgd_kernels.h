// Internal: the launchers of the CUDA QSGD kernels (qsgd_codec.cu), called by
// cuda_codec.cpp. Plain C++17 with no libtorch or CUDA header, so that nvcc compiles the
// kernels without libtorch's headers (C++20 from libtorch 2.14 on) and g++ compiles the
// wrapper without CUDA's. Arguments are already validated; pointers are device pointers.
#pragma once

#include <lockstep/compress/rng.h>

#include <cstdint>

namespace lockstep::compress::cuda_detail {

enum class Dtype : int { F32, BF16, F16 };

struct Layout {
  int bits = 4;
  int64_t bucket_size = 128;
  bool stochastic = true;
};

// Each enqueues its work on `stream` (a cudaStream_t; nullptr: the legacy default stream)
// and returns nullptr, or a CUDA error's message if a launch failed. first_bad, if not
// null, is one device int64 that ends as the first NaN-marked bucket's index or -1.
const char* launch_encode(const void* x, Dtype dtype, int64_t n, const Layout& l,
                          const StreamKey& key, uint64_t first_bucket, uint8_t* out,
                          int64_t* first_bad, void* stream);
// add: out[i] += decoded[i] (dtype F32 only).
const char* launch_decode(const uint8_t* in, int64_t n, const Layout& l, void* out, Dtype dtype,
                          bool add, int64_t* first_bad, void* stream);

}  // namespace lockstep::compress::cuda_detail
