// Internal: CompressedAllreduce on CUDA tensors with the CUDA codec (docs/gpu.md,
// compressed_allreduce.h).
//
// An allgather of encodings: each rank encodes its compressed layers once on its GPU
// (one quantization, the CUDA codec) and puts its plain layers' raw values beside them;
// one allgather of those S bytes (nccl: on the GPUs; shm, gloo: staged, so the host copies
// carry about 1/7 of the float32 bytes at 4 bits) gives every rank every rank's bytes;
// each decodes and sums them in rank order on its GPU (float32), so all replicas end
// bit-identical. A rank receives (P-1) S bytes, against 2 (P-1)/P S for the host plan's
// scatter-reduce-allgather: the same at P = 2, more above it; every value is quantized
// once instead of twice. Without error feedback and across every rank (two levels and
// error feedback take the host plan, by staging).
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/compress/compressed_allreduce.h>

#include <ATen/ATen.h>

#include <vector>

namespace lockstep::compress {

class DeviceExchange {
 public:
  // `compressed[i]`: whether layers[i] goes through the codec (else its values are sent
  // as they are).
  DeviceExchange(const std::vector<LayerSpan>& layers, const std::vector<bool>& compressed,
                 const QsgdOptions& options);
  // Whether this build has the CUDA codec (LOCKSTEP_CUDA).
  static bool available();
  // The caller's thread: encodes `flat` (on its device's current stream) and issues the
  // allgather. Until its work completed, `flat` must not be touched. CompressedAllreduce
  // takes this path for CUDA tensors; a CPU `flat` works too (the CPU codec: the same
  // bytes), which is how compress_check tests the algorithm without a GPU.
  comm::WorkPtr issue(comm::ProcessGroup& group, const at::Tensor& flat, uint64_t step);
  // After the work completed, on a thread whose current stream is ordered after it
  // (Work::wait() does that): decodes and sums into `flat` (divided by P if `average`).
  // Returns the index of the first layer (by offset) with NaN/Inf on any rank, or -1.
  int finish(bool average);
  // Bytes a rank sends per call: its S bytes to each of P-1 peers.
  int64_t bytes_sent(int world) const { return int64_t(world - 1) * total_; }

 private:
  struct Segment {
    int layer;
    int64_t offset, numel;  // elements of flat
    int64_t at, bytes;      // bytes in a rank's S, 16-byte aligned
    bool compressed;
  };
  QsgdOptions options_;
  std::vector<Segment> segments_;
  int64_t total_ = 0;  // S
  int world_ = 0;
  at::ScalarType dtype_ = at::ScalarType::Undefined;
  at::Tensor flat_, send_, recv_;
};

}  // namespace lockstep::compress
