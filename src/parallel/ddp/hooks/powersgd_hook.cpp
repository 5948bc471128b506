// The PowerSGD DDP communication hook; see include/lockstep/parallel/ddp/hooks/powersgd_hook.h.
#include <lockstep/parallel/ddp/hooks/powersgd_hook.h>

#include "powersgd_linalg.h"

#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/core/grad_mode.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace lockstep::ddp::hooks {

void validate(const PowerSgdOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("PowerSgdOptions: " + what); };
  if (o.matrix_approximation_rank < 1)
    bad("matrix_approximation_rank = " + std::to_string(o.matrix_approximation_rank) +
        ": the rank must be at least 1 (1, 2, 4 are usual)");
  if (o.start_iter < 0) bad("start_iter = " + std::to_string(o.start_iter) + ": must be >= 0");
  if ((o.use_error_feedback || o.warm_start) && o.start_iter < 2)
    bad("start_iter = " + std::to_string(o.start_iter) +
        ": with use_error_feedback or warm_start it must be >= 2 (DDP rebuilds its buckets "
        "after the first step, which the kept error and Q would not survive); raise it or "
        "turn both off");
  if (!std::isfinite(o.min_compression_rate) || o.min_compression_rate < 0)
    bad("min_compression_rate = " + std::to_string(o.min_compression_rate) +
        ": must be a finite number >= 0 (2 = compress what shrinks by more than 2x)");
  if (!std::isfinite(o.orthogonalization_epsilon) || o.orthogonalization_epsilon < 0)
    bad("orthogonalization_epsilon = " + std::to_string(o.orthogonalization_epsilon) +
        ": must be a finite number >= 0 (0, or e.g. 1e-8)");
}

PowerSgdState::PowerSgdState(PowerSgdOptions options)
    : options_((validate(options), options)), seeds_(options.random_seed) {}

int64_t PowerSgdState::iter() const {
  std::lock_guard<std::mutex> lk(mu_);
  return iter_;
}

void PowerSgdState::set_iter(int64_t iter) {
  LOCKSTEP_CHECK(iter >= 0, "PowerSgdState::set_iter: negative step ", iter);
  std::lock_guard<std::mutex> lk(mu_);
  iter_ = iter;
}

std::shared_ptr<const PowerSgdState::Bucket> PowerSgdState::bucket(int64_t index) const {
  std::lock_guard<std::mutex> lk(mu_);
  auto it = buckets_.find(index);
  return it == buckets_.end() ? nullptr : it->second;
}

