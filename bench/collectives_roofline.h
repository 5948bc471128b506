// The memory roofline of lockstep-bench collectives: what the memory system allows a
// collective on one node, measured in the same job as the collective.
//
// Bound (docs/algorithms.md, "Memory roofline"): every rank's input and output tensors
// are private and, at the sizes this is meant for (>= 1 MiB, beyond 16 MiB in earnest),
// larger than the caches, so each input byte must come from memory once and each output
// byte must go to memory once; whatever moves between ranks can stay on chip. The
// minimum traffic per rank, counted like STREAM (bytes read + bytes written):
//   allreduce (N-byte tensor)         N read + N written            = 2N        (copy)
//   reduce_scatter (N in, N/P out)    N read + N/P written          = N(P+1)/P  (rmw)
//   allgather (N/P in, N out)         N/P read + N written          = N(P+1)/P  (copy)
// The time bound is that traffic at the bandwidth each rank gets from the STREAM-like
// kernel with the same mix of reads and writes (copy 1:1, a[i] += b[i] 2:1), all P ranks
// running it at once on their own buffers of N bytes. An implementation's fraction of
// the bound is bound time / measured time (1 = at the roofline).
#pragma once

#include <lockstep/comm/process_group.h>

#include <cstdint>
#include <string>

namespace lockstep::bench {

// GB/s per rank while all ranks run the kernel at once (STREAM counting).
struct StreamBandwidth {
  double copy = 0;  // b[i] = a[i]: the better of memcpy and a non-temporal-store copy
  double rmw = 0;   // a[i] += b[i] (float32)
};
// At the median run and at the best run (STREAM's own figure) of the slowest rank.
struct StreamResult {
  StreamBandwidth median, best;
};

// Every rank of `control` must call it with the same `bytes`: each runs the kernels on
// its own two buffers of `bytes`, in step with the others (a barrier before each run).
// Per kernel, the median and the best run of the slowest rank.
StreamResult measure_stream(comm::ProcessGroup& control, int64_t bytes);

// Minimum memory traffic per rank of `op` ("allreduce", "reduce_scatter", "allgather")
// over a buffer of `bytes` (allreduce: the tensor; reduce_scatter: the input; allgather:
// the output) at `p` ranks, STREAM counting. 0 for p == 1 or an unknown op.
double min_traffic_bytes(const std::string& op, int64_t bytes, int p);
// Which kernel's bandwidth bounds `op`: "rmw" for reduce_scatter, "copy" otherwise.
const char* bound_kernel(const std::string& op);
// min_traffic_bytes at the kernel's bandwidth, in seconds (0 if unknown).
double bound_seconds(const std::string& op, int64_t bytes, int p, const StreamBandwidth& bw);

}  // namespace lockstep::bench
