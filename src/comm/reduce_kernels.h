// Internal: elementwise reductions over raw buffers, for every supported dtype, the
// block-wise reduction of the shm collectives, and the shm allreduce's streaming copy.
// Used by the shm backend and by the MPI backend's user-defined ops (16-bit floats).
#pragma once

#include <lockstep/comm/types.h>

#include <cstdint>
#include <vector>

namespace lockstep::comm {

// dst[i] = op(dst[i], src[i]) for i < n. op is Sum, Max or Min.
void reduce_inplace(void* dst, const void* src, int64_t n, at::ScalarType t, ReduceOp op);

// dst[i] = op(srcs[0][i], srcs[1][i], ..., srcs[k-1][i]), combined in that order so that
// every rank computing the same element gets the same bits. 16-bit floats accumulate in
// float32 and round once. dst may alias srcs[0].
void reduce_many(void* dst, const void* const* srcs, int k, int64_t n, at::ScalarType t,
                 ReduceOp op);

// memcpy whose stores bypass the cache (non-temporal) where the CPU has them (x86-64),
// plain memcpy elsewhere: for data another core will read from memory, not from this
// core's cache. The stores are fenced before it returns unless `fence` is false; then
// call store_fence() after the last of a series, before another thread may read them (an
// sfence waits until the write-combining buffers have drained: one per series of small
// copies, e.g. the 16 KiB blocks of a reduction, instead of one per copy).
void copy_streaming(void* dst, const void* src, int64_t bytes, bool fence = true);
// Orders every earlier non-temporal store before every later store (sfence; nothing where
// copy_streaming is a plain memcpy).
void store_fence();

// d[i] /= divisor for i < n (floating-point dtypes: the Avg of a Sum; as Tensor::div_).
void divide_inplace(void* d, int64_t n, at::ScalarType t, int64_t divisor);

// Reduces n elements of `srcs` (in list order: the same bits on every rank) and copies
// the result to every one of `dsts`, block by block through an L1 scratch block, so the
// division (`divisor` > 0: Avg) and the copies work in cache: one pass over memory per
// source and destination, and a destination may overlap a source. Destination d gets
// non-temporal stores if bit d of `streamed` is set (the shm allreduce's Streaming path's
// staging slot; a large tensor's output).
void reduce_to(const std::vector<const char*>& srcs, const std::vector<char*>& dsts, int64_t n,
               int64_t es, at::ScalarType dt, ReduceOp op, int64_t divisor, unsigned streamed);

}  // namespace lockstep::comm
