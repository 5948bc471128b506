// QSGD scatter-reduce-allgather (see compressed_allreduce.h for the algorithm and contract).
#include <lockstep/compress/compressed_allreduce.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <cstring>

namespace lockstep::compress {
namespace {

constexpr uint32_t kPhaseScatter = 1, kPhaseGather = 2;

char* bytes_of(at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// dtype <-> float32 for the owner's accumulator.
void load_float(const at::Tensor& flat, int64_t off, int64_t n, float* out) {
  switch (flat.scalar_type()) {
    case at::kFloat: std::memcpy(out, flat.data_ptr<float>() + off, size_t(n) * 4); break;
    case at::kBFloat16: {
      const c10::BFloat16* p = flat.data_ptr<c10::BFloat16>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
      break;
    }
    default: {
      const c10::Half* p = flat.data_ptr<c10::Half>() + off;
      for (int64_t i = 0; i < n; ++i) out[i] = float(p[i]);
    }
  }
}

void ensure_bytes(at::Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() != n) t = at::zeros({n}, at::TensorOptions().dtype(at::kByte));
}

}  // namespace

CompressedAllreduce::CompressedAllreduce(QsgdOptions options, std::vector<LayerSpan> layers,
                                         int64_t numel, int world_size)
    : opts_(std::move(options)), layers_(std::move(layers)), numel_(numel), world_(world_size) {
  validate(opts_);
  LOCKSTEP_CHECK(world_ >= 1, "world_size must be >= 1, got ", world_);
  LOCKSTEP_CHECK(numel_ >= 0, "numel must be >= 0");
  std::sort(layers_.begin(), layers_.end(),
            [](const LayerSpan& a, const LayerSpan& b) { return a.offset < b.offset; });
  // Fill holes (elements no layer claims) with unnamed plain layers, so the whole buffer
  // is reduced and the check below sees a partition.
  std::vector<LayerSpan> all;
  int64_t at = 0;
  for (const auto& l : layers_) {
    LOCKSTEP_CHECK(l.numel >= 0 && l.offset >= at && l.offset + l.numel <= numel_,
                   "layer '", l.name, "' [", l.offset, ", ", l.offset + l.numel,
                   ") overlaps another or lies outside the buffer of ", numel_);
    if (l.offset > at) all.push_back({"<unnamed>", at, l.offset - at});
    all.push_back(l);
    at = l.offset + l.numel;
  }
  if (at < numel_) all.push_back({"<unnamed>", at, numel_ - at});
  layers_ = std::move(all);

  // Global bucket list of compressed layers, split into world_ parts by element count.
  const CodecOptions codec = opts_.codec();
  int64_t total = 0;
  std::vector<int> comp;
  for (int i = 0; i < int(layers_.size()); ++i) {
    const auto& l = layers_[size_t(i)];
    if (l.name != "<unnamed>" && should_compress(opts_, l.name, l.numel)) {
      comp.push_back(i);
      total += l.numel;
    } else if (l.numel > 0) {
      plain_layers_.push_back(i);
      plain_elems_ += l.numel;
    }
  }
  parts_.assign(size_t(world_), {});
  part_elems_.assign(size_t(world_), 0);
  part_bytes_.assign(size_t(world_), 0);
  int64_t seen = 0;
  uint64_t bucket = 0;
  for (int li : comp) {
    const auto& l = layers_[size_t(li)];
    for (int64_t s = 0; s < l.numel; s += opts_.bucket_size, ++bucket) {
      const int64_t len = std::min(opts_.bucket_size, l.numel - s);
      // The part is fixed by where the bucket starts: boundaries near r * total / P.
      const int r = int(std::min<int64_t>(world_ - 1, (seen * world_) / total));
      auto& runs = parts_[size_t(r)];
      if (!runs.empty() && runs.back().layer == li && runs.back().offset + runs.back().numel == l.offset + s)
        runs.back().numel += len;
      else
        runs.push_back({l.offset + s, len, li, bucket});
      part_elems_[size_t(r)] += len;
      seen += len;
    }
  }
  for (int r = 0; r < world_; ++r) {
    for (const auto& run : parts_[size_t(r)]) part_bytes_[size_t(r)] += encoded_bytes(run.numel, codec);
    slot_bytes_ = std::max(slot_bytes_, part_bytes_[size_t(r)]);
  }
}

AllreduceStats CompressedAllreduce::run(comm::ProcessGroup& group, at::Tensor& flat,
                                        bool average) {
  const int P = group.size(), me = group.rank();
  LOCKSTEP_CHECK_EQ(P, world_, "the plan was made for another world size");
  LOCKSTEP_CHECK(flat.device().is_cpu() && flat.is_contiguous(), "flat buffer must be contiguous CPU");
  LOCKSTEP_CHECK_EQ(flat.numel(), numel_, "flat buffer size differs from the plan");
  const at::ScalarType dt = flat.scalar_type();
  LOCKSTEP_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
                 "compressed allreduce takes float32, bfloat16 or float16, not ", c10::toString(dt));
  const int64_t es = flat.element_size();
  const CodecOptions codec = opts_.codec();
  const uint64_t step = step_++;
  const bool ef = opts_.error_feedback && P > 1;
  if (ef && residual_.size() != size_t(numel_)) residual_.assign(size_t(numel_), 0.0f);

