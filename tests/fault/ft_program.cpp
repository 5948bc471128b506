// A replica for the fault-tolerance tests (tests/fault/ft_test.sh), run under
// lockstep-run --fault-tolerant. Modes:
//   train DIR   fp64 linear regression with momentum SGD through lockstep::ft::Manager for
//               --steps steps, over a fixed data set of 600 samples dealt by
//               lockstep::data::ElasticSampler (8 per replica and step) over the replicas of
//               each step, its position healed with the model. A step's batches depend on
//               the sampler's state and the step's members only, so a run can be replayed
//               from its history of who committed which step. The
//               --faults name who fails, in which step, where in it and how (a replica
//               fails in its first life only) after writing the wall-clock time to
//               DIR/death. At the end each
//               replica writes DIR/replica_R.txt: its parameters (%a, exact), its counters,
//               the wall-clock time of every commit, and the history it committed.
//               With --hsdp each replica is a shard group of the ranks lockstep-run
//               --replica-size S gives it: the model is one FSDP FullShard unit over them,
//               each rank trains on every S-th sample of the replica's batch, the
//               cross-replica reduction is of its shard, and a replica's rank 0 writes
//               its file (the gathered parameters), so `check` is the same.
//   check DIR   replays the longest history in one process and compares: every replica's
//               parameters bit-identical to each other, and equal to the replay within
//               1e-12 (fp64; the allreduce sums in another order than the replay); and in
//               the replay every sample was used exactly once in each completed epoch.
#include <lockstep/comm/init.h>
#include <lockstep/data/elastic_sampler.h>
#include <lockstep/launch/cli.h>
#include <lockstep/launch/error_file.h>
#include <lockstep/parallel/fsdp/fsdp.h>
#include <lockstep/parallel/ft/manager.h>

#include <torch/torch.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <sstream>
#include <string>
#include <thread>

namespace {

constexpr int64_t kDim = 64, kBatch = 8, kSamples = 600;
constexpr double kLr = 0.02, kMomentum = 0.9;

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// The data set: the same wherever and whenever it is made.
struct Data {
  at::Tensor x, y;
  Data() {
    auto gen = at::make_generator<at::CPUGeneratorImpl>(12345);
    const auto opt = at::TensorOptions().dtype(at::kDouble);
    x = at::randn({kSamples, kDim}, gen, opt);
    y = at::mm(x, at::linspace(-1, 1, kDim, opt).unsqueeze(1)) +
        0.1 * at::randn({kSamples, 1}, gen, opt);
  }
};

lockstep::data::ElasticSampler make_sampler() {
  lockstep::data::ElasticSamplerOptions o;
  o.seed = 99;
  return lockstep::data::ElasticSampler(kSamples, kBatch, o);
}

// Forward and backward of `forward` on the samples `idx` (possibly none, at an epoch's end:
// zero gradients). The loss is a sum over the batch / kBatch, so every replica's share
// weighs by its samples; `scale` undoes an averaging over ranks that share one batch.
template <class F>
void backward_on(F&& forward, const Data& d, const std::vector<int64_t>& idx, double scale = 1) {
  const at::Tensor i = at::tensor(idx, at::kLong);
  const at::Tensor err = forward(d.x.index_select(0, i)) - d.y.index_select(0, i);
  (err.pow(2).sum() * scale / double(kBatch)).backward();
}

torch::nn::Linear make_model() {
  torch::manual_seed(7);
  torch::nn::Linear m(kDim, 1);
  m->to(at::kDouble);
  return m;
}

std::vector<at::Tensor> grads(const std::vector<at::Tensor>& params) {
  std::vector<at::Tensor> g;
  g.reserve(params.size());
  for (const auto& p : params) g.push_back(p.grad());
  return g;
}

// One planned failure: replica `victim` (its rank `shard`, under --hsdp), in its first life
// only, hits `kind` at `point` of step `at`, after writing the wall-clock time to DIR/death.
struct Fault {
  int victim = -1;
  int shard = 0;
  int64_t at = 0;     // -1: any step
  std::string point;  // forward | backward | allreduce | vote | optimizer | heal
  std::string kind;   // kill | stop | leave
};

struct Faults {
  std::vector<Fault> list;
  std::string dir;