namespace {

// One compressed gradient: buffer[offset, offset + n m) seen as n x m, its P and Q at
// p_off (n x r) and q_off (m x r) of the bucket's flat P and Q memory.
struct Matrix {
  int64_t offset = 0, n = 0, m = 0, r = 0, p_off = 0, q_off = 0;
};

// Which gradients of a bucket are compressed and where their pieces go; a function of the
// layout and the options only, hence the same on every rank.
struct Plan {
  std::vector<Matrix> compressed;                  // PyTorch's order (see group_by_shape)
  std::vector<std::pair<int64_t, int64_t>> plain;  // (offset, numel), bucket order
  int64_t plain_numel = 0, p_numel = 0, q_numel = 0;
};

// PyTorch iterates the compressed matrices grouped by shape, groups in the order of their
// first member: P/Q memory and the initial Qs' draws follow that order.
std::vector<Matrix> group_by_shape(const std::vector<Matrix>& in) {
  std::vector<std::pair<int64_t, int64_t>> shapes;
  for (const Matrix& x : in) {
    const std::pair<int64_t, int64_t> s{x.n, x.m};
    bool seen = false;
    for (const auto& t : shapes) seen = seen || t == s;
    if (!seen) shapes.push_back(s);
  }
  std::vector<Matrix> out;
  for (const auto& s : shapes)
    for (const Matrix& x : in)
      if (x.n == s.first && x.m == s.second) out.push_back(x);
  return out;
}

Plan make_plan(const GradBucket& b, const PowerSgdOptions& o) {
  Plan plan;
  std::vector<Matrix> chosen;
  for (size_t i = 0; i < b.shapes.size(); ++i) {
    const int64_t numel = b.numels[i];
    const int64_t n = b.shapes[i].empty() ? 1 : b.shapes[i][0];
    const int64_t m = n > 0 ? numel / n : 0;
    const int64_t r = std::min({n, m, o.matrix_approximation_rank});
    const bool worth = !b.shapes[i].empty() && n > 0 &&
                       double((n + m) * r) * o.min_compression_rate < double(n * m);
    if (worth) {
      chosen.push_back(Matrix{b.offsets[i], n, m, r, 0, 0});
    } else if (numel > 0) {
      plan.plain.emplace_back(b.offsets[i], numel);
      plan.plain_numel += numel;
    }
  }
  plan.compressed = group_by_shape(chosen);
  for (Matrix& x : plan.compressed) {
    x.p_off = plan.p_numel;
    x.q_off = plan.q_numel;
    plan.p_numel += x.n * x.r;
    plan.q_numel += x.m * x.r;
  }
  return plan;
}

std::vector<int64_t> layout_of(const GradBucket& b) {
  std::vector<int64_t> sig{b.buffer.numel(), int64_t(b.buffer.scalar_type()), b.world_size};
  for (size_t i = 0; i < b.offsets.size(); ++i) {
    sig.push_back(b.offsets[i]);
    sig.push_back(int64_t(b.shapes[i].size()));
    for (int64_t d : b.shapes[i]) sig.push_back(d);
  }
  return sig;
}

// Everything that shapes the exchange: ranks that disagree get CommError(Mismatch).
int64_t fingerprint(const PowerSgdOptions& o, const Plan& plan, bool fresh_q, uint32_t seed) {
  uint64_t h = 1469598103934665603ull;
  auto mix = [&h](uint64_t v) { h = (h ^ v) * 1099511628211ull; };
  auto bits = [](double d) {
    uint64_t u = 0;
    std::memcpy(&u, &d, sizeof u);
    return u;
  };
  mix(uint64_t(o.matrix_approximation_rank));
  mix(bits(o.min_compression_rate));
  // Each rank orthogonalises the summed P itself: a different epsilon would fork replicas.
  mix(bits(o.orthogonalization_epsilon));
  mix(o.use_error_feedback);
  mix(o.warm_start);
  mix(fresh_q);
  mix(seed);
  mix(uint64_t(plan.plain_numel));
  mix(uint64_t(plan.p_numel));
  mix(uint64_t(plan.q_numel));
  return int64_t(h >> 11);  // 53 bits, as the compressed allreduce's
}

// One step of one bucket, run on the comm thread as a composite op.
struct Exchange {
  std::shared_ptr<PowerSgdState::Bucket> state;
  Plan plan;
  PowerSgdOptions options;
  at::Tensor buf;
  bool fresh_q = false;
  uint32_t seed = 0;
  int world = 1;

  at::Tensor grad(const Matrix& x) const {
    return buf.narrow(0, x.offset, x.n * x.m).view({x.n, x.m});
  }
  at::Tensor p(const Matrix& x) const {
    return state->p.narrow(0, x.p_off, x.n * x.r).view({x.n, x.r});
  }
  at::Tensor q(const Matrix& x) const {
    return state->q.narrow(0, x.q_off, x.m * x.r).view({x.m, x.r});
  }

  void sum(comm::Backend& be, const comm::OpContext& ctx, at::Tensor& t) const {
    if (world > 1 && t.numel() > 0)
      be.allreduce(t, comm::ReduceOp::Sum,
                   comm::step_context(ctx, comm::OpKind::Allreduce, t.numel(), t.scalar_type()));
  }

  // The gradients left uncompressed: one flat allreduce (already divided: the sum is the mean).
  void reduce_plain(comm::Backend& be, const comm::OpContext& ctx) const {
    if (plan.plain.empty()) return;
    std::vector<at::Tensor> parts;
    for (const auto& s : plan.plain) parts.push_back(buf.narrow(0, s.first, s.second));
    at::Tensor flat = at::cat(parts);
    sum(be, ctx, flat);
    int64_t at_ = 0;
    for (size_t i = 0; i < parts.size(); ++i) {
      parts[i].copy_(flat.narrow(0, at_, parts[i].numel()));
      at_ += parts[i].numel();
    }
  }

  // A fresh Q drawn as PyTorch draws it (one generator per bucket, tensors in plan order),
  // or the previous step's; orthogonalised either way.
  void prepare_q() const {
    if (fresh_q) {
      // On the CPU whatever the bucket's device, as PyTorch draws them.
      auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(seed));
      const auto cpu = at::TensorOptions().dtype(buf.scalar_type());
      for (const Matrix& x : plan.compressed)
        q(x).copy_(at::randn({1, x.m, x.r}, gen, cpu).view({x.m, x.r}));
    }
    for (const Matrix& x : plan.compressed)
      powersgd::orthogonalize(q(x), options.orthogonalization_epsilon);
  }

