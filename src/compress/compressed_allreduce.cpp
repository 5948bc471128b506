// QSGD scatter-reduce-allgather (see compressed_allreduce.h for the algorithm and contract).
#include <lockstep/compress/compressed_allreduce.h>

#include "compress/device_exchange.h"

#include "compress/float_io.h"
#include "compress/inflight.h"
#include "compress/progress_thread.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <exception>
#include <limits>
#include <mutex>
#include <thread>

namespace lockstep::compress {
namespace {

constexpr uint32_t kPhaseScatter = 1, kPhaseGather = 2;
constexpr int64_t kMaxRounds = 16;  // pipeline rounds per call, at most

char* bytes_of(at::Tensor& t) { return static_cast<char*>(t.data_ptr()); }

// Adds the lifetime of the scope to `acc` (AllreduceStats::seconds).
class PhaseClock {
 public:
  explicit PhaseClock(double& acc) : acc_(acc), t0_(std::chrono::steady_clock::now()) {}
  ~PhaseClock() {
    acc_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  PhaseClock(const PhaseClock&) = delete;
  PhaseClock& operator=(const PhaseClock&) = delete;

 private:
  double& acc_;
  std::chrono::steady_clock::time_point t0_;
};

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
  fill_holes();
  split_parts();
  cut_rounds();
}

// Sorts the layers and fills holes (elements no layer claims) with unnamed plain layers,
// so the whole buffer is reduced; overlapping or out-of-range layers are refused.
void CompressedAllreduce::fill_holes() {
  std::sort(layers_.begin(), layers_.end(),
            [](const LayerSpan& a, const LayerSpan& b) { return a.offset < b.offset; });
  std::vector<LayerSpan> all;
  int64_t at = 0;
  for (const auto& l : layers_) {
    LOCKSTEP_CHECK(l.numel >= 0 && l.offset >= at && l.offset + l.numel <= numel_, "layer '",
                   l.name, "' [", l.offset, ", ", l.offset + l.numel,
                   ") overlaps another or lies outside the buffer of ", numel_);
    if (l.offset > at) all.push_back({"<unnamed>", at, l.offset - at});
    all.push_back(l);
    at = l.offset + l.numel;
  }
  if (at < numel_) all.push_back({"<unnamed>", at, numel_ - at});
  layers_ = std::move(all);
}

// The policy per layer; the global bucket list of compressed layers split into world_
// parts of about equal element count, on bucket boundaries.
void CompressedAllreduce::split_parts() {
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
  int64_t seen = 0;
  uint64_t bucket = 0;
  for (int li : comp) {
    const auto& l = layers_[size_t(li)];
    for (int64_t s = 0; s < l.numel; s += opts_.bucket_size, ++bucket) {
      const int64_t len = std::min(opts_.bucket_size, l.numel - s);
      // The part is fixed by where the bucket starts: boundaries near r * total / P.
      const int r = int(std::min<int64_t>(world_ - 1, (seen * world_) / total));
      auto& runs = parts_[size_t(r)];
      if (!runs.empty() && runs.back().layer == li &&
          runs.back().offset + runs.back().numel == l.offset + s)
        runs.back().numel += len;
      else
        runs.push_back({l.offset + s, len, li, bucket});
      part_elems_[size_t(r)] += len;
      seen += len;
    }
  }
}

// Pipeline rounds: every part is cut into K chunks on bucket boundaries (chunk c of part
// r = its buckets [c*nb_r/K, (c+1)*nb_r/K)). Rounding is keyed by the global bucket index,
// so the decoded values do not depend on K; only the messages do (wire-format.md).
void CompressedAllreduce::cut_rounds() {
  const int64_t max_part = *std::max_element(part_elems_.begin(), part_elems_.end());
  int64_t k = 1;
  if (opts_.pipeline_chunk > 0 && max_part > 0)
    k = std::min<int64_t>(kMaxRounds, (max_part + opts_.pipeline_chunk - 1) / opts_.pipeline_chunk);
  const int K = int(std::max<int64_t>(1, k));
  chunks_.assign(size_t(K), Chunk{});
  for (auto& ch : chunks_) {
    ch.parts.assign(size_t(world_), {});
    ch.part_elems.assign(size_t(world_), 0);
    ch.part_bytes.assign(size_t(world_), 0);
  }
  const int64_t B = opts_.bucket_size;
  for (int r = 0; r < world_; ++r) {
    int64_t nb = 0;
    for (const auto& run : parts_[size_t(r)]) nb += (run.numel + B - 1) / B;
    int64_t j = 0;  // bucket index within the part
    for (const auto& run : parts_[size_t(r)]) {
      for (int64_t s = 0; s < run.numel; s += B, ++j) {
        const int c = int((j * K) / nb);
        const int64_t len = std::min(B, run.numel - s);
        auto& runs = chunks_[size_t(c)].parts[size_t(r)];
        if (!runs.empty() && runs.back().layer == run.layer &&
            runs.back().offset + runs.back().numel == run.offset + s)
          runs.back().numel += len;
        else
          runs.push_back({run.offset + s, len, run.layer, run.first_bucket + uint64_t(s / B)});
        chunks_[size_t(c)].part_elems[size_t(r)] += len;
      }
    }
  }
  const CodecOptions codec = opts_.codec();
  part_bytes_.assign(size_t(world_), 0);
  for (auto& ch : chunks_)
    for (int r = 0; r < world_; ++r) {
      for (const auto& run : ch.parts[size_t(r)])
        ch.part_bytes[size_t(r)] += encoded_bytes(run.numel, codec);
      ch.slot = std::max(ch.slot, ch.part_bytes[size_t(r)]);
      part_bytes_[size_t(r)] += ch.part_bytes[size_t(r)];
    }
  for (int r = 0; r < world_; ++r) slot_bytes_ = std::max(slot_bytes_, part_bytes_[size_t(r)]);
}

comm::WorkPtr CompressedAllreduce::run_async(comm::ProcessGroup& group, at::Tensor flat,
                                             bool average) {
  const int P = group.size(), me = group.rank();
  LOCKSTEP_CHECK_EQ(P, world_, "the plan was made for another world size");
  LOCKSTEP_CHECK(
      flat.defined() && (flat.device().is_cpu() || flat.device().is_cuda()) && flat.is_contiguous(),
      "flat buffer must be contiguous, on the CPU or a CUDA device");
  LOCKSTEP_CHECK_EQ(flat.numel(), numel_, "flat buffer size differs from the plan");
  const at::ScalarType dt = flat.scalar_type();
  LOCKSTEP_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
                 "compressed allreduce takes float32, bfloat16 or float16, not ",
                 c10::toString(dt));
  // One call in flight per plan: a caller that dropped the previous work (e.g. a DDP step
  // abandoned by an exception) waits for it here; its failure, if any, already broke the
  // group and fails the new call as well.
  wait_quietly(inflight_);
  const int64_t es = flat.element_size();
  const uint64_t step = step_++;

