// Multi-process check of DiLoCo, Streaming DiLoCo and local SGD (any backend, 1..4 ranks).
// Every rank trains replica `rank` of a small MLP on its own batches; a single-process
// simulation of all replicas (written plainly here, from the algorithm's description) is the
// reference:
//   - local SGD with H = 1 (inner SGD with momentum) equals DDP's update (mean gradient);
//   - DiLoCo (outer Nesterov SGD, H = 4) and Streaming DiLoCo (3 fragments, overlap 2 steps,
//     mixing 0.5) equal the simulation, float64 and float32 (stated bounds);
//   - local SGD: replicas identical after each round, different inside one;
//   - 4-bit QSGD outer exchange: replicas identical after each round, bytes ~1/7 of fp32;
//   - a mid-round state() / load_state() (exchange in flight, QSGD) resumes bit for bit.
// Exits non-zero on any failure.
#include <lockstep/lockstep.h>
#include <lockstep/parallel/diloco/diloco.h>

#include "tally.h"

#include <torch/torch.h>

#include <cmath>
#include <sstream>
#include <string>
#include <vector>

using lockstep::diloco::DiLoCo;
using lockstep::diloco::DiLoCoOptions;
using Params = std::vector<torch::Tensor>;

namespace {

std::shared_ptr<lockstep::comm::ProcessGroup> g_group;
int g_rank = 0, g_world = 1;
int64_t g_hidden = 6;  // the MLP's width

Params make_params(torch::Dtype dt, uint64_t seed) {
  torch::manual_seed(seed);
  Params p{torch::randn({g_hidden, 4}), torch::randn({g_hidden}), torch::randn({1, g_hidden}),
           torch::randn({1})};
  for (auto& t : p) t = t.to(dt).set_requires_grad(true);
  return p;
}

Params clone(const Params& p) {
  Params out;
  for (const auto& t : p) out.push_back(t.detach().clone().set_requires_grad(true));
  return out;
}

// Replica r's batch at inner step t: the same on every process.
std::pair<torch::Tensor, torch::Tensor> batch(int r, int64_t t, torch::Dtype dt) {
  torch::manual_seed(uint64_t(1000 * t + r));
  auto x = torch::randn({8, 4}).to(dt);
  auto y = torch::sin(x.sum(1, true));
  return {x, y};
}

torch::Tensor loss_of(const Params& p, const std::pair<torch::Tensor, torch::Tensor>& b) {
  auto h = torch::tanh(torch::addmm(p[1], b.first, p[0].t()));
  return torch::mse_loss(torch::addmm(p[3], h, p[2].t()), b.second);
}

std::unique_ptr<torch::optim::SGD> inner_opt(const Params& p) {
  return std::make_unique<torch::optim::SGD>(p, torch::optim::SGDOptions(0.05).momentum(0.9));
}

void inner_step(const Params& p, torch::optim::SGD& opt, int r, int64_t t, torch::Dtype dt) {
  opt.zero_grad();
  loss_of(p, batch(r, t, dt)).backward();
  opt.step();
}

double max_diff(const Params& a, const Params& b) {
  double m = 0;
  for (size_t i = 0; i < a.size(); ++i) m = std::max(m, (a[i] - b[i]).abs().max().item<double>());
  return m;
}

torch::Tensor flat(const Params& p, int64_t first, int64_t count) {
  std::vector<torch::Tensor> v;
  for (int64_t i = first; i < first + count; ++i) v.push_back(p[size_t(i)].detach().reshape(-1));
  return torch::cat(v);
}

void assign(Params& p, int64_t first, int64_t count, const torch::Tensor& f) {
  torch::NoGradGuard ng;
  int64_t off = 0;
  for (int64_t i = first; i < first + count; ++i) {
    p[size_t(i)].copy_(f.narrow(0, off, p[size_t(i)].numel()).view_as(p[size_t(i)]));
    off += p[size_t(i)].numel();
  }
}

// All replicas of the algorithm in this process, after `steps` inner steps.
std::vector<Params> simulate(const DiLoCoOptions& o, int64_t steps, torch::Dtype dt) {
  const Params init = make_params(dt, 7);
  std::vector<Params> rep;
  std::vector<std::unique_ptr<torch::optim::SGD>> opts;
  for (int r = 0; r < g_world; ++r) {
    rep.push_back(clone(init));
    opts.push_back(inner_opt(rep.back()));
  }
  std::vector<int64_t> numels;
  for (const auto& t : init) numels.push_back(t.numel());
  const auto frags = lockstep::diloco::plan_fragments(numels, o.fragments, o.inner_steps);
  std::vector<torch::Tensor> anchor, mom(frags.size()), pending(frags.size());
  std::vector<int64_t> due(frags.size(), -1);
  for (const auto& f : frags) anchor.push_back(flat(init, f.first, f.count));
  for (int64_t t = 1; t <= steps; ++t) {
    for (int r = 0; r < g_world; ++r) inner_step(rep[size_t(r)], *opts[size_t(r)], r, t, dt);
    for (size_t f = 0; f < frags.size(); ++f) {
      if (t % o.inner_steps != frags[f].offset) continue;
      auto sum = torch::zeros_like(anchor[f]);
      for (int r = 0; r < g_world; ++r)
        sum += anchor[f] - flat(rep[size_t(r)], frags[f].first, frags[f].count);
      pending[f] = sum / double(g_world);
      due[f] = t + o.overlap_steps;
    }
    for (size_t f = 0; f < frags.size(); ++f) {
      if (due[f] < 0 || due[f] > t) continue;
      torch::Tensor d = pending[f];
      if (o.outer_momentum > 0) {
        mom[f] = mom[f].defined() ? mom[f] * o.outer_momentum + d : d.clone();
        d = o.nesterov ? d + o.outer_momentum * mom[f] : mom[f];
      }
      anchor[f] = anchor[f] - o.outer_lr * d;
      for (auto& p : rep) {
        auto local = flat(p, frags[f].first, frags[f].count);
        assign(p, frags[f].first, frags[f].count, o.mixing * local + (1 - o.mixing) * anchor[f]);
      }
      due[f] = -1;
    }
  }
  return rep;
}

// This rank's replica trained by DiLoCo for `steps`.
Params run(const DiLoCoOptions& o, int64_t steps, torch::Dtype dt) {
  Params p = make_params(dt, 7 + uint64_t(g_rank));  // the broadcast makes them rank 0's
  auto opt = inner_opt(p);
  DiLoCo outer(g_group, p, o);
  for (int64_t t = 1; t <= steps; ++t) {
    inner_step(p, *opt, g_rank, t, dt);
    outer.step();
  }
  return p;
}

void check_against_simulation(const std::string& name, const DiLoCoOptions& o, int64_t steps) {
  for (const auto dt : {torch::kFloat64, torch::kFloat32}) {
    const double tol = dt == torch::kFloat64 ? 1e-12 : 2e-5;
    const auto ref = simulate(o, steps, dt);
    tally::report(name + (dt == torch::kFloat64 ? " float64" : " float32"),
                  max_diff(run(o, steps, dt), ref[size_t(g_rank)]), tol);
  }
}

// Local SGD with H = 1 and inner SGD (momentum 0.9) equals DDP: the mean gradient's update.
void check_ddp_equivalence() {
  const int64_t steps = 6;
  const auto dt = torch::kFloat64;
  Params ref = make_params(dt, 7);
  auto opt = inner_opt(ref);
  for (int64_t t = 1; t <= steps; ++t) {
    opt->zero_grad();
    for (int r = 0; r < g_world; ++r) (loss_of(ref, batch(r, t, dt)) / double(g_world)).backward();
    opt->step();
  }
  tally::report("local SGD, H = 1 equals DDP float64",
                max_diff(run(DiLoCoOptions::local_sgd(1), steps, dt), ref), 1e-12);
}

// max over ranks of |this rank's parameters - rank 0's|.
double spread(const Params& p) {
  auto mine = flat(p, 0, int64_t(p.size())).to(torch::kFloat64);
  auto root = mine.clone();
  g_group->broadcast(root)->wait();
  auto d = torch::tensor({(mine - root).abs().max().item<double>()}, torch::kFloat64);
  g_group->allreduce(d, {lockstep::comm::ReduceOp::Max})->wait();
  return d.item<double>();
}

void check_rounds(const std::string& name, DiLoCoOptions o, double tol) {
  Params p = make_params(torch::kFloat32, 7);
  auto opt = inner_opt(p);
  DiLoCo outer(g_group, p, o);
  bool same_at_sync = true, differ_inside = true;
  for (int64_t t = 1; t <= 3 * o.inner_steps; ++t) {
    inner_step(p, *opt, g_rank, t, torch::kFloat32);
    outer.step();
    const double s = spread(p);
    if (t % o.inner_steps == 0)
      same_at_sync = same_at_sync && s <= tol;
    else if (g_world > 1)
      differ_inside = differ_inside && s > 0;
  }
  tally::check(name + ": replicas identical after each round", same_at_sync);
  tally::check(name + ": replicas differ inside a round", differ_inside);
  tally::check(name + ": one exchange per round", outer.stats().syncs == 3,
               std::to_string(outer.stats().syncs));
  if (o.compression == lockstep::diloco::OuterCompression::kQsgd && g_world > 1) {
    const int64_t fp32 = 3 * 2 * (g_world - 1) * outer.fragments()[0].numel * 4 / g_world;
    tally::check(name + ": 4-bit exchange sends under 1/4 of float32's bytes",
                 outer.stats().bytes_sent * 4 < fp32,
                 std::to_string(outer.stats().bytes_sent) + " vs " + std::to_string(fp32));
  }
}

// synchronize() leaves every replica at the outer parameters, also when the round has just
// ended with mixing > 0 (which keeps part of each replica's own values).
void check_synchronize() {
  DiLoCoOptions o;
  o.inner_steps = 3;
  o.mixing = 0.5;
  Params p = make_params(torch::kFloat32, 7);
  auto opt = inner_opt(p);
  DiLoCo outer(g_group, p, o);
  for (int64_t t = 1; t <= 2 * o.inner_steps; ++t) {
    inner_step(p, *opt, g_rank, t, torch::kFloat32);
    outer.step();
  }
  outer.synchronize();
  tally::report("synchronize() at a round's end with mixing 0.5: replicas identical", spread(p),
                0.0);
}

// Training to `split`, a state() taken then, a fresh model, optimizer and DiLoCo loaded from
// it (a different initialisation, overwritten), trained on to `steps`: the same bits.
void check_resume(const DiLoCoOptions& o, int64_t split, int64_t steps) {
  const auto dt = torch::kFloat32;
  const Params straight = run(o, steps, dt);
  Params p = make_params(dt, 7);
  auto opt = inner_opt(p);
  std::map<std::string, torch::Tensor> saved;
  Params saved_params;
  std::stringstream opt_bytes;
  {
    DiLoCo outer(g_group, p, o);
    for (int64_t t = 1; t <= split; ++t) {
      inner_step(p, *opt, g_rank, t, dt);
      outer.step();
    }
    for (auto& [k, v] : outer.state()) saved[k] = v.clone();
    saved_params = clone(p);
    torch::save(*opt, opt_bytes);
  }
  Params q = make_params(dt, 99);
  auto opt2 = inner_opt(q);
  DiLoCo outer2(g_group, q, o);
  assign(q, 0, int64_t(q.size()), flat(saved_params, 0, int64_t(q.size())));
  torch::load(*opt2, opt_bytes);
  outer2.load_state(saved);
  for (int64_t t = split + 1; t <= steps; ++t) {
    inner_step(q, *opt2, g_rank, t, dt);
    outer2.step();
  }
  tally::report("resume mid-round (exchange in flight, 4-bit) bit-exact", max_diff(q, straight),
                0.0);
}

}  // namespace

