// How a flat buffer of P equal parts travels through the QSGD codec, part by part: the
// plan shared by the compressed reduce-scatter and the quantized all-gather.
//
// The buffer is seen in "original" coordinates, where the caller's layers lie; part p is
// the n elements starting at part_start(p) (P parts of n, usually p * n; the two-level
// reduce-scatter picks the parts of one local rank). Each part is cut where a layer begins
// or ends, so a bucket never mixes two layers' values (whose ranges can differ by orders
// of magnitude); the pieces of layers the policy leaves uncompressed (small ones, biases,
// norms: QsgdOptions::min_layer / exclude) and the holes between layers travel as plain
// float32. A part's bytes are its segments' encodings one after another, in order.
#pragma once

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/compress/policy.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::compress {

class ShardPlan {
 public:
  struct Segment {
    int64_t offset = 0;  // within the part
    int64_t numel = 0;
    int layer = -1;  // index into layers(), -1: a hole
    bool compressed = false;
    uint64_t first_bucket = 0;  // the rounding stream's counter (unique over the plan)
  };

  ShardPlan(const QsgdOptions& o, std::vector<LayerSpan> layers, int64_t part_numel,
            std::vector<int64_t> part_starts);
  // The usual plan: part p starts at p * part_numel.
  static ShardPlan flat(const QsgdOptions& o, std::vector<LayerSpan> layers, int64_t part_numel,
                        int parts);

  int parts() const { return int(starts_.size()); }
  int64_t part_numel() const { return n_; }
  int64_t part_start(int p) const { return starts_[size_t(p)]; }
  int64_t part_bytes(int p) const { return bytes_[size_t(p)]; }
  int64_t max_part_bytes() const;
  const std::vector<Segment>& segments(int p) const { return segs_[size_t(p)]; }
  const std::vector<LayerSpan>& layers() const { return layers_; }
  // The layer holding original offset `off` ("" if none).
  std::string layer_at(int64_t off) const;

  // Encodes part p, held in buf[at, at + n) (float32 / bfloat16 / float16), into out[0,
  // part_bytes(p)). Returns the original offset of the first non-finite value met (the
  // start of the bucket holding it, in compressed segments), or -1.
  int64_t encode(int p, const at::Tensor& buf, int64_t at, const CodecOptions& c,
                 const StreamKey& key, uint8_t* out) const;
  // acc[0, n) += the decoded bytes of part p (NaN-marked buckets add NaN).
  void decode_add(int p, const uint8_t* in, const CodecOptions& c, float* acc) const;
  // buf[at, at + n) <- the decoded bytes of part p.
  void decode(int p, const uint8_t* in, const CodecOptions& c, at::Tensor& buf, int64_t at) const;
  // A digest of the plan and options, for the collectives' descriptor check.
  int64_t fingerprint(const CodecOptions& c) const;

 private:
  std::vector<LayerSpan> layers_;  // sorted by offset
  int64_t n_;
  std::vector<int64_t> starts_;
  std::vector<std::vector<Segment>> segs_;
  std::vector<int64_t> bytes_;
};

}  // namespace lockstep::compress
