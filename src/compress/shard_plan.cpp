// The part-by-part plan of the compressed reduce-scatter and all-gather; see shard_plan.h.
#include "compress/shard_plan.h"

#include "compress/float_io.h"

#include <lockstep/error.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <numeric>

namespace lockstep::compress {
namespace {

const char* raw(const at::Tensor& t, int64_t at) {
  return static_cast<const char*>(t.data_ptr()) + at * int64_t(t.element_size());
}

}  // namespace

ShardPlan::ShardPlan(const QsgdOptions& o, std::vector<LayerSpan> layers, int64_t part_numel,
                     std::vector<int64_t> part_starts)
    : layers_(std::move(layers)), n_(part_numel), starts_(std::move(part_starts)) {
  std::sort(layers_.begin(), layers_.end(),
            [](const LayerSpan& a, const LayerSpan& b) { return a.offset < b.offset; });
  for (size_t i = 1; i < layers_.size(); ++i)
    LOCKSTEP_CHECK(layers_[i].offset >= layers_[i - 1].offset + layers_[i - 1].numel,
                   "compressed shard plan: layers '", layers_[i - 1].name, "' and '",
                   layers_[i].name, "' overlap");
  const CodecOptions c = o.codec();
  // Segments of every part in original order, so the bucket counters are unique.
  std::vector<int> order(starts_.size());
  std::iota(order.begin(), order.end(), 0);
  std::sort(order.begin(), order.end(), [&](int a, int b) { return starts_[a] < starts_[b]; });
  segs_.resize(starts_.size());
  bytes_.assign(starts_.size(), 0);
  uint64_t bucket = 0;
  for (const int p : order) {
    const int64_t lo = starts_[size_t(p)], hi = lo + n_;
    int64_t at = lo;
    auto add = [&](int64_t end, int layer) {
      if (end <= at) return;
      Segment s{at - lo, end - at, layer, false, bucket};
      const LayerSpan* l = layer >= 0 ? &layers_[size_t(layer)] : nullptr;
      s.compressed = o.enabled() && l != nullptr && should_compress(o, l->name, l->numel);
      if (s.compressed) bucket += uint64_t(num_buckets(s.numel, c));
      bytes_[size_t(p)] += s.compressed ? encoded_bytes(s.numel, c) : 4 * s.numel;
      segs_[size_t(p)].push_back(s);
      at = end;
    };
    for (size_t i = 0; i < layers_.size() && at < hi; ++i) {
      const LayerSpan& l = layers_[i];
      if (l.offset + l.numel <= at) continue;
      add(std::min(l.offset, hi), -1);  // the hole before the layer
      add(std::min(l.offset + l.numel, hi), int(i));
    }
    add(hi, -1);
  }
}

ShardPlan ShardPlan::flat(const QsgdOptions& o, std::vector<LayerSpan> layers, int64_t part_numel,
                          int parts) {
  std::vector<int64_t> starts(static_cast<size_t>(parts));
  for (int p = 0; p < parts; ++p) starts[size_t(p)] = p * part_numel;
  return ShardPlan(o, std::move(layers), part_numel, std::move(starts));
}

int64_t ShardPlan::max_part_bytes() const {
  return bytes_.empty() ? 0 : *std::max_element(bytes_.begin(), bytes_.end());
}

std::string ShardPlan::layer_at(int64_t off) const {
  for (const auto& l : layers_)
    if (off >= l.offset && off < l.offset + l.numel) return l.name;
  return "";
}

int64_t ShardPlan::encode(int p, const at::Tensor& buf, int64_t at, const CodecOptions& c,
                          const StreamKey& key, uint8_t* out) const {
  int64_t bad = -1;
  const auto dt = buf.scalar_type();
  for (const Segment& s : segs_[size_t(p)]) {
    const char* x = raw(buf, at + s.offset);
    const int64_t origin = part_start(p) + s.offset;
    if (s.compressed) {
      const int64_t b = compress::encode(x, dt, s.numel, c, key, s.first_bucket, out);
      if (b >= 0 && bad < 0) bad = origin + b * c.bucket_size;
      out += encoded_bytes(s.numel, c);
    } else {
      load_float(buf, at + s.offset, s.numel, reinterpret_cast<float*>(out));
      if (bad < 0 && !all_finite(reinterpret_cast<const float*>(out), s.numel)) {
        const float* f = reinterpret_cast<const float*>(out);
        bad =
            origin + (std::find_if(f, f + s.numel, [](float v) { return !std::isfinite(v); }) - f);
      }
      out += 4 * s.numel;
    }
  }
  return bad;
}

void ShardPlan::decode_add(int p, const uint8_t* in, const CodecOptions& c, float* acc) const {
  for (const Segment& s : segs_[size_t(p)]) {
    float* a = acc + s.offset;
    if (s.compressed) {
      compress::decode_add(in, s.numel, c, a);
      in += encoded_bytes(s.numel, c);
    } else {
      const float* v = reinterpret_cast<const float*>(in);
      for (int64_t i = 0; i < s.numel; ++i) a[i] += v[i];
      in += 4 * s.numel;
    }
  }
}

void ShardPlan::decode(int p, const uint8_t* in, const CodecOptions& c, at::Tensor& buf,
                       int64_t at) const {
  for (const Segment& s : segs_[size_t(p)]) {
    if (s.compressed) {
      compress::decode(in, s.numel, c, const_cast<char*>(raw(buf, at + s.offset)),
                       buf.scalar_type());
      in += encoded_bytes(s.numel, c);
    } else {
      store_float(reinterpret_cast<const float*>(in), s.numel, buf, at + s.offset);
      in += 4 * s.numel;
    }
  }
}

int64_t ShardPlan::fingerprint(const CodecOptions& c) const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(uint64_t(c.bits));
  mix(uint64_t(c.bucket_size));
  mix(uint64_t(c.stochastic));
  mix(uint64_t(n_));
  for (size_t p = 0; p < segs_.size(); ++p) {
    mix(uint64_t(starts_[p]));
    mix(uint64_t(bytes_[p]));
  }
  return int64_t(h >> 1);
}

}  // namespace lockstep::compress
