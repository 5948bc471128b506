#include "compress/device_exchange.h"

#include <lockstep/compress/cuda_codec.h>
#include <lockstep/error.h>

#if LOCKSTEP_HAVE_CUDA
#include <c10/cuda/CUDAStream.h>
#endif

namespace lockstep::compress {

namespace {

constexpr uint32_t kPhaseDevice = 3;  // the rounding stream of the device exchange's encode
int64_t aligned16(int64_t b) { return (b + 15) / 16 * 16; }

// The codec of `t`'s device: the CUDA kernels on the current stream, or the CPU codec (the
// same bytes; how the algorithm is tested without a GPU).
void encode_on(const at::Tensor& t, const void* x, int64_t n, const CodecOptions& o,
               const StreamKey& key, uint64_t first_bucket, uint8_t* out) {
  if (t.is_cpu()) {
    encode(x, t.scalar_type(), n, o, key, first_bucket, out);
    return;
  }
#if LOCKSTEP_HAVE_CUDA
  cuda::encode(x, t.scalar_type(), n, o, key, first_bucket, out,
               c10::cuda::getCurrentCUDAStream(t.device().index()).stream());
#else
  throw Error("the CUDA codec is not built (LOCKSTEP_CUDA off)");
#endif
}

void decode_add_on(const at::Tensor& acc, const uint8_t* in, int64_t n, const CodecOptions& o) {
  if (acc.is_cpu()) {
    decode_add(in, n, o, acc.data_ptr<float>());
    return;
  }
#if LOCKSTEP_HAVE_CUDA
  cuda::decode_add(in, n, o, acc.data_ptr<float>(),
                   c10::cuda::getCurrentCUDAStream(acc.device().index()).stream());
#else
  throw Error("the CUDA codec is not built (LOCKSTEP_CUDA off)");
#endif
}

}  // namespace

bool DeviceExchange::available() {
#if LOCKSTEP_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

DeviceExchange::DeviceExchange(const std::vector<LayerSpan>& layers,
                               const std::vector<bool>& compressed, const QsgdOptions& options)
    : options_(options) {
  for (size_t i = 0; i < layers.size(); ++i)  // where in S: laid out by issue(), per dtype
    if (layers[i].numel > 0)
      segments_.push_back({int(i), layers[i].offset, layers[i].numel, 0, 0, compressed[i]});
}

comm::WorkPtr DeviceExchange::issue(comm::ProcessGroup& group, const at::Tensor& flat,
                                    uint64_t step) {
  const int64_t es = flat.element_size();
  if (world_ != group.size() || !send_.defined() || send_.device() != flat.device() ||
      dtype_ != flat.scalar_type()) {  // the layout, once per dtype, device and group
    total_ = 0;
    for (auto& s : segments_) {
      s.at = total_;
      s.bytes = s.compressed ? encoded_bytes(s.numel, options_.codec()) : s.numel * es;
      total_ = aligned16(total_ + s.bytes);
    }
    world_ = group.size();
    dtype_ = flat.scalar_type();
    const auto bytes = at::TensorOptions().dtype(at::kByte).device(flat.device());
    send_ = at::zeros({total_}, bytes);
    recv_ = at::empty({total_ * world_}, bytes);
  }
  flat_ = flat;
  const StreamKey key{options_.seed, step, uint32_t(group.rank()), kPhaseDevice};
  const CodecOptions codec = options_.codec();
  auto* out = send_.data_ptr<uint8_t>();
  for (const auto& s : segments_) {
    if (s.compressed)  // first bucket: the layer's own, so no two layers share a stream
      encode_on(flat, static_cast<const char*>(flat.data_ptr()) + s.offset * es, s.numel, codec,
                key, uint64_t(s.offset / codec.bucket_size), out + s.at);
    else
      send_.narrow(0, s.at, s.bytes).copy_(flat.narrow(0, s.offset, s.numel).view(at::kByte));
  }
  return group.allgather(recv_, send_);
}

int DeviceExchange::finish(bool average) {
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(flat_.device());
  at::Tensor bad = at::zeros({int64_t(segments_.size())}, f32.dtype(at::kBool));
  const CodecOptions codec = options_.codec();
  for (size_t i = 0; i < segments_.size(); ++i) {
    const Segment& s = segments_[i];
    at::Tensor acc = at::zeros({s.numel}, f32);
    for (int r = 0; r < world_; ++r) {  // rank order: the same sums on every rank
      at::Tensor in = recv_.narrow(0, r * total_ + s.at, s.bytes);
      if (s.compressed)
        decode_add_on(acc, in.data_ptr<uint8_t>(), s.numel, codec);
      else
        acc.add_(in.view(dtype_).to(at::kFloat));
    }
    bad.narrow(0, int64_t(i), 1).copy_(at::isfinite(acc).logical_not().any().reshape({1}));
    if (average) acc.div_(world_);
    flat_.narrow(0, s.offset, s.numel).copy_(acc);
  }
  const at::Tensor found = bad.cpu();  // one host sync, after the decodes were queued
  const bool* f = found.data_ptr<bool>();
  int first = -1;
  for (size_t i = 0; i < segments_.size(); ++i)
    if (f[i] && (first < 0 || segments_[i].offset < segments_[size_t(first)].offset))
      first = int(i);
  flat_ = at::Tensor();
  return first < 0 ? -1 : segments_[size_t(first)].layer;
}

}  // namespace lockstep::compress
