// lockstep-bench checkpoint: the trainer's asynchronous checkpoint beside its synchronous
// one, same run, same model and optimizer state (docs/checkpoints.md, "Asynchronous saves").
//
// For each strategy (ddp, fsdp) and model size (an MLP of equal square layers, AdamW: the
// checkpoint holds 3x the parameters' bytes), a worker job of R ranks alternates, per round:
// a few plain steps (the step time without a save), a synchronous save (the time the step
// is blocked: save() until every rank is past it, so the slowest rank counts), one step,
// an asynchronous save (blocked the same way) and then steps until its background write and
// commit are done (the step time while a save runs). Reported: medians over rounds, and
// the ratios async blocked / sync blocked (target <= 1/25) and step during a save / step
// without (target <= 1.05), and how much of the async block is the staging copy. The copy
// runs beside the first step after the save, as in the trainer; what that step waits for it
// at its update counts as blocked, and the step's own time is reported ("first step").
//   lockstep-bench checkpoint [--params 10M,100M] [--strategies ddp,fsdp] [--nproc 2]
//                             [--rounds 3] [--batch 16] [--copy-in-save]
//                             [--out out/bench-checkpoint]
#include "bench_util.h"
#include "commands.h"
#include "jobs.h"

#include "train/checkpoint/checkpointer.h"

#include <lockstep/lockstep.h>
#include <lockstep/models/mlp.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/fsdp/fully_sharded_data_parallel.h>

#include <torch/torch.h>