  void run(comm::Backend& be, const comm::OpContext& ctx) {
    at::NoGradGuard no_grad;
    at::Tensor input;  // this rank's gradient plus its carried error (error feedback)
    if (options.use_error_feedback) {
      if (state->error.defined()) buf.add_(state->error);
      input = buf.clone();
    }
    reduce_plain(be, ctx);
    if (!plan.compressed.empty()) {
      prepare_q();
      for (const Matrix& x : plan.compressed) {
        at::Tensor px = p(x);
        at::mm_out(px, grad(x), q(x));
      }
      sum(be, ctx, state->p);  // orthogonalised next: no division needed
      for (const Matrix& x : plan.compressed) {
        at::Tensor px = p(x), qx = q(x);
        powersgd::orthogonalize(px, options.orthogonalization_epsilon);
        at::mm_out(qx, grad(x).t(), px);
      }
      sum(be, ctx, state->q);  // of the divided gradients: the mean's projection
      for (const Matrix& x : plan.compressed) {
        at::Tensor g = grad(x);
        at::mm_out(g, p(x), q(x).t());
      }
    }
    // A result that is not finite (the same bits on every rank) must not live on in the
    // error and Q: drop both on every rank alike, so the next step starts afresh (e.g. after
    // an fp16 loss-scale overflow that the step then skips). PyTorch's hook keeps them.
    if (!at::isfinite(buf).all().item<bool>()) {
      state->error = state->p = state->q = at::Tensor();
      return;
    }
    // PyTorch keeps input - result in raw units; the input here is divided by the world size.
    if (options.use_error_feedback) state->error = input.sub_(buf.div(double(world)));
  }
};

}  // namespace

// The hook's access to the state's private members.
struct PowerSgdAccess {
  static HookResult call(PowerSgdState& s, comm::ProcessGroup& group, const GradBucket& bucket) {
    at::Tensor buf = bucket.buffer;
    const auto dt = buf.scalar_type();
    std::unique_lock<std::mutex> lk(s.mu_);
    // Every rank counts the same synchronised backwards: the same choice everywhere.
    const bool plain = s.iter_ < s.options_.start_iter || (dt != at::kFloat && dt != at::kDouble);
    if (bucket.is_last) ++s.iter_;
    HookResult r;
    if (plain) {
      lk.unlock();
      r.bytes = buf.numel() * int64_t(buf.element_size());
      r.work = group.allreduce(buf);
      return r;
    }
    auto& slot = s.buckets_[bucket.index];
    auto layout = layout_of(bucket);
    if (!slot || slot->layout != layout) {
      slot = std::make_shared<PowerSgdState::Bucket>();
      slot->layout = std::move(layout);
    }
    Exchange ex;
    ex.state = slot;
    ex.plan = make_plan(bucket, s.options_);
    ex.options = s.options_;
    ex.buf = buf;
    ex.world = group.size();
    ex.fresh_q = !s.options_.warm_start || !slot->q.defined();
    if (ex.fresh_q) {  // as PyTorch: a seed per fresh start, even for a bucket with no matrix
      ex.seed = powersgd::draw_seed(s.seeds_);
      slot->p = at::empty({ex.plan.p_numel}, buf.options());
      slot->q = at::empty({ex.plan.q_numel}, buf.options());
    }
    lk.unlock();
    const int64_t elems = ex.plan.plain_numel + ex.plan.p_numel + ex.plan.q_numel;
    r.bytes = elems * int64_t(buf.element_size());
    const int64_t fp = fingerprint(ex.options, ex.plan, ex.fresh_q, ex.seed);
    r.work = group.run_composite(
        buf.numel(), dt,
        [ex = std::move(ex)](comm::Backend& be, const comm::OpContext& ctx) mutable {
          ex.run(be, ctx);
        },
        comm::Millis(0), fp);
    return r;
  }
};

CommHook powersgd_hook(std::shared_ptr<PowerSgdState> state) {
  LOCKSTEP_CHECK(state != nullptr, "powersgd_hook: null state");
  return [state = std::move(state)](comm::ProcessGroup& group, const GradBucket& bucket) {
    return PowerSgdAccess::call(*state, group, bucket);
  };
}

CommHook powersgd_hook(PowerSgdOptions options) {
  return powersgd_hook(std::make_shared<PowerSgdState>(options));
}

}  // namespace lockstep::ddp::hooks