  // "VICTIM[.SHARD]:STEP:POINT:KIND[,...]"
  static std::vector<Fault> parse(const std::string& spec) {
    std::vector<Fault> out;
    std::istringstream in(spec);
    std::string one;
    while (std::getline(in, one, ',')) {
      Fault f;
      std::istringstream p(one);
      std::string v, a;
      if (!std::getline(p, v, ':') || !std::getline(p, a, ':') || !std::getline(p, f.point, ':') ||
          !std::getline(p, f.kind))
        throw std::invalid_argument("--faults: expected VICTIM:STEP:POINT:KIND, got '" + one + "'");
      f.victim = std::stoi(v);
      if (v.find('.') != std::string::npos) f.shard = std::stoi(v.substr(v.find('.') + 1));
      f.at = a == "*" ? -1 : std::stoll(a);
      out.push_back(f);
    }
    return out;
  }

  void maybe_strike(int id, int shard, int64_t step, const std::string& where) const {
    const char* restarts = std::getenv("LOCKSTEP_RESTART_COUNT");
    if (restarts && std::string(restarts) != "0") return;
    for (const Fault& f : list)
      if (f.victim == id && f.shard == shard && (f.at == step || f.at < 0) && f.point == where) {
        if (where == "allreduce") {  // strike while the reduction runs
          std::thread([this, f] {
            std::this_thread::sleep_for(std::chrono::microseconds(300));
            strike(f);
          }).detach();
          return;
        }
        strike(f);
      }
  }

  void strike(const Fault& f) const {
    std::ofstream(dir + "/death") << std::to_string(wall_now()) << "\n";
    if (f.kind == "leave") throw std::runtime_error("an error of this replica's own (the test's)");
    std::raise(f.kind == "stop" ? SIGSTOP : SIGKILL);
  }
};

// The model as a replica holds it: whole (a replica is one rank), or, with --hsdp, as this
// rank's shard of one FSDP FullShard unit over the replica's ranks.
struct Replica {
  torch::nn::Linear model = make_model();
  std::shared_ptr<lockstep::comm::ProcessGroup> ranks;  // --hsdp: the replica's own
  std::unique_ptr<lockstep::FullyShardedDataParallel<torch::nn::LinearImpl>> fsdp;
  int shard = 0, shards = 1;

  explicit Replica(bool hsdp) {
    if (!hsdp) return;
    ranks = lockstep::init();
    shard = ranks->rank();
    shards = ranks->size();
    fsdp = std::make_unique<lockstep::FullyShardedDataParallel<torch::nn::LinearImpl>>(model.ptr(),
                                                                                       ranks);
  }
  std::vector<at::Tensor> params() const { return fsdp ? fsdp->parameters() : model->parameters(); }
  // Forward and backward on this rank's part of the replica's batch: all of it, or every
  // shards-th sample, its loss scaled by `shards` against FSDP's averaging over them.
  void backward(const Data& d, const std::vector<int64_t>& idx) {
    if (!fsdp) return backward_on([&](const at::Tensor& x) { return model->forward(x); }, d, idx);
    std::vector<int64_t> mine;
    for (size_t i = size_t(shard); i < idx.size(); i += size_t(shards)) mine.push_back(idx[i]);
    backward_on([&](const at::Tensor& x) { return (*fsdp)(x); }, d, mine, shards);
  }
};

std::string params_text(torch::nn::Linear& m) {
  std::ostringstream o;
  char buf[64];
  for (auto& p : m->parameters()) {
    auto flat = p.detach().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i) {
      std::snprintf(buf, sizeof buf, "%a ", flat[i].item<double>());
      o << buf;
    }
  }
  return o.str();
}