#include <cstdio>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::bench {
namespace {

struct CkptArgs {
  std::string params = "10M,100M", strategies = "ddp,fsdp", out = "out/bench-checkpoint";
  int nproc = 2, rounds = 3, batch = 16, max_steps = 60;
  bool worker = false, copy_in_save = false;
  std::string strategy = "ddp";
  int64_t count = 0;  // the worker's parameter count
};

// "10M" -> 10'000'000 (decimal: parameter counts, not bytes).
int64_t parse_count(const std::string& s) {
  const char unit = s.empty() ? ' ' : s.back();
  const double m = unit == 'M' ? 1e6 : unit == 'G' ? 1e9 : unit == 'K' ? 1e3 : 1;
  return int64_t(std::stod(m == 1 ? s : s.substr(0, s.size() - 1)) * m);
}

// Square layers of width d, as many as make about `count` parameters.
std::vector<int64_t> mlp_sizes(int64_t count) {
  const int64_t d = count >= 50'000'000 ? 2048 : 1024;
  const int64_t layers = std::max<int64_t>(1, (count + d * (d + 1) / 2) / (d * (d + 1)));
  return std::vector<int64_t>(size_t(layers + 1), d);
}

// ---------------------------------------------------------------------------------------
// Worker

struct Trainee {
  std::function<void()> step;           // one forward, backward and AdamW step
  std::function<void()> before_update;  // the async Checkpointer's, before the AdamW step
  fsdp::FSDPCore* fsdp = nullptr;
  std::unique_ptr<torch::optim::Optimizer> opt;
};

train::TrainConfig bench_config(const CkptArgs& a, const std::string& mode) {
  train::TrainConfig c;
  c.json = "{}";
  c.strategy.kind = a.strategy;
  c.checkpoint.every_steps = 0;  // saves are called explicitly
  c.checkpoint.keep = 1;
  c.checkpoint.mode = mode;
  c.checkpoint.dir = a.out + "/" + a.strategy + "-" + std::to_string(a.count) + "-" + mode;
  return c;
}

struct Figures {
  std::vector<double> base, during, first, sync_blocked, async_blocked, copy;
};

// Seconds of fn on every rank until all are past it.
double blocked(comm::ProcessGroup& g, const std::function<void()>& fn) {
  g.barrier()->wait();
  const double t0 = now_s();
  fn();
  g.barrier()->wait();
  return now_s() - t0;
}

// One round: plain steps, a sync save, a step, an async save and the steps it overlaps.
void round(comm::ProcessGroup& g, Trainee& t, train::Checkpointer& sync, train::Checkpointer& async,
           int64_t& k, const CkptArgs& a, Figures& f) {
  auto timed_step = [&](std::vector<double>& into) {
    const double t0 = now_s();
    t.step();
    async.after_step(++k, 0.0);  // polls the in-flight save (every_steps = 0: no save)
    into.push_back(now_s() - t0);
  };
  for (int i = 0; i < 3; ++i) timed_step(f.base);
  f.sync_blocked.push_back(blocked(g, [&] { sync.save(k, 0.0); }));
  timed_step(f.base);
  f.async_blocked.push_back(blocked(g, [&] { async.save(k, 0.0); }));
  f.copy.push_back(async.last_snapshot_s());
  // The first step: its update waits for the staging copy if that still runs beside it.
  timed_step(f.during);
  f.first.push_back(f.during.back());
  const double wait = reduced_over_ranks(g, async.last_copy_wait_s());
  f.async_blocked.back() += wait;
  f.copy.back() += wait;
  for (int i = 1; i < a.max_steps && decided_by_rank0(g, async.in_flight() ? 1 : 0); ++i)
    timed_step(f.during);
  async.finish();
}

int checkpoint_worker(const CkptArgs& a) {
  at::set_num_threads(1);
  auto g = lockstep::init();
  const int me = g->rank();
  torch::manual_seed(0);
  const std::vector<int64_t> sizes = mlp_sizes(a.count);
  lockstep::models::Mlp model(sizes);
  const auto x = torch::randn({a.batch, sizes.front()});
  Trainee t;
  std::unique_ptr<lockstep::DistributedDataParallel<lockstep::models::MlpImpl>> ddp;
  std::unique_ptr<lockstep::FullyShardedDataParallel<lockstep::models::MlpImpl>> fsdp;
  if (a.strategy == "fsdp") {
    fsdp = std::make_unique<lockstep::FullyShardedDataParallel<lockstep::models::MlpImpl>>(
        model.ptr(), g);
    t.fsdp = &fsdp->core();
    t.opt = std::make_unique<torch::optim::AdamW>(fsdp->parameters(), 1e-4);
    t.step = [&] {
      t.opt->zero_grad();
      (*fsdp)(x).pow(2).mean().backward();
      t.before_update();
      t.opt->step();
    };
  } else {
    ddp = std::make_unique<lockstep::DistributedDataParallel<lockstep::models::MlpImpl>>(
        model.ptr(), g);
    t.opt = std::make_unique<torch::optim::AdamW>(ddp->parameters(), 1e-4);
    t.step = [&] {
      t.opt->zero_grad();
      (*ddp)(x).pow(2).mean().backward();
      t.before_update();
      t.opt->step();
    };
  }
  t.before_update = [] {};
  for (int i = 0; i < 2; ++i) t.step();  // AdamW's state exists from here on
  const train::TrainConfig cs = bench_config(a, "sync"), ca = bench_config(a, "async");
  train::BatchPlan plan;
  plan.steps_per_epoch = 1'000'000;
  plan.total_steps = 1'000'000;
  plan.per_step = a.batch;
  train::RunContext ctx_s{g.get(), me, g->size(), &cs}, ctx_a{g.get(), me, g->size(), &ca};
  train::Checkpointer sync(cs, ctx_s, plan, model.ptr(), *t.opt, t.fsdp);
  train::Checkpointer async(ca, ctx_a, plan, model.ptr(), *t.opt, t.fsdp);
  async.set_copy_beside_step(!a.copy_in_save);  // as the trainer does
  t.before_update = [&async] { async.before_update(); };
  Figures f;
  int64_t k = 0;
  for (int r = 0; r < a.rounds; ++r) round(*g, t, sync, async, k, a, f);
  report_result(me, "step_s", median(f.base));
  report_result(me, "step_during_save_s", median(f.during));
  report_result(me, "first_step_s", median(f.first));
  report_result(me, "steps_during_save", double(f.during.size()) / a.rounds);
  report_result(me, "sync_blocked_s", median(f.sync_blocked));
  report_result(me, "async_blocked_s", median(f.async_blocked));
  report_result(me, "copy_s", median(f.copy));
  report_result(me, "staging_bytes", double(async.staging().bytes()));
  g->barrier()->wait();
  for (const auto* c : {&cs, &ca})
    if (me == 0) std::filesystem::remove_all(c->checkpoint.dir);
  return 0;
}

// ---------------------------------------------------------------------------------------
// Driver

int run_driver(const CkptArgs& a) {
  Table table({"strategy", "params", "ranks", "staging/rank0", "sync blocked s", "async blocked s",
               "of which copy s", "async/sync", "step s", "first step s", "step during save s",
               "during/plain", "steps/save"});
  int failures = 0;
  for (const auto& strategy : split_csv(a.strategies)) {
    for (const auto& p : split_csv(a.params)) {
      const std::string cmd = rank_environment() + "'" LOCKSTEP_RUN_PATH "' --nproc-per-node " +
                              std::to_string(a.nproc) + " --master-port 0 " + self_command() +
                              " checkpoint --worker --strategy " + strategy + " --count " +
                              std::to_string(parse_count(p)) + " --rounds " +
                              std::to_string(a.rounds) + " --batch " + std::to_string(a.batch) +
                              " --max-steps " + std::to_string(a.max_steps) +
                              (a.copy_in_save ? " --copy-in-save" : "") + " --out '" + a.out + "'";
      const JobOutput job = run_job_quiet(cmd);
      if (job.status != 0 || job.results.count("async_blocked_s") == 0) {
        std::cerr << "checkpoint " << strategy << " " << p << " failed:\n" << job.output << "\n";
        ++failures;
        continue;
      }
      const auto& r = job.results;
      const double sb = r.at("sync_blocked_s"), ab = r.at("async_blocked_s");
      const double st = r.at("step_s"), sd = r.at("step_during_save_s");
      table.add({strategy, p, std::to_string(a.nproc), format_size(int64_t(r.at("staging_bytes"))),
                 fmt(sb, 3), fmt(ab, 4), fmt(r.at("copy_s"), 4), "1/" + fmt(sb / ab, 1), fmt(st, 4),
                 fmt(r.at("first_step_s"), 4), fmt(sd, 4), fmt(sd / st, 3) + "x",
                 fmt(r.at("steps_during_save"), 1)});
      std::cout << table.str() << std::flush;
    }
  }
  std::cout << "\nfinal:\n"
            << table.str()
            << "targets: async blocked <= 1/25 of sync; step during a save <= 1.05x a plain step\n";
  return failures ? 1 : 0;
}

}  // namespace