  // Statistics are fixed by the plan: computed here, so the caller has them at once.
  AllreduceStats st;
  st.plain_elems = plain_elems_;
  st.compressed_elems = numel_ - plain_elems_;
  st.bytes_uncompressed = P > 1 ? 2 * int64_t(P - 1) * numel_ * es / P : 0;
  if (P > 1 && plain_elems_ > 0) st.bytes_sent += 2 * int64_t(P - 1) * plain_elems_ * es / P;
  if (P > 1 && slot_bytes_ > 0) {
    for (int r = 0; r < P; ++r)
      if (r != me) st.bytes_sent += part_bytes_[size_t(r)];
    st.bytes_sent += (P - 1) * part_bytes_[size_t(me)];
  }
  last_stats_ = st;
  bad_ = -1;
  last_step_ = step;
  last_rank_ = me;
  device_call_ = P > 1 && flat.is_cuda() && DeviceExchange::available() && !opts_.error_feedback &&
                 !(opts_.across_nodes_only && group.backend_name() == "hier");
  if (device_call_) {  // the CUDA codec on the GPU, an allgather of its bytes
    if (!device_) {
      std::vector<bool> compressed(layers_.size(), true);
      for (int li : plain_layers_) compressed[size_t(li)] = false;
      device_ = std::make_unique<DeviceExchange>(layers_, compressed, opts_);
    }
    device_average_ = average;
    phases_ = AllreduceStats::Phases{};
    inflight_ = device_->issue(group, flat, step);
    last_stats_.bytes_sent = device_->bytes_sent(P);
    return inflight_;
  }
  // The whole exchange is ONE composite op on the comm thread: its steps keep the same
  // order on every rank whatever else callers issue meanwhile. `flat` (shared storage)
  // and `this` must stay alive and untouched until the work completed. A CUDA `flat` is
  // exchanged through a pinned host twin (the codec runs on the CPU).
  inflight_ = group.run_composite_on(
      flat,
      [this, average, step](comm::Backend& be, const comm::OpContext& ctx, at::Tensor& host) {
        exchange(be, ctx, host, average, step);
      },
      comm::Millis(0), fingerprint());
  return inflight_;
}

// A digest of everything that shapes the messages (options and the plan's sizes): ranks
// with different compression settings fail with a Mismatch naming it, not garbled steps.
int64_t CompressedAllreduce::fingerprint() const {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  mix(uint64_t(opts_.bits));
  mix(uint64_t(opts_.bucket_size));
  mix(opts_.stochastic);
  mix(opts_.error_feedback);
  mix(uint64_t(plain_elems_));
  mix(uint64_t(slot_bytes_));
  mix(chunks_.size());
  for (int64_t b : part_bytes_) mix(uint64_t(b));
  return int64_t(h >> 11);  // 53 bits: prints exactly, survives any int64 transport
}

CompressedAllreduce::~CompressedAllreduce() {
  // The comm thread may still run this plan's exchange (e.g. after a caller's wait() gave
  // up and broke the group, which makes the backend give up promptly): let it finish.
  while (inflight_ && !inflight_->is_completed())
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
  helper_.reset();  // idle now: the exchange waited for its job
}

AllreduceStats CompressedAllreduce::finish() {
  LOCKSTEP_CHECK(inflight_ && inflight_->is_completed(),
                 "CompressedAllreduce::finish(): call it after the work of run_async() completed");
  if (device_call_) {
    device_call_ = false;
    const int bad = device_->finish(device_average_);
    if (bad >= 0) note_bad(bad);
  }
  if (bad_ >= 0) {
    const std::string& bad_layer = layers_[size_t(bad_)].name;
    bad_ = -1;
    throw NonFiniteGradient(
        bad_layer, lockstep::detail::concat("NaN or Inf in the gradient of layer '", bad_layer,
                                            "' (rank ", last_rank_, "/", world_,
                                            ", compressed allreduce call ", last_step_,
                                            "): refusing to spread it; check the loss "
                                            "scale or learning rate of that layer"));
  }
  last_stats_.seconds = phases_;  // the call completed: its thread(s) are done with phases_
  return last_stats_;
}

AllreduceStats CompressedAllreduce::run(comm::ProcessGroup& group, at::Tensor& flat, bool average) {
  run_async(group, flat, average)->wait();
  return finish();
}

// ---------------------------------------------------------------- the exchange, by phase
//
// Everything below runs inside the composite op (on the group's comm thread, or on a thread
// waiting for the work), except the codec phases of a pipelined call, which run on the
// plan's helper thread. Only the composite's thread calls the backend.

struct CompressedAllreduce::Call {
  const comm::OpContext& ctx;
  at::Tensor& flat;
  bool average;
  int P, me;
  at::ScalarType dt;
  int64_t es;  // element size of flat
  CodecOptions codec;
  bool ef;           // error feedback on (and something crosses a link)
  StreamKey k1, k2;  // rounding streams of quantization #1 (scatter) and #2 (gather)
  // Per round c: byte offset of its slots in send_/recv_/gather_out_ (times P) and in
  // gather_in_, and element offset of my part's chunk in acc_ ([K] = the totals).
  std::vector<int64_t> soff, aoff;
};

// Pipeline hand-off between the composite's thread (transfers) and the helper (codec):
// counts of rounds done per phase; stop() wakes both when either side fails.
struct CompressedAllreduce::RoundProgress {
  std::mutex m;
  std::condition_variable cv;
  int encoded = 0, scattered = 0, reduced = 0, gathered = 0;
  bool abort = false;