  AllreduceStats st;
  st.plain_elems = plain_elems_;
  st.compressed_elems = numel_ - plain_elems_;
  st.bytes_uncompressed = P > 1 ? 2 * (P - 1) * numel_ * es / P : 0;
  int bad = -1;  // first non-finite layer in buffer order (the same on every rank)
  auto note_bad = [&](int li) {
    if (bad < 0 || layers_[size_t(li)].offset < layers_[size_t(bad)].offset) bad = li;
  };

  if (P == 1) {  // nothing crosses a link: no quantization, only the NaN/Inf check
    for (size_t i = 0; i < layers_.size(); ++i)
      if (!all_finite(bytes_of(flat) + layers_[i].offset * es, dt, layers_[i].numel)) {
        note_bad(int(i));
        break;
      }
  }

  // 1. Plain layers: one allreduce, issued first so it overlaps the encoding below.
  comm::WorkPtr plain_work;
  if (P > 1 && plain_elems_ > 0) {
    if (!plain_.defined() || plain_.numel() != plain_elems_ || plain_.scalar_type() != dt)
      plain_ = at::empty({plain_elems_}, flat.options());
    int64_t at = 0;
    for (int li : plain_layers_) {
      const auto& l = layers_[size_t(li)];
      std::memcpy(bytes_of(plain_) + at * es, bytes_of(flat) + l.offset * es, size_t(l.numel * es));
      at += l.numel;
    }
    plain_work = group.allreduce(plain_);
    st.bytes_sent += 2 * (P - 1) * plain_elems_ * es / P;
  }

  const bool any_comp = slot_bytes_ > 0 && P > 1;
  if (any_comp) {
    // 2. Quantization #1 of the parts this rank does not own; alltoall to their owners.
    ensure_bytes(send_, P * slot_bytes_);
    ensure_bytes(recv_, P * slot_bytes_);
    const StreamKey k1{opts_.seed, step, uint32_t(me), kPhaseScatter};
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      uint8_t* out = send_.data_ptr<uint8_t>() + r * slot_bytes_;
      for (const auto& run : parts_[size_t(r)]) {
        const char* src = bytes_of(flat) + run.offset * es;
        if (ef) {  // encode x + residual, keep the new residual
          tmp_.resize(size_t(run.numel));
          acc_.resize(size_t(run.numel));
          load_float(flat, run.offset, run.numel, tmp_.data());
          float* res = residual_.data() + run.offset;
          for (int64_t i = 0; i < run.numel; ++i) tmp_[size_t(i)] += res[i];
          encode(tmp_.data(), run.numel, codec, k1, run.first_bucket, out);
          decode(out, run.numel, codec, acc_.data());
          for (int64_t i = 0; i < run.numel; ++i) res[i] = tmp_[size_t(i)] - acc_[size_t(i)];
        } else {
          encode(src, dt, run.numel, codec, k1, run.first_bucket, out);
        }
        out += encoded_bytes(run.numel, codec);
      }
      st.bytes_sent += part_bytes_[size_t(r)];
    }
    group.alltoall(recv_, send_)->wait();

