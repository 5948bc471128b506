// lockstep/compress/compressed_reduce_scatter.h: a 4-bit (QSGD) reduce-scatter on any
// backend, for FSDP's gradients (ZeRO++'s qgZ; docs/compression.md).
//
// Algorithm (P ranks, a flat buffer of P parts of n values; rank r owns part r):
//   1. Each rank encodes every part it does not own (stochastic rounding: unbiased) and one
//      alltoall delivers to each owner the P-1 encoded copies of its part, each behind an
//      8-byte header: the sender's first non-finite offset (or -1).
//   2. The owner adds the decoded copies, in rank order, to its own exact values in float32
//      and divides by P when averaging; the result goes into `out` in the buffer's dtype.
// Each value is quantized once (the compressed allreduce quantizes twice: its second
// quantization only makes the replicas agree, and a reduce-scatter has no replicas). The
// owner's result is a pure function of the inputs, the seed and the call count: bit for
// bit the same whatever the timing, on any backend. Layers are cut and kept apart as in the
// compressed allreduce: buckets never span two layers, and layers the policy leaves
// uncompressed (QsgdOptions::min_layer, exclude) travel as plain float32.
//
// Two levels (QsgdOptions::across_nodes_only, on hier: N nodes of L ranks, rank = node * L +
// local): a reduce-scatter inside the node in full precision leaves local rank l the node's
// sums of the parts of ranks (n, l) for every node n; the algorithm above runs on those among
// the N ranks of its cross-node group. Only the bytes between nodes are quantized.
//
// Bytes a rank sends, n values a part, b bits, bucket B:
//   (P-1) * n * (b/8 + 8/B)  vs  (P-1) * 4n for a float32 reduce-scatter.
//
// NaN/Inf: a non-finite input anywhere makes finish() throw NonFiniteGradient naming the
// layer on EVERY rank, after the collective completed (the group stays usable).
//
// Thread safety: one call in flight per instance; issue calls on different instances in the
// same order on every rank (as any collective).
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/compress/policy.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace lockstep::compress {

class ShardPlan;

class CompressedReduceScatter {
 public:
  // `layers` lie in [0, world_size * part_numel) and are disjoint; elements of no layer
  // travel plain. Applies `options` as given (no environment).
  CompressedReduceScatter(QsgdOptions options, std::vector<LayerSpan> layers, int64_t part_numel,
                          int world_size);
  ~CompressedReduceScatter();
  CompressedReduceScatter(const CompressedReduceScatter&) = delete;
  CompressedReduceScatter& operator=(const CompressedReduceScatter&) = delete;

  // in: contiguous CPU float32 / bfloat16 / float16, world_size * part_numel values; out:
  // part_numel values of the same dtype. Queues the exchange as one composite op; `in`, `out`
  // and this object stay untouched until the work completed, then call finish().
  comm::WorkPtr run_async(comm::ProcessGroup& group, at::Tensor out, at::Tensor in, bool average);
  // Raises NonFiniteGradient (every rank alike) if the latest call met NaN/Inf.
  void finish();
  // run_async() + wait() + finish().
  void run(comm::ProcessGroup& group, at::Tensor out, at::Tensor in, bool average);

  // Bytes this rank put on the wire in the latest call, and what a float32 reduce-scatter
  // of the same buffer sends.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_uncompressed() const { return bytes_plain_; }
  uint64_t steps() const { return step_; }
  void set_steps(uint64_t steps) { step_ = steps; }  // the rounding follows the call count

 private:
  void exchange(comm::Backend& be, const comm::OpContext& ctx, at::Tensor& out, at::Tensor& in,
                bool average, uint64_t step);
  int64_t flat(comm::Backend& be, const comm::OpContext& ctx, const ShardPlan& plan,
               const QsgdOptions& o, at::Tensor& out, const at::Tensor& in, int divisor,
               uint64_t step);
  void levels(comm::Backend& node, comm::Backend& across, const comm::OpContext& ctx,
              at::Tensor& out, const at::Tensor& in, bool average, uint64_t step);

  QsgdOptions opts_;
  int64_t n_;
  int world_;
  std::unique_ptr<ShardPlan> plan_;        // the flat plan
  std::unique_ptr<ShardPlan> share_plan_;  // two levels: this local rank's parts
  QsgdOptions share_opts_;
  uint64_t step_ = 0;
  comm::WorkPtr inflight_;
  int64_t bad_ = -1;  // first non-finite original offset of the latest call (every rank)
  int64_t bytes_sent_ = 0, bytes_plain_ = 0;
  at::Tensor send_, recv_, perm_, share_;
  std::vector<float> acc_;
};

}  // namespace lockstep::compress
