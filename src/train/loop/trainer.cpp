// The trainer's run in its phases: join the group, prepare data, plan batches, build the
// model and optimizer, resume, the loop, evaluation and the report. Each phase is a
// function here or a small class beside it (batch_plan, step_runner, checkpointer,
// step_log, run_report).
#include <lockstep/train/trainer.h>

#include "train/checkpoint/checkpointer.h"
#include "train/checkpoint/crc32.h"
#include "train/loop/batch_plan.h"
#include "train/loop/lr_schedule.h"
#include "train/loop/replica_loop.h"
#include "train/loop/step_runner.h"
#include "train/report/run_report.h"
#include "train/report/step_log.h"

#include <lockstep/comm/init.h>
#include <lockstep/env_contract.h>

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <optional>

namespace lockstep::train {
namespace {

// CRC-32 (zlib's values) over every parameter's bytes in order: a fingerprint of the final model
// that two runs can be compared by.
int64_t parameter_crc32(torch::nn::Module& model) {
  uint32_t c = 0;
  for (const auto& p : model.parameters()) {
    auto t = p.detach().contiguous();
    c = crc32_update(c, t.data_ptr(), size_t(t.numel() * t.element_size()));
  }
  return int64_t(c);
}

int64_t count_parameters(torch::nn::Module& model) {
  int64_t n = 0;
  for (const auto& p : model.parameters()) n += p.numel();
  return n;
}

}  // namespace

struct Trainer::Impl {
  TrainConfig cfg;
  std::unique_ptr<Workload> workload;
  TrainerOptions opt;
  std::shared_ptr<comm::ProcessGroup> group;  // set for every strategy.kind but "single"
  RunContext ctx;                             // ctx.group: group when world > 1, else null
  // fault_tolerance.enable: the replica's own ranks (this process alone, or under HSDP its
  // shard group, `group`): evaluation, checkpoints and the report.
  RunContext replica_ctx;
  BatchPlan plan;
  std::shared_ptr<torch::nn::Module> model;
  double t_loop = 0;  // when the training loop began (eval.csv's wall_s counts from it)

