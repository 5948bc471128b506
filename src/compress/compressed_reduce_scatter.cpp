// QSGD reduce-scatter (see compressed_reduce_scatter.h for the algorithm and contract).
#include <lockstep/compress/compressed_reduce_scatter.h>

#include "compress/float_io.h"
#include "compress/inflight.h"
#include "compress/shard_plan.h"

#include <ATen/ATen.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>

namespace lockstep::compress {
namespace {

constexpr uint32_t kPhaseReduceScatter = 3;  // the StreamKey phase of this collective
constexpr int64_t kNone = std::numeric_limits<int64_t>::max();

void reserve_bytes(at::Tensor& t, int64_t n) {
  if (!t.defined() || t.numel() < n) t = at::empty({n}, at::TensorOptions().dtype(at::kByte));
}

int64_t earliest(int64_t a, int64_t b) {
  if (a < 0) return b;
  if (b < 0) return a;
  return std::min(a, b);
}

}  // namespace

CompressedReduceScatter::CompressedReduceScatter(QsgdOptions options, std::vector<LayerSpan> layers,
                                                 int64_t part_numel, int world_size)
    : opts_(std::move(options)), n_(part_numel), world_(world_size) {
  validate(opts_);
  LOCKSTEP_CHECK(world_ >= 1 && n_ >= 0, "compressed reduce-scatter: bad size");
  plan_ = std::make_unique<ShardPlan>(ShardPlan::flat(opts_, std::move(layers), n_, world_));
}

CompressedReduceScatter::~CompressedReduceScatter() { wait_quietly(inflight_); }

comm::WorkPtr CompressedReduceScatter::run_async(comm::ProcessGroup& group, at::Tensor out,
                                                 at::Tensor in, bool average) {
  LOCKSTEP_CHECK_EQ(group.size(), world_, "the plan was made for another world size");
  const auto dt = in.scalar_type();
  LOCKSTEP_CHECK(dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf,
                 "compressed reduce-scatter takes float32, bfloat16 or float16, not ",
                 c10::toString(dt));
  LOCKSTEP_CHECK(in.device().is_cpu() && in.is_contiguous() && out.is_contiguous() &&
                     in.numel() == world_ * n_ && out.numel() == n_ && out.scalar_type() == dt,
                 "compressed reduce-scatter: in must hold world_size * part_numel values and out "
                 "part_numel of the same dtype, contiguous on the CPU");
  wait_quietly(inflight_);  // one call in flight per plan
  const uint64_t step = step_++;
  bad_ = -1;
  bytes_plain_ = int64_t(world_ - 1) * n_ * int64_t(in.element_size());
  inflight_ = group.run_composite(
      world_ * n_, dt,
      [this, out, in, average, step](comm::Backend& be, const comm::OpContext& ctx) mutable {
        exchange(be, ctx, out, in, average, step);
      },
      comm::Millis(0), plan_->fingerprint(opts_.codec()));
  return inflight_;
}

void CompressedReduceScatter::finish() {
  if (bad_ < 0) return;
  const std::string layer = plan_->layer_at(bad_);
  throw NonFiniteGradient(
      layer, lockstep::detail::concat("non-finite gradient (NaN or Inf) in layer '", layer,
                                      "' (element ", bad_,
                                      " of the flat buffer) met by the compressed "
                                      "reduce-scatter; the step's gradients are not usable"));
}

void CompressedReduceScatter::run(comm::ProcessGroup& group, at::Tensor out, at::Tensor in,
                                  bool average) {
  run_async(group, std::move(out), std::move(in), average)->wait();
  finish();
}

void CompressedReduceScatter::exchange(comm::Backend& be, const comm::OpContext& ctx,
                                       at::Tensor& out, at::Tensor& in, bool average,
                                       uint64_t step) {
  const comm::Backend::Levels lv = be.levels();
  if (opts_.across_nodes_only && lv.node && lv.across && lv.node->size() > 1)
    return levels(*lv.node, *lv.across, ctx, out, in, average, step);
  bytes_sent_ = 0;
  bad_ = flat(be, ctx, *plan_, opts_, out, in, average ? be.size() : 1, step);
}

// One level: parts p of `in` at p * n, of `plan`'s part p; returns the first non-finite
// original offset over every rank of `be` (-1: none).
int64_t CompressedReduceScatter::flat(comm::Backend& be, const comm::OpContext& ctx,
                                      const ShardPlan& plan, const QsgdOptions& o, at::Tensor& out,
                                      const at::Tensor& in, int divisor, uint64_t step) {
  const int P = be.size(), me = be.rank();
  const CodecOptions codec = o.codec();
  acc_.resize(size_t(n_));
  load_float(in, me * n_, n_, acc_.data());
  int64_t bad = -1;
  if (!all_finite(acc_.data(), n_)) {
    const auto it =
        std::find_if(acc_.begin(), acc_.end(), [](float v) { return !std::isfinite(v); });
    bad = plan.part_start(me) + (it - acc_.begin());
  }
  if (P > 1) {
    const int64_t slot = 8 + (plan.max_part_bytes() + 7) / 8 * 8;
    reserve_bytes(send_, P * slot);
    reserve_bytes(recv_, P * slot);
    uint8_t* send = send_.data_ptr<uint8_t>();
    const StreamKey key{o.seed, step, uint32_t(me), kPhaseReduceScatter};
    for (int p = 0; p < P; ++p)
      if (p != me) {
        bad = earliest(bad, plan.encode(p, in, p * n_, codec, key, send + p * slot + 8));
        bytes_sent_ += 8 + plan.part_bytes(p);
      }
    for (int p = 0; p < P; ++p) std::memcpy(send + p * slot, &bad, 8);
    at::Tensor r = recv_.narrow(0, 0, P * slot), s = send_.narrow(0, 0, P * slot);
    be.alltoall(r, s, comm::step_context(ctx, comm::OpKind::Alltoall, P * slot, at::kByte));
    const uint8_t* recv = recv_.data_ptr<uint8_t>();
    for (int q = 0; q < P; ++q) {
      if (q == me) continue;
      int64_t theirs = -1;
      std::memcpy(&theirs, recv + q * slot, 8);
      bad = earliest(bad, theirs);
      plan.decode_add(me, recv + q * slot + 8, codec, acc_.data());
    }
  }
  if (divisor > 1)
    for (float& v : acc_) v /= float(divisor);
  store_float(acc_.data(), n_, out, 0);
  return bad;
}

// Two levels (compressed_reduce_scatter.h). perm_ holds the parts in local-rank-major
// order, so the node's reduce-scatter leaves local rank l the parts of ranks (0..N-1, l).
void CompressedReduceScatter::levels(comm::Backend& node, comm::Backend& across,
                                     const comm::OpContext& ctx, at::Tensor& out,
                                     const at::Tensor& in, bool average, uint64_t step) {
  const int L = node.size(), l = node.rank(), N = across.size();
  const auto dt = in.scalar_type();
  if (!share_plan_) {
    std::vector<int64_t> starts(static_cast<size_t>(N));
    for (int p = 0; p < N; ++p) starts[size_t(p)] = (int64_t(p) * L + l) * n_;
    share_opts_ = opts_;
    share_opts_.seed = opts_.seed + 0x9e3779b97f4a7c15ull * uint64_t(l + 1);
    share_plan_ = std::make_unique<ShardPlan>(share_opts_, plan_->layers(), n_, std::move(starts));
  }
  if (!perm_.defined() || perm_.scalar_type() != dt) {
    perm_ = at::empty({world_ * n_}, in.options());
    share_ = at::empty({N * n_}, in.options());
  }
  for (int p = 0; p < N; ++p)
    for (int j = 0; j < L; ++j)
      perm_.narrow(0, (int64_t(j) * N + p) * n_, n_)
          .copy_(in.narrow(0, (int64_t(p) * L + j) * n_, n_));
  node.reduce_scatter(share_, perm_, comm::ReduceOp::Sum,
                      comm::step_context(ctx, comm::OpKind::ReduceScatter, world_ * n_, dt));
  bytes_sent_ = int64_t(L - 1) * N * n_ * int64_t(in.element_size());
  int64_t bad =
      flat(across, ctx, *share_plan_, share_opts_, out, share_, average ? N * L : 1, step);
  // Agreed on inside the node: each local rank saw only the values of its own parts.
  at::Tensor f = at::full({1}, bad < 0 ? kNone : bad, at::kLong);
  node.allreduce(f, comm::ReduceOp::Min,
                 comm::step_context(ctx, comm::OpKind::Allreduce, 1, at::kLong));
  bad = f.item<int64_t>();
  bad_ = bad == kNone ? -1 : bad;
}

}  // namespace lockstep::compress