    // 3. Owner: exact own values + decoded copies, (average), quantization #2.
    const auto& mine = parts_[size_t(me)];
    acc_.resize(size_t(part_elems_[size_t(me)]));
    int64_t a = 0;
    for (const auto& run : mine) {
      load_float(flat, run.offset, run.numel, acc_.data() + a);
      if (ef) {
        const float* res = residual_.data() + run.offset;
        for (int64_t i = 0; i < run.numel; ++i) acc_[size_t(a + i)] += res[i];
      }
      a += run.numel;
    }
    for (int r = 0; r < P; ++r) {
      if (r == me) continue;
      const uint8_t* in = recv_.data_ptr<uint8_t>() + r * slot_bytes_;
      a = 0;
      for (const auto& run : mine) {
        decode_add(in, run.numel, codec, acc_.data() + a);  // NaN marks turn into NaN sums
        in += encoded_bytes(run.numel, codec);
        a += run.numel;
      }
    }
    if (average) {
      const float p = float(P);
      for (auto& v : acc_) v /= p;
    }
    ensure_bytes(gather_in_, slot_bytes_);
    ensure_bytes(gather_out_, P * slot_bytes_);
    const StreamKey k2{opts_.seed, step, uint32_t(me), kPhaseGather};
    uint8_t* out = gather_in_.data_ptr<uint8_t>();
    a = 0;
    for (const auto& run : mine) {
      encode(acc_.data() + a, run.numel, codec, k2, run.first_bucket, out);
      if (ef) {  // the owned part's share of the phase-2 error, scaled back to a sum term
        tmp_.resize(size_t(run.numel));
        decode(out, run.numel, codec, tmp_.data());
        float* res = residual_.data() + run.offset;
        const float scale = average ? float(P) : 1.0f;
        for (int64_t i = 0; i < run.numel; ++i) res[i] = (acc_[size_t(a + i)] - tmp_[size_t(i)]) * scale;
      }
      out += encoded_bytes(run.numel, codec);
      a += run.numel;
    }
    st.bytes_sent += (P - 1) * part_bytes_[size_t(me)];

    // 4. Allgather the owners' bytes; every rank (the owner too) decodes every part.
    group.allgather(gather_out_, gather_in_)->wait();
    for (int r = 0; r < P; ++r) {
      const uint8_t* in = gather_out_.data_ptr<uint8_t>() + r * slot_bytes_;
      for (const auto& run : parts_[size_t(r)]) {
        if (decode(in, run.numel, codec, bytes_of(flat) + run.offset * es, dt) >= 0)
          note_bad(run.layer);
        in += encoded_bytes(run.numel, codec);
      }
    }
  }

  // 5. Plain layers back into place (averaged if asked), with their own NaN/Inf check.
  if (plain_work) {
    plain_work->wait();
    if (average) plain_.div_(P);
    int64_t at = 0;
    for (int li : plain_layers_) {
      const auto& l = layers_[size_t(li)];
      std::memcpy(bytes_of(flat) + l.offset * es, bytes_of(plain_) + at * es, size_t(l.numel * es));
      if (!all_finite(bytes_of(plain_) + at * es, dt, l.numel)) note_bad(li);
      at += l.numel;
    }
  }
  if (bad >= 0) {
    const std::string& bad_layer = layers_[size_t(bad)].name;
    throw NonFiniteGradient(bad_layer, detail::concat(
        "NaN or Inf in the gradient of layer '", bad_layer, "' (rank ", me, "/", P,
        ", compressed allreduce call ", step, "): refusing to spread it; check the loss scale "
        "or learning rate of that layer"));
  }
  return st;
}

AllreduceStats compressed_allreduce(comm::ProcessGroup& group, at::Tensor& flat,
                                    const std::vector<LayerSpan>& layers,
                                    const QsgdOptions& options, bool average) {
  CompressedAllreduce plan(options, layers, flat.numel(), group.size());
  return plan.run(group, flat, average);
}

}  // namespace lockstep::compress
