// Elementwise reductions over raw buffers, and a streaming copy (see reduce_kernels.h).
//
// These loops are memory bound: the shm allreduce streams every byte of a tensor
// through them once, so the goal is one pass over memory per call. reduce_many
// therefore fuses up to four sources per pass (dst = op(op(op(a, b), c), d)) and
// walks longer source lists block by block, so each destination block stays in
// L1 while later sources are folded in. The loops are plain restrict-pointer
// loops that GCC/Clang vectorize at -O3; no intrinsics, so the code is portable.
// The one exception is copy_streaming's non-temporal stores (SSE2, every x86-64;
// plain memcpy elsewhere).
//
// Combination order is always srcs[0], srcs[1], ... so every rank that reduces
// the same element from the same inputs produces the same bits.
#include "comm/reduce_kernels.h"

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <lockstep/error.h>

#include <algorithm>
#include <cstdint>
#include <cstring>
#if defined(__x86_64__)
#include <emmintrin.h>
#endif
#include <type_traits>
#include <vector>

namespace lockstep::comm {
namespace {

// ---- scalar ops -------------------------------------------------------------

// Max/Min propagate NaN (as torch.maximum does): `a != a` is true only for NaN.
struct SumOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_integral_v<T>) {
      // Wrap on overflow instead of undefined behaviour (matches torch's int add).
      using U = std::make_unsigned_t<T>;
      return static_cast<T>(static_cast<U>(a) + static_cast<U>(b));
    } else {
      return a + b;
    }
  }
};
struct MaxOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>)
      return (a > b || a != a) ? a : b;
    else
      return a > b ? a : b;
  }
};
struct MinOp {
  template <typename T>
  static T apply(T a, T b) {
    if constexpr (std::is_floating_point_v<T>)
      return (a < b || a != a) ? a : b;
    else
      return a < b ? a : b;
  }
};

// ---- native types: T is both storage and arithmetic type --------------------

template <typename Op, typename T>
void native_inplace(T* __restrict d, const T* __restrict s, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(d[i], s[i]);
}
template <typename Op, typename T>
void native_2(T* __restrict d, const T* __restrict a, const T* __restrict b, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(a[i], b[i]);
}
template <typename Op, typename T>
void native_3(T* __restrict d, const T* __restrict a, const T* __restrict b, const T* __restrict c,
              int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(Op::apply(a[i], b[i]), c[i]);
}
template <typename Op, typename T>
void native_4(T* __restrict d, const T* __restrict a, const T* __restrict b, const T* __restrict c,
              const T* __restrict e, int64_t n) {
  for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(Op::apply(Op::apply(a[i], b[i]), c[i]), e[i]);
}
// Fold srcs[from..k) into d in place, three at a time.
template <typename Op, typename T>
void native_fold(T* __restrict d, const T* const* srcs, int from, int k, int64_t n) {
  int j = from;
  for (; j + 3 <= k; j += 3) {
    const T* __restrict a = srcs[j];
    const T* __restrict b = srcs[j + 1];
    const T* __restrict c = srcs[j + 2];
    for (int64_t i = 0; i < n; ++i) d[i] = Op::apply(Op::apply(Op::apply(d[i], a[i]), b[i]), c[i]);
  }
  for (; j < k; ++j) native_inplace<Op>(d, srcs[j], n);
}

// One block of a k-way reduction; d may alias srcs[0] (then the first pass is in place).
template <typename Op, typename T>
void native_block(T* d, const T* const* s, int k, int64_t n) {
  if (d == s[0]) {
    native_fold<Op>(d, s, 1, k, n);
    return;
  }
  switch (k) {
    case 1:
      std::memcpy(d, s[0], n * sizeof(T));
      return;
    case 2:
      native_2<Op>(d, s[0], s[1], n);
      return;
    case 3:
      native_3<Op>(d, s[0], s[1], s[2], n);
      return;
    default:
      native_4<Op>(d, s[0], s[1], s[2], s[3], n);
      native_fold<Op>(d, s, 4, k, n);
  }
}

// Blocks keep d hot in L1/L2 while more than four sources are folded in.
constexpr int64_t kBlock = 8192;

template <typename Op, typename T>
void native_many(T* d, const void* const* srcs, int k, int64_t n) {
  if (k <= 4) {
    native_block<Op>(d, reinterpret_cast<const T* const*>(srcs), k, n);
    return;
  }
  const T* s[64];
  LOCKSTEP_CHECK(k <= 64, "reduce_many supports at most 64 sources, got ", k);
  for (int64_t off = 0; off < n; off += kBlock) {
    const int64_t m = std::min(kBlock, n - off);
    for (int j = 0; j < k; ++j) s[j] = static_cast<const T*>(srcs[j]) + off;
    native_block<Op>(d + off, s, k, m);
  }
}

// ---- 16-bit floats: load as float, combine in float, round once -------------

template <typename H>
void load_f(float* __restrict out, const H* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<float>(in[i]);
}
template <typename H>
void store_f(H* __restrict out, const float* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) out[i] = static_cast<H>(in[i]);
}
template <typename Op, typename H>
void fold_f(float* __restrict acc, const H* __restrict in, int64_t n) {
  for (int64_t i = 0; i < n; ++i) acc[i] = Op::apply(acc[i], static_cast<float>(in[i]));
}