int train(const std::string& dir, int64_t steps, const Faults& fault, double step_sleep,
          int64_t width, int64_t state_mb, bool hsdp) {
  Replica replica(hsdp);
  auto params = replica.params();
  torch::optim::SGD opt(params, torch::optim::SGDOptions(kLr).momentum(kMomentum));
  const Data data;
  auto sampler = make_sampler();
  // Extra state a joiner receives with the model (as a large optimizer state would be).
  at::Tensor extra = at::full({state_mb << 18}, 1.0f);
  lockstep::ft::ManagerOptions mo;
  mo.replica_group = replica.ranks;
  int id = -1;
  lockstep::ft::Manager ft(mo, {[&](torch::serialize::OutputArchive& ar) {
                                  fault.maybe_strike(id, replica.shard, -1, "heal");
                                  for (size_t i = 0; i < params.size(); ++i)
                                    ar.write("param" + std::to_string(i), params[i]);
                                  opt.save(ar);
                                  ar.write("extra", extra);
                                  const auto [e, c] = sampler.state();
                                  ar.write("sampler", at::tensor({e, c}, at::kLong));
                                },
                                [&](torch::serialize::InputArchive& ar) {
                                  torch::NoGradGuard no_grad;
                                  for (size_t i = 0; i < params.size(); ++i) {
                                    at::Tensor p;
                                    ar.read("param" + std::to_string(i), p);
                                    params[i].copy_(p);
                                  }
                                  opt.load(ar);
                                  ar.read("extra", extra);
                                  at::Tensor pos;
                                  ar.read("sampler", pos);
                                  sampler.set_state(pos[0].item<int64_t>(), pos[1].item<int64_t>());
                                }});
  id = ft.replica_id();
  const int shard = replica.shard;
  std::vector<double> commits;
  while (ft.step() < steps) {
    if (!ft.start_step()) {
      std::printf("replica %d: the job finished without it\n", id);
      return 0;
    }
    const int64_t s = ft.step();
    opt.zero_grad();
    fault.maybe_strike(id, shard, s, "forward");
    const auto idx = sampler.batch(ft.replica_rank(), ft.replicas());
    fault.maybe_strike(id, shard, s, "backward");
    replica.backward(data, idx);
    fault.maybe_strike(id, shard, s, "allreduce");
    std::vector<at::Tensor> g = grads(params);
    at::Tensor ballast = at::zeros({width}, at::kFloat);  // a reduction that takes a while
    if (width > 0) g.push_back(ballast);
    ft.allreduce(g);
    fault.maybe_strike(id, shard, s, "vote");
    if (!ft.should_commit()) {
      std::fprintf(stderr, "replica %d discarded step %ld (quorum %ld, %d replicas): %s\n", id,
                   long(s), long(ft.quorum_id()), ft.replicas(), ft.last_error().c_str());
      continue;
    }
    fault.maybe_strike(id, shard, s, "optimizer");
    opt.step();
    sampler.commit(ft.replicas());
    commits.push_back(wall_now());
    if (step_sleep > 0) std::this_thread::sleep_for(std::chrono::duration<double>(step_sleep));
  }
  const auto& st = ft.stats();
  const std::string who =
      "replica " + std::to_string(id) + (hsdp ? " shard " + std::to_string(shard) : "");
  std::printf(
      "%s done: %ld committed, %ld discarded, %ld heals (%.3f s, %ld bytes), "
      "%ld healed others, %ld groups built\n",
      who.c_str(), long(st.committed), long(st.discarded), long(st.heals), st.heal_s,
      long(st.heal_bytes), long(st.healed_others), long(st.rebuilds));
  if (replica.fsdp) replica.fsdp->summon_full_params();  // collective in the replica
  if (shard != 0) return 0;
  std::ofstream out(dir + "/replica_" + std::to_string(id) + ".txt");
  out << "params " << params_text(replica.model) << "\n";
  out << "stats " << st.committed << " " << st.discarded << " " << st.heals << " "
      << st.healed_others << " " << st.rebuilds << " " << st.heal_s << " " << st.heal_bytes << "\n";
  out << "commits";
  for (double t : commits) out << " " << std::to_string(t);
  out << "\n";
  for (const auto& r : ft.history()) {
    out << "step " << r.step;
    for (int m : r.members) out << " " << m;
    out << "\n";
  }
  return 0;
}

struct Result {
  std::vector<double> params;
  std::map<int64_t, std::vector<int>> history;
};

Result read_result(const std::string& path) {
  Result r;
  std::ifstream in(path);
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream l(line);
    std::string word;
    l >> word;
    if (word == "params") {
      std::string v;
      while (l >> v) r.params.push_back(std::strtod(v.c_str(), nullptr));
    } else if (word == "step") {
      int64_t s = 0;
      int m = 0;
      l >> s;
      while (l >> m) r.history[s].push_back(m);
    }
  }
  return r;
}

