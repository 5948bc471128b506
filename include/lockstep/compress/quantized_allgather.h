// lockstep/compress/quantized_allgather.h: an all-gather that sends each rank's part in 8
// (or fewer) bits, for FSDP's parameters (ZeRO++'s qwZ; docs/compression.md).
//
// Each rank encodes its part with the QSGD codec's min/max buckets and ROUND-TO-NEAREST
// (deterministic), one allgather moves the bytes, and every rank decodes every part, its own
// included, so all ranks hold bit-identical values. Layers are cut and kept apart as in the
// compressed reduce-scatter (buckets never span two layers; layers the policy leaves
// uncompressed travel as float32). The caller's master values are not touched: only the
// gathered copy carries the rounding.
//
// Error bound per value (b bits, a bucket spanning [lo, hi]):
//   |decoded - x| <= (hi - lo) / (2 (2^b - 1))   (+ the output dtype's own rounding),
// i.e. 1/510 of the bucket's range at 8 bits, 1/30 at 4 bits.
//
// Bytes a rank sends, n values a part: n * (b/8 + 8/B) (+ 4 per plain value) vs 4n (float32)
// or 2n (bfloat16).
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

class QuantizedAllgather {
 public:
  // `options.stochastic` is ignored (always round to nearest); `layers` lie in
  // [0, world_size * part_numel).
  QuantizedAllgather(QsgdOptions options, std::vector<LayerSpan> layers, int64_t part_numel,
                     int world_size);
  ~QuantizedAllgather();
  QuantizedAllgather(const QuantizedAllgather&) = delete;
  QuantizedAllgather& operator=(const QuantizedAllgather&) = delete;

  // in: this rank's part_numel values; out: world_size * part_numel values; both contiguous
  // CPU float32 / bfloat16 / float16 (dtypes may differ). One composite op; `in`, `out` and
  // this object stay untouched until the work completed.
  comm::WorkPtr run_async(comm::ProcessGroup& group, at::Tensor out, const at::Tensor& in);
  // Bytes this rank sends per call, and what a plain all-gather of `in`'s dtype sends.
  int64_t bytes_sent() const;
  int64_t bytes_uncompressed(at::ScalarType dtype) const;

 private:
  QsgdOptions opts_;
  int64_t n_;
  int world_;
  std::unique_ptr<ShardPlan> plan_;
  comm::WorkPtr inflight_;
  at::Tensor send_, recv_;
};

}  // namespace lockstep::compress