int main() {
  g_group = lockstep::init();
  g_rank = g_group->rank();
  g_world = g_group->size();
  tally::rank = g_rank;
  tally::subject = "parameters";
  torch::set_num_threads(1);

  check_ddp_equivalence();
  DiLoCoOptions d;
  d.inner_steps = 4;
  check_against_simulation("DiLoCo H = 4, Nesterov 0.7/0.9", d, 10);
  DiLoCoOptions s;
  s.inner_steps = 6;
  s.fragments = 3;
  s.overlap_steps = 2;
  s.mixing = 0.5;
  check_against_simulation("Streaming DiLoCo H = 6, 3 fragments, overlap 2, mixing 0.5", s, 14);

  check_rounds("local SGD H = 3", DiLoCoOptions::local_sgd(3), 0.0);
  DiLoCoOptions q;
  q.inner_steps = 3;
  q.compression = lockstep::diloco::OuterCompression::kQsgd;
  q.qsgd_min_layer = 1;  // the test model's layers are small
  g_hidden = 128;        // enough values per layer for the bytes to tell
  check_rounds("DiLoCo 4-bit H = 3", q, 0.0);
  g_hidden = 6;

  check_synchronize();

  DiLoCoOptions r = s;
  r.compression = lockstep::diloco::OuterCompression::kQsgd;
  r.qsgd_min_layer = 1;
  check_resume(r, 7, 13);
  return tally::finish();
}
