// The checked host entry points of the CUDA codec (cuda_codec.h): validate as the CPU
// codec does, then hand over to the kernels' launchers (qsgd_codec.cu).
#include <lockstep/compress/cuda_codec.h>

#include "compress/cuda/qsgd_kernels.h"

namespace lockstep::compress::cuda {
namespace {

cuda_detail::Dtype kernel_dtype(c10::ScalarType t) {
  LOCKSTEP_CHECK(t == c10::kFloat || t == c10::kBFloat16 || t == c10::kHalf,
                 "compression takes float32, bfloat16 or float16, not ", c10::toString(t));
  if (t == c10::kBFloat16) return cuda_detail::Dtype::BF16;
  return t == c10::kHalf ? cuda_detail::Dtype::F16 : cuda_detail::Dtype::F32;
}

cuda_detail::Layout layout(const CodecOptions& o) {
  validate(o);
  cuda_detail::Layout l;
  l.bits = o.bits;
  l.bucket_size = o.bucket_size;
  l.stochastic = o.stochastic;
  return l;
}

void check(const char* error, const char* what) {
  if (error) throw Error(lockstep::detail::concat("CUDA QSGD ", what, " failed: ", error));
}

void check_pointers(int64_t n, const void* a, const void* b) {
  LOCKSTEP_CHECK(n >= 0, "CUDA QSGD: n must be >= 0, got ", n);
  LOCKSTEP_CHECK(n == 0 || (a && b), "CUDA QSGD: null device pointer for ", n, " values");
}

}  // namespace

void encode(const void* x, c10::ScalarType dtype, int64_t n, const CodecOptions& o,
            const StreamKey& key, uint64_t first_bucket, uint8_t* out, void* stream,
            int64_t* first_bad) {
  const auto d = kernel_dtype(dtype);
  const auto l = layout(o);
  check_pointers(n, x, out);
  check(cuda_detail::launch_encode(x, d, n, l, key, first_bucket, out, first_bad, stream),
        "encode");
}

void decode(const uint8_t* in, int64_t n, const CodecOptions& o, void* out, c10::ScalarType dtype,
            void* stream, int64_t* first_bad) {
  const auto d = kernel_dtype(dtype);
  const auto l = layout(o);
  check_pointers(n, in, out);
  check(cuda_detail::launch_decode(in, n, l, out, d, false, first_bad, stream), "decode");
}

void decode_add(const uint8_t* in, int64_t n, const CodecOptions& o, float* acc, void* stream,
                int64_t* first_bad) {
  const auto l = layout(o);
  check_pointers(n, in, acc);
  check(cuda_detail::launch_decode(in, n, l, acc, cuda_detail::Dtype::F32, true, first_bad, stream),
        "decode_add");
}

}  // namespace lockstep::compress::cuda