  int run();
  int run_replica(double t_start);
  void join_replicas();
  void prepare_data_alone() const;
  void join_group();
  std::string strategy_detail() const;
  void build_model();
  bool resume_requested() const;
  LoopResult train_loop(StepRunner& runner, Checkpointer& checkpointer, StepLog& log,
                        int64_t start_step);
  EvalResult evaluate();
  EvalResult evaluate_gathered(StepRunner& runner);
  int finish(const LoopResult& loop, StepRunner& runner, StepLog& log, int64_t start_step,
             double t_start, const ReplicaLoop* replica = nullptr);
  double mean_comm_share(const StepRunner& runner, const StepLog& log) const;
};

void Trainer::Impl::join_group() {
  ctx.config = &cfg;
  const auto env = comm::LaunchEnv::from_environment();
  if (cfg.strategy.kind == "single" && env.world_size > 1)
    throw ConfigError(cfg.source + ": strategy.kind = \"single\" but the job has " +
                      std::to_string(env.world_size) +
                      " ranks; use \"ddp\", \"fsdp\" or \"diloco\"");
  if (cfg.strategy.kind != "single") {
    comm::InitOptions io;
    io.backend = cfg.strategy.backend;
    group = comm::init(io);
    ctx.rank = group->rank();
    ctx.world = group->size();
    ctx.group = ctx.world > 1 ? group.get() : nullptr;
  }
  ctx.say("config " + cfg.source + ", workload " + cfg.run.workload + ", " +
          std::to_string(ctx.world) + " rank(s), strategy " + cfg.strategy.kind +
          (group ? " (" + group->backend_name() + ")" : "") + strategy_detail());
}

// The log's description of the strategy's settings.
std::string Trainer::Impl::strategy_detail() const {
  const StrategyConfig& s = cfg.strategy;
  if (s.kind == "diloco")
    return lockstep::detail::concat(
        ", ", s.diloco_inner_steps, " inner steps per round, outer SGD lr ", s.diloco_outer_lr,
        " momentum ", s.diloco_outer_momentum, s.diloco_nesterov ? " (Nesterov)" : "", ", ",
        s.diloco_fragments, " fragment(s), overlap ", s.diloco_overlap_steps, " step(s), mixing ",
        s.diloco_mixing, ", exchange ",
        s.diloco_compression == "qsgd" ? std::to_string(s.qsgd_bits) + "-bit QSGD"
                                       : std::string("full precision"));
  if (s.kind != "fsdp") return ", comm hook " + s.comm_hook;
  std::string out = ", sharding " + s.sharding + ", wrap " + s.wrap;
  if (s.wrap == "size") out += " >= " + std::to_string(s.wrap_min_params) + " parameters";
  if (!s.param_dtype.empty()) out += ", param dtype " + s.param_dtype;
  if (!s.reduce_dtype.empty()) out += ", reduce dtype " + s.reduce_dtype;
  out += std::string(", backward prefetch ") + (s.backward_prefetch ? "on" : "off") +
         ", forward prefetch " + (s.forward_prefetch ? "on" : "off");
  return out;
}

void Trainer::Impl::build_model() {
  torch::manual_seed(uint64_t(cfg.run.seed));
  model = workload->build_model(ctx);
  LOCKSTEP_CHECK(model, "workload '", cfg.run.workload, "' built no model");
  ctx.say("model: " + workload->model_name() + " " + std::to_string(count_parameters(*model)) +
          " parameters");
}

// --resume, or a restart by the launcher (lockstep-run --max-restarts, torchrun): a
// restarted worker continues from the newest intact checkpoint instead of step 0.
bool Trainer::Impl::resume_requested() const {
  const int64_t restarts = restart_count_from_env();
  if (restarts > 0 && !opt.resume)
    ctx.say("restart " + std::to_string(restarts) +
            " of this job (the launcher's restart count): resuming from the newest intact "
            "checkpoint");
  return opt.resume || restarts > 0;
}

// fault_tolerance.enable: this process is (a rank of) replica LOCKSTEP_REPLICA_ID of the
// LOCKSTEP_REPLICAS launched. No group across replicas (theirs is rebuilt every time they
// change); under HSDP (--replica-size S) the group of the replica's own S ranks.
void Trainer::Impl::join_replicas() {
  if (!std::getenv(env::kCoordinator))
    throw ConfigError(cfg.source + ": fault_tolerance.enable = true but " + env::kCoordinator +
                      " is not set: start the job with lockstep-run --fault-tolerant");
  const auto env = comm::LaunchEnv::from_environment();
  auto number = [&](const char* name, int fallback) {
    const char* v = std::getenv(name);
    return v && *v ? std::atoi(v) : fallback;
  };
  const int shards = number(env::kReplicaSize, 1),
            replicas = number(env::kReplicas, env.world_size);
  if (cfg.strategy.kind == "ddp" && shards > 1)
    throw ConfigError(lockstep::detail::concat(
        cfg.source, ": lockstep-run --replica-size ", shards, " makes replicas of ", shards,
        " ranks, which strategy.kind = \"ddp\" cannot use (a DDP replica is one rank): set "
        "strategy.kind = \"fsdp\" (HSDP) or leave --replica-size out"));
  if (cfg.strategy.kind == "fsdp" && shards < 2)
    throw ConfigError(cfg.source +
                      ": strategy.kind = \"fsdp\" under fault_tolerance.enable shards each "
                      "replica over its ranks (HSDP): launch with lockstep-run --replica-size S, "
                      "S >= 2 ranks per replica");
  ctx.config = &cfg;
  ctx.rank = number(env::kReplicaId, env.rank) * shards + (shards > 1 ? env.rank : 0);
  ctx.world = replicas * shards;
  replica_ctx.config = &cfg;
  if (shards > 1) {
    comm::InitOptions io;
    io.backend = cfg.strategy.backend;
    group = comm::init(io);
    replica_ctx = {group.get(), group->rank(), group->size(), &cfg};
  }
  if (cfg.fault_tolerance.min_replicas > replicas)
    throw ConfigError(lockstep::detail::concat(
        cfg.source, ": fault_tolerance.min_replicas = ", cfg.fault_tolerance.min_replicas,
        " but the job has ", replicas, " replicas; lower it or start more"));
  ctx.say(lockstep::detail::concat(
      "config ", cfg.source, ", workload ", cfg.run.workload, ", ", replicas, " replica(s)",
      shards > 1 ? lockstep::detail::concat(" of ", shards, " ranks") : "",
      ", fault tolerant (min ", cfg.fault_tolerance.min_replicas, "), strategy ", cfg.strategy.kind,
      strategy_detail()));
}

// Each replica makes sure of the data alone, one at a time (a lock file in run.out_dir):
// the first makes it, the others find it made. A restarted replica finds it at once.
void Trainer::Impl::prepare_data_alone() const {
  std::filesystem::create_directories(cfg.run.out_dir);
  const std::string path = cfg.run.out_dir + "/.prepare-data.lock";
  struct Lock {  // closing the file releases the lock
    int fd;
    ~Lock() {
      if (fd >= 0) ::close(fd);
    }
  } lock{::open(path.c_str(), O_CREAT | O_RDWR | O_CLOEXEC, 0644)};
  if (lock.fd < 0) throw Error("cannot open " + path + ": " + std::strerror(errno));
  while (::flock(lock.fd, LOCK_EX) != 0 && errno == EINTR) {
  }
  RunContext alone;
  alone.config = &cfg;
  workload->prepare_data(alone);
}

int Trainer::Impl::run_replica(double t_start) {
  join_replicas();
  prepare_data_alone();
  if (opt.generate_only) return kExitOk;
  plan = plan_batches(cfg, ctx.world, workload->examples_per_rank(ctx));
  for (const auto& line : describe(plan, cfg, ctx.world)) ctx.say(line);
  build_model();
  StepRunner runner(cfg, *workload, model, group);  // HSDP: FSDP over the replica's ranks
  ReplicaLoop replica(cfg, *workload, plan, ctx, replica_ctx, model, runner);
  // A restarted replica is healed by a live one, never from a checkpoint.
  const LoopResult loop = replica.run(opt.resume && restart_count_from_env() == 0,
                                      [&] { return evaluate_gathered(runner); });
  // Every replica that finished holds the same bits: the line to compare them by.
  if (loop.step > 0) {
    std::optional<fsdp::FSDPCore::FullParamsGuard> full_params;
    if (runner.fsdp()) full_params.emplace(*runner.fsdp());
    if (replica_ctx.rank == 0)
      std::cout << "[lockstep-train] replica " << replica.replica_id() << " ended at step "
                << loop.step << ", parameters crc32 " << parameter_crc32(*model) << std::endl;
  }
  if (loop.stopped) {
    ctx.say("stopped after step " + std::to_string(loop.step) +
            " (train.stop_after_steps); continue with --resume");
    return kExitOk;
  }
  if (!replica.reports()) return kExitOk;  // the last step's first member reports
  return finish(loop, runner, *replica.log(), replica.record().joined_at, t_start, &replica);
}

int Trainer::Impl::run() {
  const double t_start = now_s();
  torch::set_num_threads(int(cfg.train.threads));
  if (cfg.fault_tolerance.enable) return run_replica(t_start);
  join_group();
  workload->prepare_data(ctx);
  if (opt.generate_only) return kExitOk;
  plan = plan_batches(cfg, ctx.world, workload->examples_per_rank(ctx));
  for (const auto& line : describe(plan, cfg, ctx.world)) ctx.say(line);
  build_model();
  StepRunner runner(cfg, *workload, model, group);  // FSDP shards here, before loading
  Checkpointer checkpointer(cfg, ctx, plan, model, runner.optimizer(), runner.fsdp());
  checkpointer.set_scaler(runner.scaler());
  checkpointer.set_diloco(runner.diloco());
  checkpointer.set_copy_beside_step(true);  // the staging copy beside the next step
  runner.set_before_update([&checkpointer] { checkpointer.before_update(); });
  const int64_t start_step = resume_requested() ? checkpointer.resume() : 0;
  runner.wrap_ddp(start_step);  // after loading: DDP broadcasts rank 0's (identical) parameters
  StepLog log(cfg, ctx, plan, start_step);
  const LoopResult loop = train_loop(runner, checkpointer, log, start_step);
  if (loop.stopped) {
    ctx.say("stopped after step " + std::to_string(loop.step) +
            " (train.stop_after_steps); continue with --resume");
    return kExitOk;
  }
  return finish(loop, runner, log, start_step, t_start);
}

LoopResult Trainer::Impl::train_loop(StepRunner& runner, Checkpointer& checkpointer, StepLog& log,
                                     int64_t start_step) {
  auto batches = workload->train_batches(ctx);
  const LrSchedule schedule(cfg.optim.lr * plan.lr_scale, cfg.schedule.warmup_steps,
                            plan.total_steps, cfg.schedule.min_lr_ratio);
  model->train();
  t_loop = now_s();
  LoopResult r;
  r.step = start_step;
  int64_t epoch = -1;
  while (r.step < plan.total_steps) {
    const int64_t e = r.step / plan.steps_per_epoch;
    if (e != epoch) {
      epoch = e;
      batches->begin_epoch(e, (r.step - e * plan.steps_per_epoch) * plan.per_step);
    }
    const double lr = schedule.lr(r.step);
    const double t0 = now_s();
    r.last_loss = runner.step(*batches, lr, plan.accum, r.step + 1);
    const double dt = now_s() - t0;
    ++r.step;
    if (r.step == plan.total_steps) runner.end_of_training();  // before the last checkpoint
    log.record(r.step, epoch, r.last_loss, lr, dt);
    checkpointer.after_step(r.step, r.last_loss);  // commits a finished save; saves when due
    const int64_t every = cfg.eval.every_steps;
    if (every > 0 && r.step % every == 0 && r.step < plan.total_steps)
      log.record_eval(r.step, now_s() - t_loop, evaluate_gathered(runner));
    const bool stop_now = cfg.train.stop_after_steps > 0 && r.step == cfg.train.stop_after_steps;
    if (stop_now && r.step < plan.total_steps) {
      r.stopped = true;
      break;
    }
  }
  checkpointer.finish();  // the last save (asynchronous: still being written) is committed
  log.finish();
  return r;
}

// Exposed communication share, averaged over ranks (each rank waits differently). Collective.
double Trainer::Impl::mean_comm_share(const StepRunner& runner, const StepLog& log) const {
  double share = log.train_time() > 0 ? runner.comm_stats().exposed_comm_s / log.train_time() : 0;
  if (ctx.group) {
    auto t = torch::tensor({share}, torch::kFloat64);
    ctx.group->allreduce(t)->wait();
    share = t.item<double>() / ctx.world;
  }
  return share;
}

// The workload's evaluation (collective: every rank scores its part). Under DiLoCo inside a
// round each rank scores with its own replica.
EvalResult Trainer::Impl::evaluate() {
  torch::NoGradGuard no_grad;
  model->eval();
  EvalResult result = workload->evaluate(cfg.fault_tolerance.enable ? replica_ctx : ctx);
  model->train();
  return result;
}

// evaluate() with FSDP's full parameters gathered for the duration.
EvalResult Trainer::Impl::evaluate_gathered(StepRunner& runner) {
  std::optional<fsdp::FSDPCore::FullParamsGuard> full_params;
  if (runner.fsdp()) full_params.emplace(*runner.fsdp());
  return evaluate();
}

// Evaluation (every rank), then the gate, files and summary (rank 0). Under FSDP all of it
// reads the full parameters, gathered for the duration (FSDPCore::FullParamsGuard).
int Trainer::Impl::finish(const LoopResult& loop, StepRunner& runner, StepLog& log,
                          int64_t start_step, double t_start, const ReplicaLoop* replica) {
  std::optional<fsdp::FSDPCore::FullParamsGuard> full_params;
  if (runner.fsdp()) full_params.emplace(*runner.fsdp());
  const double t_eval = now_s();
  const EvalResult result = evaluate();
  if (cfg.eval.every_steps > 0) log.record_eval(loop.step, t_eval - t_loop, result);
  RunStats s;
  s.eval_time = now_s() - t_eval;
  const GateDecision gate = decide_gate(cfg, result);
  s.world = ctx.world;
  s.backend = replica ? "replicas" : group ? group->backend_name() : "none";
  s.step = loop.step;
  s.steps_run = loop.step - start_step;
  s.steps_per_epoch = plan.steps_per_epoch;
  s.global_batch = plan.per_step * ctx.world;
  s.epoch_times = log.epoch_times();
  s.train_time = log.train_time();
  s.samples_per_s = s.train_time > 0 ? double(s.steps_run * s.global_batch) / s.train_time : 0;
  s.comm_share = mean_comm_share(runner, log);
  s.comm_measured = runner.fsdp() == nullptr && replica == nullptr;
  s.bytes_measured = replica == nullptr;
  const CommStats& c = runner.comm_stats();
  s.bytes_per_step = c.sync_steps ? c.bytes_sent / c.sync_steps : 0;
  s.final_loss = loop.last_loss;
  s.param_crc32 = parameter_crc32(*model);
  s.skipped_steps = c.skipped_steps;
  s.loss_scale = runner.scaler() ? runner.scaler()->get_scale() : 0;
  s.wall_time = now_s() - t_start;
  if (replica) s.replica = replica->record();
  const RunContext& mine = replica ? replica_ctx : ctx;  // who reports: its rank 0
  if (mine.rank == 0) report_run(cfg, *workload, result, gate, s, log.tensorboard());
  mine.barrier();
  return gate.passed ? kExitOk : kExitGateFailed;
}

Trainer::Trainer(LoadedConfig setup, TrainerOptions options) : impl_(std::make_unique<Impl>()) {
  LOCKSTEP_CHECK(setup.workload, "Trainer: the configuration has no workload (use load_config)");
  impl_->cfg = std::move(setup.config);
  impl_->workload = std::move(setup.workload);
  impl_->opt = options;
}
Trainer::~Trainer() = default;
int Trainer::run() { return impl_->run(); }

}  // namespace lockstep::train