int check(const std::string& dir, int replicas, int64_t steps) {
  std::vector<Result> rs;
  const Result* full = nullptr;
  for (int id = 0; id < replicas; ++id) {
    std::ifstream probe(dir + "/replica_" + std::to_string(id) + ".txt");
    if (!probe) continue;
    rs.push_back(read_result(dir + "/replica_" + std::to_string(id) + ".txt"));
  }
  for (const auto& r : rs)
    if (int64_t(r.history.size()) == steps) full = &r;
  if (rs.empty() || !full) {
    std::printf("FAIL no replica committed all %ld steps from step 0\n", long(steps));
    return 1;
  }
  int bad = 0;
  for (const auto& r : rs)
    if (r.params != rs[0].params) ++bad;
  std::printf("%s parameters bit-identical on all %zu replicas that finished\n",
              bad ? "FAIL" : "PASS", rs.size());
  // The replay: one model, each committed step's gradient the mean over its members, each
  // member's batch dealt by the sampler as on the replicas.
  auto model = make_model();
  torch::optim::SGD opt(model->parameters(), torch::optim::SGDOptions(kLr).momentum(kMomentum));
  const Data data;
  auto sampler = make_sampler();
  std::map<int64_t, std::vector<int>> uses;  // epoch -> uses of each sample
  for (const auto& [s, members] : full->history) {
    const int n = int(members.size());
    std::vector<at::Tensor> sum;
    for (int r = 0; r < n; ++r) {
      opt.zero_grad();
      const auto idx = sampler.batch(r, n);
      auto& u = uses[sampler.epoch()];
      u.resize(kSamples);
      for (int64_t i : idx) ++u[size_t(i)];
      backward_on([&](const at::Tensor& x) { return model->forward(x); }, data, idx);
      auto g = grads(model->parameters());
      if (sum.empty())
        for (auto& t : g) sum.push_back(t.clone());
      else
        for (size_t i = 0; i < g.size(); ++i) sum[i] += g[i];
    }
    auto ps = model->parameters();
    for (size_t i = 0; i < ps.size(); ++i) ps[i].mutable_grad() = sum[i] / double(n);
    opt.step();
    sampler.commit(n);
  }
  int64_t epochs = 0, wrong = 0;
  for (const auto& [e, u] : uses) {
    if (e >= sampler.epoch()) continue;  // not completed
    ++epochs;
    for (int c : u) wrong += c != 1;
  }
  std::printf(
      "%s every sample used exactly once in each of the %ld completed epochs, "
      "whatever the replica counts (%ld uses off)\n",
      wrong || epochs == 0 ? "FAIL" : "PASS", long(epochs), long(wrong));
  double diff = 0;
  size_t k = 0;
  for (auto& p : model->parameters()) {
    auto flat = p.detach().reshape({-1});
    for (int64_t i = 0; i < flat.numel(); ++i, ++k)
      diff = std::max(diff, std::abs(flat[i].item<double>() - rs[0].params.at(k)));
  }
  const bool ok = diff <= 1e-12;
  std::printf(
      "%s the replicas equal a single-process replay of the %ld committed steps "
      "(who took part in each) within 1e-12: max difference %.3g\n",
      ok ? "PASS" : "FAIL", long(steps), diff);
  return bad || !ok || wrong || epochs == 0 ? 1 : 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"ft_program: a replica for the fault-tolerance tests (tests/fault/ft_test.sh)",
               "ft_program"};
  std::string mode, dir;
  int64_t steps = 40;
  int replicas = 3;
  double step_sleep = 0.02;
  Faults fault;
  std::string faults;
  int64_t width = 1 << 20;
  int64_t state_mb = 0;
  bool hsdp = false;
  app.add_option("mode", mode, "train or check")
      ->required()
      ->check(CLI::IsMember({"train", "check"}));
  app.add_option("dir", dir, "where results go")->required();
  app.add_option("--steps", steps, "steps to commit");
  app.add_option("--replicas", replicas, "check: how many replicas the job had");
  app.add_option("--step-sleep", step_sleep, "seconds each replica sleeps after a commit");
  app.add_option("--faults", faults,
                 "VICTIM[.SHARD]:STEP:POINT:KIND,... with STEP a number or * (any), POINT "
                 "forward, backward, allreduce, vote, optimizer or heal (saving its state for a "
                 "joiner) and KIND kill, stop or leave");
  app.add_option("--ballast", width,
                 "float32 zeros reduced with the gradients each step, so a reduction lasts "
                 "long enough to be struck in (default 1 Mi)");
  app.add_option("--state-mb", state_mb, "MB of extra state a joiner receives when it heals");
  app.add_flag("--hsdp", hsdp,
               "a replica is the shard group of lockstep-run --replica-size S (FSDP inside)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  fault.dir = dir;
  try {
    fault.list = Faults::parse(faults);
    return mode == "train" ? train(dir, steps, fault, step_sleep, width, state_mb, hsdp)
                           : check(dir, replicas, steps);
  } catch (const std::exception& e) {
    lockstep::launch::record_error(e.what());
    std::fprintf(stderr, "ft_program: %s\n", e.what());
    return 1;
  }
}