Command checkpoint_command(CLI::App& bench) {
  auto a = std::make_shared<CkptArgs>();
  CLI::App* app = bench.add_subcommand(
      "checkpoint", "the trainer's asynchronous checkpoint beside its synchronous one");
  app->add_option("--params", a->params, "model sizes (parameters), comma-separated")
      ->capture_default_str();
  app->add_option("--strategies", a->strategies, "ddp, fsdp, comma-separated")
      ->capture_default_str();
  app->add_option("--nproc", a->nproc, "ranks")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("--rounds", a->rounds, "rounds (medians over them)")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--batch", a->batch, "samples per rank and step")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_option("--max-steps", a->max_steps, "most steps timed during one async save")
      ->check(CLI::PositiveNumber)
      ->capture_default_str();
  app->add_flag("--copy-in-save", a->copy_in_save,
                "the staging copy in save(), not beside the next step (the earlier design)");
  app->add_option("--out", a->out, "where the checkpoints go (removed at the end)")
      ->capture_default_str();
  app->add_flag("--worker", a->worker)->group(kWorkerOnly);
  app->add_option("--strategy", a->strategy)->group(kWorkerOnly);
  app->add_option("--count", a->count)->group(kWorkerOnly);
  return {app, [a] { return a->worker ? checkpoint_worker(*a) : run_driver(*a); }};
}

}  // namespace lockstep::bench