  void bump(int& done) {
    {
      std::lock_guard<std::mutex> l(m);
      ++done;
    }
    cv.notify_all();
  }
  // Waits until `done` reached `target`; false if the call is being abandoned.
  bool await(const int& done, int target) {
    std::unique_lock<std::mutex> l(m);
    cv.wait(l, [&] { return abort || done >= target; });
    return !abort;
  }
  void stop() {
    {
      std::lock_guard<std::mutex> l(m);
      abort = true;
    }
    cv.notify_all();
  }
};

void CompressedAllreduce::exchange(comm::Backend& be, const comm::OpContext& ctx, at::Tensor& flat,
                                   bool average, uint64_t step) {
  const comm::Backend::Levels lv = be.levels();
  if (opts_.across_nodes_only && lv.node && lv.across)
    return exchange_levels(*lv.node, *lv.across, ctx, flat, average, step);
  phases_ = AllreduceStats::Phases{};
  const Call call = start_call(be, ctx, flat, average, step);
  if (call.P == 1) {  // nothing crosses a link: no quantization, only the NaN/Inf check
    check_finite_local(call);
    return;
  }
  if (plain_elems_ > 0) {  // 1. plain layers, one allreduce
    PhaseClock clock(phases_.plain);
    allreduce_plain(be, call);
  }
  if (slot_bytes_ > 0) exchange_compressed(be, call);  // 2.-4. the compressed layers
  if (plain_elems_ > 0) place_plain(call);             // 5. plain layers back into place
}

// Two levels (compressed_allreduce.h): this local rank's share of the buffer, a whole
// number of buckets, and the plan of the compressed layers' pieces in it among the N ranks
// of its cross-node group. Layers stay compressed or plain as in this plan (the pieces of
// plain layers are left to the share plan's plain path); each local rank's rounding
// stream has its own seed.
void CompressedAllreduce::make_share_plan(int per_node, int local, int nodes) {
  const int64_t B = opts_.bucket_size;
  share_ = ((numel_ + per_node - 1) / per_node + B - 1) / B * B;
  const int64_t lo = local * share_, hi = lo + share_;
  std::vector<LayerSpan> pieces;
  for (const auto& l : layers_) {
    if (l.name == "<unnamed>" || !should_compress(opts_, l.name, l.numel)) continue;
    const int64_t a = std::max(l.offset, lo), b = std::min(l.offset + l.numel, hi);
    if (a < b) pieces.push_back({l.name, a - lo, b - a});
  }
  QsgdOptions o = opts_;
  o.min_layer = 0;
  o.exclude.clear();
  o.seed = opts_.seed + 0x9e3779b97f4a7c15ull * uint64_t(local + 1);
  share_plan_ = std::make_unique<CompressedAllreduce>(o, std::move(pieces), share_, nodes);
}

void CompressedAllreduce::exchange_levels(comm::Backend& node, comm::Backend& across,
                                          const comm::OpContext& ctx, at::Tensor& flat,
                                          bool average, uint64_t step) {
  const int L = node.size(), local = node.rank();
  const at::ScalarType dt = flat.scalar_type();
  if (!share_plan_) make_share_plan(L, local, across.size());
  const int64_t padded_n = share_ * L;
  at::Tensor whole = flat;
  if (padded_n != numel_) {  // the padding stays zero: its sums are zero
    if (!padded_.defined() || padded_.scalar_type() != dt)
      padded_ = at::zeros({padded_n}, flat.options());
    padded_.narrow(0, 0, numel_).copy_(flat);
    whole = padded_;
  }
  if (!share_buf_.defined() || share_buf_.scalar_type() != dt)
    share_buf_ = at::empty({share_}, flat.options());
  node.reduce_scatter(share_buf_, whole, comm::ReduceOp::Sum,
                      comm::step_context(ctx, comm::OpKind::ReduceScatter, padded_n, dt));
  share_plan_->bad_ = -1;
  share_plan_->exchange(across, ctx, share_buf_, average, step);
  phases_ = share_plan_->phases_;
  if (average) share_buf_.div_(L);
  node.allgather(whole, share_buf_, comm::step_context(ctx, comm::OpKind::Allgather, share_, dt));
  if (whole.data_ptr() != flat.data_ptr()) flat.copy_(whole.narrow(0, 0, numel_));
  // The first non-finite layer (by element offset), agreed on inside the node: the share
  // plans of a cross-node group agree already, those of one node see different shares.
  int64_t first = std::numeric_limits<int64_t>::max();
  if (share_plan_->bad_ >= 0)
    first = local * share_ + share_plan_->layers_[size_t(share_plan_->bad_)].offset;
  at::Tensor f = at::full({1}, first, at::kLong);
  node.allreduce(f, comm::ReduceOp::Min,
                 comm::step_context(ctx, comm::OpKind::Allreduce, 1, at::kLong));
  first = f.item<int64_t>();
  for (int i = 0; i < int(layers_.size()) && first < numel_; ++i)
    if (first >= layers_[size_t(i)].offset &&
        first < layers_[size_t(i)].offset + layers_[size_t(i)].numel)
      note_bad(i);
}

CompressedAllreduce::Call CompressedAllreduce::start_call(const comm::Backend& be,
                                                          const comm::OpContext& ctx,
                                                          at::Tensor& flat, bool average,
                                                          uint64_t step) {
  const int P = be.size(), me = be.rank();
  const bool ef = opts_.error_feedback && P > 1;
  if (ef && residual_.size() != size_t(numel_)) residual_.assign(size_t(numel_), 0.0f);
  const int K = rounds();
  std::vector<int64_t> soff(size_t(K) + 1, 0), aoff(size_t(K) + 1, 0);
  for (int c = 0; c < K; ++c) {
    soff[size_t(c) + 1] = soff[size_t(c)] + chunks_[size_t(c)].slot;
    aoff[size_t(c) + 1] = aoff[size_t(c)] + chunks_[size_t(c)].part_elems[size_t(me)];
  }
  return Call{ctx,
              flat,
              average,
              P,
              me,
              flat.scalar_type(),
              int64_t(flat.element_size()),
              opts_.codec(),
              ef,
              StreamKey{opts_.seed, step, uint32_t(me), kPhaseScatter},
              StreamKey{opts_.seed, step, uint32_t(me), kPhaseGather},
              std::move(soff),
              std::move(aoff)};
}

// First non-finite layer in buffer order: the same on every rank, since all decode the
// same bytes and see the same plain sums.
void CompressedAllreduce::note_bad(int layer) {
  if (bad_ < 0 || layers_[size_t(layer)].offset < layers_[size_t(bad_)].offset) bad_ = layer;
}

void CompressedAllreduce::check_finite_local(const Call& call) {
  for (size_t i = 0; i < layers_.size(); ++i)
    if (!all_finite(bytes_of(call.flat) + layers_[i].offset * call.es, call.dt, layers_[i].numel)) {
      note_bad(int(i));
      return;
    }
}

// 1. The plain layers, concatenated into plain_, in one allreduce.
void CompressedAllreduce::allreduce_plain(comm::Backend& be, const Call& call) {
  const int64_t es = call.es;
  if (!plain_.defined() || plain_.numel() != plain_elems_ || plain_.scalar_type() != call.dt)
    plain_ = at::empty({plain_elems_}, call.flat.options());
  int64_t at = 0;
  for (int li : plain_layers_) {
    const auto& l = layers_[size_t(li)];
    std::memcpy(bytes_of(plain_) + at * es, bytes_of(call.flat) + l.offset * es,
                size_t(l.numel * es));
    at += l.numel;
  }
  be.allreduce(plain_, comm::ReduceOp::Sum,
               comm::step_context(call.ctx, comm::OpKind::Allreduce, plain_elems_, call.dt));
}

// 5. The plain sums back into place (averaged if asked), with their own NaN/Inf check.
void CompressedAllreduce::place_plain(const Call& call) {
  const int64_t es = call.es;
  if (call.average) plain_.div_(call.P);
  int64_t at = 0;
  for (int li : plain_layers_) {
    const auto& l = layers_[size_t(li)];
    std::memcpy(bytes_of(call.flat) + l.offset * es, bytes_of(plain_) + at * es,
                size_t(l.numel * es));
    if (!all_finite(bytes_of(plain_) + at * es, call.dt, l.numel)) note_bad(li);
    at += l.numel;
  }
}

// 2.-4. The compressed layers: one round at a time on this thread, or pipelined.
void CompressedAllreduce::exchange_compressed(comm::Backend& be, const Call& call) {
  const int64_t total = call.soff.back();  // slot bytes summed over the rounds
  ensure_bytes(send_, call.P * total);
  ensure_bytes(recv_, call.P * total);
  ensure_bytes(gather_in_, total);
  ensure_bytes(gather_out_, call.P * total);
  acc_.resize(size_t(part_elems_[size_t(call.me)]));
  if (rounds() > 1) {
    run_pipelined(be, call);
    return;
  }
  encode_round(call, 0);
  alltoall_round(be, call, 0);
  sum_round(call, 0);
  reencode_round(call, 0);
  allgather_round(be, call, 0);
  decode_round(call, 0);
}

// Pipeline: this thread makes only the backend calls, in a fixed order (alltoall 0..K-1,
// then allgather 0..K-1: the same on every rank); the helper does all the codec work in
// dependency order, so encoding round c+1 and reducing round c overlap the transfer of
// round c. A failure on either side stops the other; the helper is always waited for
// before this returns, since the job references this call's state.
void CompressedAllreduce::run_pipelined(comm::Backend& be, const Call& call) {
  if (!helper_) helper_ = std::make_unique<ProgressThread>();
  RoundProgress progress;
  helper_->post([this, &call, &progress] { codec_rounds(call, progress); });
  try {
    transfer_rounds(be, call, progress);
  } catch (...) {
    progress.stop();
    try {
      helper_->wait();
    } catch (...) {  // the transfer's failure is the one to report
    }
    throw;
  }
  helper_->wait();  // rethrows the helper's failure, if any
}

// The transfers' wait for the codec, timed (AllreduceStats::seconds.transfer_wait).
bool CompressedAllreduce::await_codec(RoundProgress& progress, const int& done, int target) {
  PhaseClock clock(phases_.transfer_wait);
  return progress.await(done, target);
}

// The composite's side of the pipeline: each round's transfer once its input is ready.
void CompressedAllreduce::transfer_rounds(comm::Backend& be, const Call& call,
                                          RoundProgress& progress) {
  const int K = rounds();
  for (int c = 0; c < K; ++c) {
    if (!await_codec(progress, progress.encoded, c + 1)) return;  // helper failed: see wait()
    alltoall_round(be, call, c);
    progress.bump(progress.scattered);
  }
  for (int c = 0; c < K; ++c) {
    if (!await_codec(progress, progress.reduced, c + 1)) return;
    allgather_round(be, call, c);
    progress.bump(progress.gathered);
  }
}

// The helper's side: every codec phase of every round, each once its input arrived.
void CompressedAllreduce::codec_rounds(const Call& call, RoundProgress& progress) {
  const int K = rounds();
  try {
    for (int c = 0; c < K; ++c) {
      encode_round(call, c);
      progress.bump(progress.encoded);
    }
    for (int c = 0; c < K; ++c) {
      if (!progress.await(progress.scattered, c + 1)) return;
      sum_round(call, c);
      reencode_round(call, c);
      progress.bump(progress.reduced);
    }
    for (int c = 0; c < K; ++c) {
      if (!progress.await(progress.gathered, c + 1)) return;
      decode_round(call, c);
    }
  } catch (...) {
    progress.stop();  // unblock the transfers; the exception reaches them through wait()
    throw;
  }
}

// 2. Round c, quantization #1 of the parts this rank does not own, into their send slots.
void CompressedAllreduce::encode_round(const Call& call, int c) {
  PhaseClock clock(phases_.encode);
  const Chunk& ch = chunks_[size_t(c)];
  for (int r = 0; r < call.P; ++r) {
    if (r == call.me) continue;
    uint8_t* out = send_.data_ptr<uint8_t>() + call.P * call.soff[size_t(c)] + r * ch.slot;
    for (const auto& run : ch.parts[size_t(r)]) {
      if (call.ef)
        encode_with_feedback(call, run, out);
      else
        encode(bytes_of(call.flat) + run.offset * call.es, call.dt, run.numel, call.codec, call.k1,
               run.first_bucket, out);
      out += encoded_bytes(run.numel, call.codec);
    }
  }
}

// Error feedback, phase 1: encode x + residual, keep the new residual x + residual - Q1.
void CompressedAllreduce::encode_with_feedback(const Call& call, const Run& run, uint8_t* out) {
  ef_x_.resize(size_t(run.numel));
  ef_q_.resize(size_t(run.numel));
  load_float(call.flat, run.offset, run.numel, ef_x_.data());
  float* res = residual_.data() + run.offset;
  for (int64_t i = 0; i < run.numel; ++i) ef_x_[size_t(i)] += res[i];
  encode(ef_x_.data(), run.numel, call.codec, call.k1, run.first_bucket, out);
  decode(out, run.numel, call.codec, ef_q_.data());
  for (int64_t i = 0; i < run.numel; ++i) res[i] = ef_x_[size_t(i)] - ef_q_[size_t(i)];
}

// Round c's alltoall: slot r of my send bytes goes to owner r.
void CompressedAllreduce::alltoall_round(comm::Backend& be, const Call& call, int c) {
  PhaseClock clock(phases_.alltoall);
  const int64_t slot = chunks_[size_t(c)].slot;
  at::Tensor o = recv_.narrow(0, call.P * call.soff[size_t(c)], call.P * slot);
  at::Tensor i = send_.narrow(0, call.P * call.soff[size_t(c)], call.P * slot);
  be.alltoall(o, i, comm::step_context(call.ctx, comm::OpKind::Alltoall, call.P * slot, at::kByte));
}

// 3. Round c, owner: exact own values (+ residual) + the decoded copies of the others, in
// rank order, in float32 (averaged if asked). NaN marks turn into NaN sums.
void CompressedAllreduce::sum_round(const Call& call, int c) {
  PhaseClock clock(phases_.reduce);
  const Chunk& ch = chunks_[size_t(c)];
  const auto& mine = ch.parts[size_t(call.me)];
  float* acc = acc_.data() + call.aoff[size_t(c)];
  int64_t a = 0;
  for (const auto& run : mine) {
    load_float(call.flat, run.offset, run.numel, acc + a);
    if (call.ef) {
      const float* res = residual_.data() + run.offset;
      for (int64_t i = 0; i < run.numel; ++i) acc[a + i] += res[i];
    }
    a += run.numel;
  }
  for (int r = 0; r < call.P; ++r) {
    if (r == call.me) continue;
    const uint8_t* in = recv_.data_ptr<uint8_t>() + call.P * call.soff[size_t(c)] + r * ch.slot;
    a = 0;
    for (const auto& run : mine) {
      decode_add(in, run.numel, call.codec, acc + a);
      in += encoded_bytes(run.numel, call.codec);
      a += run.numel;
    }
  }
  if (call.average) {
    const float p = float(call.P);
    for (int64_t i = 0; i < ch.part_elems[size_t(call.me)]; ++i) acc[i] /= p;
  }
}

// 3. Round c, owner: quantization #2 of the sum into my gather slot; with error feedback,
// the owned part's share of its error, scaled back to a sum term.
void CompressedAllreduce::reencode_round(const Call& call, int c) {
  PhaseClock clock(phases_.reencode);
  const auto& mine = chunks_[size_t(c)].parts[size_t(call.me)];
  const float* acc = acc_.data() + call.aoff[size_t(c)];
  uint8_t* out = gather_in_.data_ptr<uint8_t>() + call.soff[size_t(c)];
  int64_t a = 0;
  for (const auto& run : mine) {
    encode(acc + a, run.numel, call.codec, call.k2, run.first_bucket, out);
    if (call.ef) {
      tmp_.resize(size_t(run.numel));
      decode(out, run.numel, call.codec, tmp_.data());
      float* res = residual_.data() + run.offset;
      const float scale = call.average ? float(call.P) : 1.0f;
      for (int64_t i = 0; i < run.numel; ++i) res[i] = (acc[a + i] - tmp_[size_t(i)]) * scale;
    }
    out += encoded_bytes(run.numel, call.codec);
    a += run.numel;
  }
}

// Round c's allgather: every owner's re-encoded bytes to every rank.
void CompressedAllreduce::allgather_round(comm::Backend& be, const Call& call, int c) {
  PhaseClock clock(phases_.allgather);
  const int64_t slot = chunks_[size_t(c)].slot;
  at::Tensor o = gather_out_.narrow(0, call.P * call.soff[size_t(c)], call.P * slot);
  at::Tensor i = gather_in_.narrow(0, call.soff[size_t(c)], slot);
  be.allgather(o, i, comm::step_context(call.ctx, comm::OpKind::Allgather, slot, at::kByte));
}

// 4. Round c: every rank (the owner too) decodes every owner's bytes into its buffer, so
// all replicas hold the same bits.
void CompressedAllreduce::decode_round(const Call& call, int c) {
  PhaseClock clock(phases_.decode);
  const Chunk& ch = chunks_[size_t(c)];
  for (int r = 0; r < call.P; ++r) {
    const uint8_t* in =
        gather_out_.data_ptr<uint8_t>() + call.P * call.soff[size_t(c)] + r * ch.slot;
    for (const auto& run : ch.parts[size_t(r)]) {
      if (decode(in, run.numel, call.codec, bytes_of(call.flat) + run.offset * call.es, call.dt) >=
          0)
        note_bad(run.layer);
      in += encoded_bytes(run.numel, call.codec);
    }
  }
}

AllreduceStats compressed_allreduce(comm::ProcessGroup& group, at::Tensor& flat,
                                    const std::vector<LayerSpan>& layers,
                                    const QsgdOptions& options, bool average) {
  CompressedAllreduce plan(options, layers, flat.numel(), group.size());
  return plan.run(group, flat, average);
}

}  // namespace lockstep::compress