template <typename Op, typename H>
void half_many(H* d, const void* const* srcs, int k, int64_t n) {
  constexpr int64_t kHalfBlock = 2048;  // float accumulator stays in L1
  float acc[kHalfBlock];
  for (int64_t off = 0; off < n; off += kHalfBlock) {
    const int64_t m = std::min(kHalfBlock, n - off);
    load_f(acc, static_cast<const H*>(srcs[0]) + off, m);
    for (int j = 1; j < k; ++j) fold_f<Op>(acc, static_cast<const H*>(srcs[j]) + off, m);
    store_f(d + off, acc, m);  // after all loads: safe when d aliases srcs[0]
  }
}

// ---- dispatch ---------------------------------------------------------------

template <typename Op>
void many_for_op(void* dst, const void* const* srcs, int k, int64_t n, at::ScalarType t) {
  switch (t) {
    case at::kFloat:
      return native_many<Op>(static_cast<float*>(dst), srcs, k, n);
    case at::kDouble:
      return native_many<Op>(static_cast<double*>(dst), srcs, k, n);
    case at::kInt:
      return native_many<Op>(static_cast<int32_t*>(dst), srcs, k, n);
    case at::kLong:
      return native_many<Op>(static_cast<int64_t*>(dst), srcs, k, n);
    case at::kByte:
      return native_many<Op>(static_cast<uint8_t*>(dst), srcs, k, n);
    case at::kBFloat16:
      return half_many<Op>(static_cast<c10::BFloat16*>(dst), srcs, k, n);
    case at::kHalf:
      return half_many<Op>(static_cast<c10::Half*>(dst), srcs, k, n);
    default:
      throw InvalidArgument(
          lockstep::detail::concat("reduce: unsupported dtype ", c10::toString(t)));
  }
}

template <typename T, typename A>
void divide_all(T* __restrict d, int64_t n, A divisor) {
  for (int64_t i = 0; i < n; ++i) d[i] = static_cast<T>(static_cast<A>(d[i]) / divisor);
}

}  // namespace

void divide_inplace(void* d, int64_t n, at::ScalarType t, int64_t divisor) {
  switch (t) {
    case at::kFloat:
      return divide_all(static_cast<float*>(d), n, static_cast<float>(divisor));
    case at::kDouble:
      return divide_all(static_cast<double*>(d), n, static_cast<double>(divisor));
    case at::kBFloat16:
      return divide_all(static_cast<c10::BFloat16*>(d), n, static_cast<float>(divisor));
    case at::kHalf:
      return divide_all(static_cast<c10::Half*>(d), n, static_cast<float>(divisor));
    default:
      throw InvalidArgument(lockstep::detail::concat("divide: unsupported dtype ", c10::toString(t),
                                                     " (avg needs a floating-point tensor)"));
  }
}

void reduce_many(void* dst, const void* const* srcs, int k, int64_t n, at::ScalarType t,
                 ReduceOp op) {
  LOCKSTEP_CHECK(k >= 1, "reduce_many needs at least one source");
  if (n <= 0) return;
  switch (op) {
    case ReduceOp::Sum:
      return many_for_op<SumOp>(dst, srcs, k, n, t);
    case ReduceOp::Max:
      return many_for_op<MaxOp>(dst, srcs, k, n, t);
    case ReduceOp::Min:
      return many_for_op<MinOp>(dst, srcs, k, n, t);
    default:
      throw InvalidArgument(lockstep::detail::concat("reduce: unsupported op ",
                                                     static_cast<int>(op),
                                                     " (Avg is handled by the process group)"));
  }
}

void store_fence() {
#if defined(__x86_64__)
  _mm_sfence();
#endif
}

void copy_streaming(void* dst, const void* src, int64_t bytes, bool fence) {
  if (bytes <= 0) return;
#if defined(__x86_64__)
  auto* d = static_cast<char*>(dst);
  const auto* s = static_cast<const char*>(src);
  // Plain copy up to the first 16-byte boundary of dst, streaming stores after it.
  const int64_t head = std::min<int64_t>(bytes, (16 - reinterpret_cast<uintptr_t>(d) % 16) % 16);
  std::memcpy(d, s, head);
  int64_t i = head;
  for (; i + 64 <= bytes; i += 64) {
    const __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    const __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    const __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  std::memcpy(d + i, s + i, bytes - i);
  if (fence) _mm_sfence();
#else
  std::memcpy(dst, src, bytes);
#endif
}

void reduce_inplace(void* dst, const void* src, int64_t n, at::ScalarType t, ReduceOp op) {
  const void* srcs[2] = {dst, src};
  reduce_many(dst, srcs, 2, n, t, op);
}

void reduce_to(const std::vector<const char*>& srcs, const std::vector<char*>& dsts, int64_t n,
               int64_t es, at::ScalarType dt, ReduceOp op, int64_t divisor, unsigned streamed) {
  constexpr int64_t kBlockBytes = 16 << 10;
  alignas(64) static thread_local char scratch[kBlockBytes];
  const int64_t block = kBlockBytes / es;
  std::vector<const void*> s(srcs.size());
  for (int64_t off = 0; off < n; off += block) {
    const int64_t m = std::min(block, n - off);
    for (size_t r = 0; r < srcs.size(); ++r) s[r] = srcs[r] + off * es;
    reduce_many(scratch, s.data(), static_cast<int>(s.size()), m, dt, op);
    if (divisor > 0) divide_inplace(scratch, m, dt, divisor);
    for (size_t d = 0; d < dsts.size(); ++d) {
      if (d < 32 && (streamed >> d & 1u))
        copy_streaming(dsts[d] + off * es, scratch, m * es, false);  // fenced below
      else
        std::memcpy(dsts[d] + off * es, scratch, m * es);
    }
  }
  if (streamed != 0) store_fence();  // before a peer may read them (the post after this)
}

}  // namespace lockstep::comm
