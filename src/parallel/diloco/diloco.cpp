// DiLoCo / Streaming DiLoCo / local SGD: the round schedule, the exchange of a fragment's
// pseudo-gradient, the outer optimizer and the merge (lockstep/parallel/diloco/diloco.h).
#include <lockstep/parallel/diloco/diloco.h>

#include <lockstep/compress/compressed_allreduce.h>
#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>

#include <chrono>
#include <cmath>

namespace lockstep::diloco {

DiLoCoOptions DiLoCoOptions::local_sgd(int64_t inner_steps) {
  DiLoCoOptions o;
  o.inner_steps = inner_steps;
  o.outer_lr = 1.0;
  o.outer_momentum = 0.0;
  o.nesterov = false;
  return o;
}

void validate(const DiLoCoOptions& o) {
  auto bad = [](const std::string& what) { throw InvalidArgument("DiLoCoOptions: " + what); };
  auto num = [](double v) { return std::to_string(v); };
  if (o.inner_steps < 1)
    bad("inner_steps = " + std::to_string(o.inner_steps) + ": must be >= 1 (e.g. 50)");
  if (!std::isfinite(o.outer_lr) || o.outer_lr <= 0)
    bad("outer_lr = " + num(o.outer_lr) + ": must be > 0 (0.7 for DiLoCo, 1 for local SGD)");
  if (!std::isfinite(o.outer_momentum) || o.outer_momentum < 0 || o.outer_momentum >= 1)
    bad("outer_momentum = " + num(o.outer_momentum) + ": must be in [0, 1) (0.9 for DiLoCo)");
  if (o.nesterov && o.outer_momentum == 0)
    bad("nesterov = true needs outer_momentum > 0 (as torch.optim.SGD)");
  if (o.fragments < 1 || o.fragments > o.inner_steps)
    bad("fragments = " + std::to_string(o.fragments) + ": must be in [1, inner_steps = " +
        std::to_string(o.inner_steps) + "] (each fragment needs its own step of the round)");
  if (o.overlap_steps < 0 || o.overlap_steps >= o.inner_steps)
    bad("overlap_steps = " + std::to_string(o.overlap_steps) +
        ": must be in [0, inner_steps) (a fragment's exchange ends before its next one starts)");
  if (!std::isfinite(o.mixing) || o.mixing < 0 || o.mixing >= 1)
    bad("mixing = " + num(o.mixing) + ": must be in [0, 1) (0: take the outer parameters)");
  if (o.compression == OuterCompression::kQsgd && (o.qsgd_bits < 1 || o.qsgd_bits > 8))
    bad("qsgd_bits = " + std::to_string(o.qsgd_bits) + ": must be in [1, 8]");
  if (o.compression == OuterCompression::kQsgd && o.qsgd_bucket_size < 1)
    bad("qsgd_bucket_size = " + std::to_string(o.qsgd_bucket_size) + ": must be >= 1");
}

std::vector<Fragment> plan_fragments(const std::vector<int64_t>& numels, int64_t fragments,
                                     int64_t inner_steps) {
  const auto n = int64_t(numels.size());
  if (fragments < 1 || fragments > n)
    throw InvalidArgument("DiLoCo: " + std::to_string(fragments) + " fragments of " +
                          std::to_string(n) +
                          " parameters: each fragment needs at least one parameter; use fewer");
  int64_t total = 0;
  for (const int64_t k : numels) total += k;
  std::vector<Fragment> out;
  int64_t i = 0, done = 0;
  for (int64_t f = 0; f < fragments; ++f) {
    Fragment fr;
    fr.first = i;
    // Close the run once it reaches its share of the elements, leaving a parameter for
    // every fragment still to come.
    const int64_t goal = total * (f + 1) / fragments;
    do {
      fr.numel += numels[size_t(i)];
      ++i;
    } while (i < n - (fragments - 1 - f) && (f + 1 == fragments || done + fr.numel < goal));
    fr.count = i - fr.first;
    done += fr.numel;
    fr.offset = ((f + 1) * inner_steps / fragments) % inner_steps;
    out.push_back(fr);
  }
  return out;
}

// One fragment: its outer parameters, the outer momentum, the exchange buffer and the
// exchange in flight (started at `started`, applied at `due`).
struct DiLoCo::Slot {
  at::Tensor anchor, momentum, buf;
  comm::WorkPtr work;
  bool ready = false;  // buf holds the average (the work completed, or restored from state())
  int64_t due = -1;    // inner step of the apply; -1: nothing in flight
  int64_t started = -1;
  std::unique_ptr<compress::CompressedAllreduce> qsgd;
};

namespace {

at::ScalarType common_dtype(const std::vector<at::Tensor>& params) {
  LOCKSTEP_CHECK(!params.empty(), "DiLoCo: no parameters");
  const auto dt = params[0].scalar_type();
  for (const auto& p : params) {
    if (!p.defined() || p.device().type() != at::kCPU || p.scalar_type() != dt ||
        !at::isFloatingType(dt))
      throw InvalidArgument(
          "DiLoCo: the parameters must be CPU floating tensors of one dtype (found " +
          std::string(p.defined() ? c10::toString(p.scalar_type()) : "undefined") + " beside " +
          c10::toString(dt) + ")");
  }
  return dt;
}

double since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace

DiLoCo::DiLoCo(std::shared_ptr<comm::ProcessGroup> group, std::vector<at::Tensor> params,
               DiLoCoOptions options)
    : group_(std::move(group)), params_(std::move(params)), opts_((validate(options), options)) {
  LOCKSTEP_CHECK(group_, "DiLoCo needs a process group");
  common_dtype(params_);
  std::vector<int64_t> numels;
  for (const auto& p : params_) numels.push_back(p.numel());
  frags_ = plan_fragments(numels, opts_.fragments, opts_.inner_steps);
  for (size_t f = 0; f < frags_.size(); ++f) {
    auto s = std::make_unique<Slot>();
    s->buf = flat_local(f);
    group_->broadcast(s->buf, {0, {}})->wait();  // every replica starts from rank 0's
    set_local(f, s->buf);
    s->anchor = s->buf.clone();
    if (opts_.compression == OuterCompression::kQsgd) {
      compress::QsgdOptions q;
      q.bits = opts_.qsgd_bits;
      q.bucket_size = opts_.qsgd_bucket_size;
      q.min_layer = opts_.qsgd_min_layer;
      q.seed = opts_.seed + f;
      q.use_env = false;
      std::vector<compress::LayerSpan> layers;
      int64_t off = 0;
      for (int64_t i = 0; i < frags_[f].count; ++i) {
        const int64_t k = params_[size_t(frags_[f].first + i)].numel();
        layers.push_back({"param." + std::to_string(frags_[f].first + i), off, k});
        off += k;
      }
      s->qsgd = std::make_unique<compress::CompressedAllreduce>(q, std::move(layers),
                                                                frags_[f].numel, group_->size());
    }
    slots_.push_back(std::move(s));
  }
}

DiLoCo::~DiLoCo() {
  for (auto& s : slots_)
    if (s->work) try {
        s->work->wait();
      } catch (...) {  // the group failed: nothing left to wait for
      }
}

at::Tensor DiLoCo::flat_local(size_t f) const {
  std::vector<at::Tensor> views;
  for (int64_t i = 0; i < frags_[f].count; ++i)
    views.push_back(params_[size_t(frags_[f].first + i)].detach().reshape({-1}));
  return at::cat(views);
}

void DiLoCo::set_local(size_t f, const at::Tensor& flat) {
  at::NoGradGuard no_grad;
  int64_t off = 0;
  for (int64_t i = 0; i < frags_[f].count; ++i) {
    auto& p = params_[size_t(frags_[f].first + i)];
    p.copy_(flat.narrow(0, off, p.numel()).view(p.sizes()));
    off += p.numel();
  }
}

void DiLoCo::start(size_t f) {
  Slot& s = *slots_[f];
  at::sub_out(s.buf, s.anchor, flat_local(f));  // the pseudo-gradient
  s.ready = false;
  if (s.qsgd) {
    s.work = s.qsgd->run_async(*group_, s.buf, /*average=*/true);
    stats_.bytes_sent += s.qsgd->last_stats().bytes_sent;
  } else {
    s.work = group_->allreduce(s.buf);
    const int P = group_->size();
    stats_.bytes_sent += 2 * (P - 1) * s.buf.numel() * int64_t(s.buf.element_size()) / P;
  }
  s.started = inner_;
  s.due = inner_ + opts_.overlap_steps;
}

// Waits for a fragment's exchange and leaves the average in its buffer (once).
void DiLoCo::complete(Slot& s) {
  if (s.ready) return;
  const auto t0 = std::chrono::steady_clock::now();
  s.work->wait();
  s.work.reset();
  if (s.qsgd)
    s.qsgd->finish();  // NonFiniteGradient on every rank alike
  else
    s.buf.div_(group_->size());
  stats_.wait_s += since(t0);
  s.ready = true;
}

void DiLoCo::outer_step(Slot& s, const at::Tensor& g) {
  const double mu = opts_.outer_momentum;
  at::Tensor d = g;
  if (mu > 0) {
    if (!s.momentum.defined())
      s.momentum = g.clone();
    else
      s.momentum.mul_(mu).add_(g);
    d = opts_.nesterov ? g.add(s.momentum, mu) : s.momentum;
  }
  s.anchor.add_(d, -opts_.outer_lr);
}

void DiLoCo::apply(size_t f, double mixing) {
  Slot& s = *slots_[f];
  complete(s);
  outer_step(s, s.buf);
  if (mixing == 0)
    set_local(f, s.anchor);
  else
    set_local(f, flat_local(f).mul_(mixing).add_(s.anchor, 1 - mixing));
  s.due = -1;
  s.ready = false;
  ++stats_.syncs;
}

void DiLoCo::step() {
  ++inner_;
  const int64_t H = opts_.inner_steps;
  for (size_t f = 0; f < frags_.size(); ++f)
    if (inner_ % H == frags_[f].offset) start(f);
  // At most one fragment starts per step, so the due steps order the applies as the starts.
  for (size_t f = 0; f < frags_.size(); ++f)
    if (slots_[f]->due >= 0 && slots_[f]->due <= inner_) apply(f, opts_.mixing);
}

void DiLoCo::synchronize() {
  for (size_t f = 0; f < frags_.size(); ++f)
    if (slots_[f]->due >= 0) apply(f, opts_.mixing);
  for (size_t f = 0; f < frags_.size(); ++f) {
    if (slots_[f]->started == inner_) {  // started (and applied) this step: nothing new since
      set_local(f, slots_[f]->anchor);   // the outer parameters, also where mixing kept some local
      continue;
    }
    start(f);
    apply(f, 0.0);
  }
}

std::map<std::string, at::Tensor> DiLoCo::state() {
  std::map<std::string, at::Tensor> st;
  std::vector<int64_t> layout{int64_t(frags_.size())};
  for (const auto& fr : frags_) layout.push_back(fr.numel);
  st["layout"] = at::tensor(layout, at::kLong);
  st["inner_step"] = at::tensor({inner_}, at::kLong);
  for (size_t f = 0; f < frags_.size(); ++f) {
    Slot& s = *slots_[f];
    const std::string k = "fragment." + std::to_string(f) + ".";
    st[k + "anchor"] = s.anchor;
    if (s.momentum.defined()) st[k + "momentum"] = s.momentum;
    int64_t qsgd_calls = s.qsgd ? int64_t(s.qsgd->steps()) : 0;
    st[k + "position"] = at::tensor({s.due, s.started, qsgd_calls}, at::kLong);
    if (s.due >= 0) {
      complete(s);
      st[k + "pending"] = s.buf;
    }
  }
  return st;
}

void DiLoCo::load_state(const std::map<std::string, at::Tensor>& st) {
  auto get = [&st](const std::string& k) -> const at::Tensor& {
    const auto it = st.find(k);
    if (it == st.end())
      throw InvalidArgument("DiLoCo::load_state: no '" + k +
                            "' in the state (not written by DiLoCo::state()?)");
    return it->second;
  };
  std::vector<int64_t> layout{int64_t(frags_.size())};
  for (const auto& fr : frags_) layout.push_back(fr.numel);
  if (!get("layout").equal(at::tensor(layout, at::kLong)))
    throw InvalidArgument(
        "DiLoCo::load_state: the state was written for another fragment layout (fragments and "
        "their sizes differ): the model or diloco fragments changed");
  inner_ = get("inner_step").item<int64_t>();
  for (size_t f = 0; f < frags_.size(); ++f) {
    Slot& s = *slots_[f];
    const std::string k = "fragment." + std::to_string(f) + ".";
    s.anchor.copy_(get(k + "anchor"));
    const auto m = st.find(k + "momentum");
    s.momentum = m == st.end() ? at::Tensor() : m->second.clone();
    const auto pos = get(k + "position");
    s.due = pos[0].item<int64_t>();
    s.started = pos[1].item<int64_t>();
    if (s.qsgd) s.qsgd->set_steps(uint64_t(pos[2].item<int64_t>()));
    s.work.reset();
    s.ready = s.due >= 0;
    if (s.ready) s.buf.copy_(get(k + "pending"));
  }
}

}  // namespace lockstep::diloco
