#include "train/loop/replica_loop.h"

#include "train/loop/lr_schedule.h"

#include <signal.h>
#include <unistd.h>
#include <cstdlib>
#include <iostream>

namespace lockstep::train {
namespace {

// Test-only (tests/train/ft_train_test.sh): LOCKSTEP_TEST_REPLICA_KILL="POINT,STEP,REPLICA
// ..." (specs separated by spaces) makes replica REPLICA's first incarnation kill itself
// (SIGKILL) at POINT of step STEP (1-based; * for any): forward (before the step's first
// micro-batch), reduce (before the cross-replica average), vote (before the commit vote),
// optimizer (committed, before the optimizer step), heal (saving its state for a joiner).
constexpr const char* kTestReplicaKill = "LOCKSTEP_TEST_REPLICA_KILL";
// Test-only: LOCKSTEP_TEST_DEGRADED_PAUSE_MS=N makes every step that runs with fewer
// replicas than the job's wait N ms first, standing in for a real model's longer steps: a
// restarted replica then comes back while the tiny job still has steps left, however fast
// the machine runs them.
constexpr const char* kTestDegradedPause = "LOCKSTEP_TEST_DEGRADED_PAUSE_MS";

void degraded_pause(int replicas, int expected) {
  static const char* ms = std::getenv(kTestDegradedPause);
  if (ms && replicas < expected) ::usleep(useconds_t(std::atoi(ms)) * 1000);
}

void kill_point(const char* point, int64_t step, int replica) {
  if (restart_count_from_env() > 0 ||
      !test_point_named(std::getenv(kTestReplicaKill), point, step, replica))
    return;
  std::cerr << "lockstep-train: " << kTestReplicaKill << ": replica " << replica << " killed at "
            << point << " of step " << step << std::endl;
  ::kill(::getpid(), SIGKILL);
}

ft::ManagerOptions manager_options(const FaultToleranceConfig& c) {
  auto ms = [](double s) { return comm::Millis(int64_t(s * 1000)); };
  ft::ManagerOptions o;
  o.timeout = ms(c.timeout_s);
  o.quorum_timeout = ms(c.quorum_timeout_s);
  o.heartbeat = ms(c.heartbeat_s);
  o.min_replicas = int(c.min_replicas);
  return o;
}

}  // namespace

ReplicaLoop::ReplicaLoop(const TrainConfig& cfg, Workload& workload, const BatchPlan& plan,
                         const RunContext& ctx, const RunContext& replica,
                         std::shared_ptr<torch::nn::Module> model, StepRunner& runner)
    : cfg_(cfg),
      ckpt_cfg_(cfg),
      workload_(workload),
      plan_(plan),
      ctx_(ctx),
      replica_ctx_(replica),
      shards_(replica.world),
      shard_(replica.rank),
      replicas_(ctx.world / replica.world),
      replica_id_(ctx.rank / replica.world),
      model_(std::move(model)),
      runner_(runner) {
  ckpt_cfg_.checkpoint.mode = "sync";
  record_.replica_id = replica_id_;
}

ReplicaLoop::~ReplicaLoop() = default;

// Under HSDP the replica's last rank dies (its mates find their group broken).
void ReplicaLoop::test_point(const char* point, int64_t step) const {
  if (shard_ == shards_ - 1) kill_point(point, step, replica_id_);
}

// What a joiner receives: the model (under HSDP this rank's shards and the buffers), the
// optimizer state and the loss scaler. The data position, the lr and the dropout seeds
// follow from the step number.
void ReplicaLoop::save_state(torch::serialize::OutputArchive& ar) {
  test_point("heal", ft_->step() + 1);
  torch::serialize::OutputArchive model, optimizer;
  if (runner_.fsdp()) {
    const auto shards = runner_.parameters();
    for (size_t i = 0; i < shards.size(); ++i) model.write(std::to_string(i), shards[i]);
    for (const auto& b : model_->named_buffers()) model.write(b.key(), b.value(), true);
  } else {
    model_->save(model);
  }
  runner_.optimizer().save(optimizer);
  ar.write("model", model);
  ar.write("optimizer", optimizer);
  ar.write("slots", torch::tensor({int64_t(replicas_), plan_.steps_per_epoch, int64_t(shards_)}));
  if (auto* scaler = runner_.scaler()) {
    torch::serialize::OutputArchive s;
    scaler->save(s);
    ar.write("scaler", s);
  }
}

void ReplicaLoop::load_state(torch::serialize::InputArchive& ar) {
  // The job's geometry must be this replica's: a replica launched for another number of
  // replicas (another --nnodes) would deal the data slots differently.
  torch::Tensor geometry;
  ar.read("slots", geometry);
  const int64_t slots = geometry[0].item<int64_t>(), steps = geometry[1].item<int64_t>();
  const int64_t shards = geometry[2].item<int64_t>();
  if (slots != replicas_ || steps != plan_.steps_per_epoch || shards != shards_)
    throw ConfigError(lockstep::detail::concat(
        cfg_.source, ": replica ", replica_id_, " was started as one of ", replicas_,
        " replicas of ", shards_, " rank(s) (", plan_.steps_per_epoch,
        " steps per epoch), but the job it joins has ", slots, " of ", shards, " (", steps,
        " steps per epoch): start it with the job's --nnodes, --nproc-per-node and "
        "--replica-size, and the same config"));
  torch::serialize::InputArchive model, optimizer;
  ar.read("model", model);
  ar.read("optimizer", optimizer);
  if (runner_.fsdp()) {
    torch::NoGradGuard no_grad;
    const auto shards_now = runner_.parameters();
    for (size_t i = 0; i < shards_now.size(); ++i) {
      torch::Tensor t;
      model.read(std::to_string(i), t);
      shards_now[i].copy_(t);
    }
    for (auto& b : model_->named_buffers()) model.read(b.key(), b.value(), true);
  } else {
    model_->load(model);
  }
  runner_.optimizer().load(optimizer);
  if (auto* scaler = runner_.scaler()) {
    torch::serialize::InputArchive s;
    ar.read("scaler", s);
    scaler->load(s);
  }
}

Checkpointer& ReplicaLoop::checkpointer() {
  if (!checkpointer_) {
    checkpointer_ = std::make_unique<Checkpointer>(ckpt_cfg_, replica_ctx_, plan_, model_,
                                                   runner_.optimizer(), runner_.fsdp());
    checkpointer_->set_scaler(runner_.scaler());
  }
  return *checkpointer_;
}

// Slot `slot`'s stream, at the data position of step `step` (0-based): epoch step / S,
// past the (step mod S) x per_step examples before it. A stream read in order from the
// previous step is there already; otherwise (a discarded step, a heal, a slot new to this
// replica) it is moved there.
BatchStream& ReplicaLoop::slot_at(int slot, int64_t step) {
  Slot& s = slots_[slot];
  if (!s.stream) {
    RunContext part = ctx_;  // under HSDP a slot is S parts: this rank trains one of them
    part.rank = slot * shards_ + shard_;
    s.stream = workload_.train_batches(part);
  }
  const int64_t epoch = step / plan_.steps_per_epoch;
  const int64_t position = (step % plan_.steps_per_epoch) * plan_.per_step;
  if (s.epoch != epoch || s.position != position) s.stream->begin_epoch(epoch, position);
  s.epoch = epoch;
  s.position = position + plan_.per_step;
  return *s.stream;
}

// This replica's slots of step `step`: forward and backward, each slot's loss weighted by
// n/R. Returns the weighted loss sum.
double ReplicaLoop::backward(int64_t step) {
  const int n = ft_->replicas(), slots = replicas_;
  const double weight = double(n) / double(slots);
  double loss = 0;
  for (int s = ft_->replica_rank(); s < slots; s += n) {
    const uint64_t part = uint64_t(s) * uint64_t(shards_) + uint64_t(shard_);
    torch::manual_seed(uint64_t(cfg_.run.seed) * 0x9E3779B97F4A7C15ull +
                       uint64_t(step) * uint64_t(ctx_.world) + part);
    loss += runner_.accumulate(slot_at(s, step), plan_.accum, weight);
  }
  return loss;
}

// One attempt at step `step` (0-based) over the quorum's members; true when it committed
// (the optimizer stepped, or skipped a non-finite step on every member alike). *loss: the
// step's mean loss over the R slots.
bool ReplicaLoop::make_step(int64_t step, double lr, double* loss) {
  runner_.begin_step(lr);
  test_point("forward", step + 1);
  auto loss_sum = torch::full({1}, backward(step), torch::kFloat64);
  // Every member averages the same tensors: a gradient this replica's batches left
  // undefined is a zero one. Under HSDP these are this rank's shards' (FSDP averaged
  // them over the replica's ranks), reduced with the same shard of the other members.
  std::vector<at::Tensor> tensors{loss_sum};
  for (auto& p : runner_.parameters())
    if (p.requires_grad()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      tensors.push_back(p.grad());
    }
  test_point("reduce", step + 1);
  ft_->allreduce(tensors);
  // The loss: each rank's covers its parts of the slots; the replica's is their mean.
  if (shards_ > 1) replica_ctx_.group->allreduce(loss_sum, {comm::ReduceOp::Avg})->wait();
  test_point("vote", step + 1);
  if (!ft_->should_commit()) {
    ctx_.say("step " + std::to_string(step + 1) + " discarded: " + ft_->last_error());
    return false;
  }
  test_point("optimizer", step + 1);
  *loss = loss_sum.item<double>();
  // The averaged gradients are the same on every member: so is the finiteness decision,
  // made here without a collective.
  runner_.apply_step(*loss, step + 1);
  return true;
}

void ReplicaLoop::after_commit(int64_t step, double loss,
                               const std::function<EvalResult()>& evaluate) {
  reports_ = ft_->replica_rank() == 0;
  record_.replicas_at_end = ft_->replicas();
  if (reports_) checkpointer().after_step(step, loss);  // writes and commits when due
  const int64_t every = cfg_.eval.every_steps;
  if (replica_id_ == 0 && every > 0 && step % every == 0 && step < plan_.total_steps)
    log_->record_eval(step, now_s() - t_loop_, evaluate());
}

LoopResult ReplicaLoop::run(bool resume, const std::function<EvalResult()>& evaluate) {
  ft::ManagerOptions mo = manager_options(cfg_.fault_tolerance);
  mo.replica_id = replica_id_;
  if (shards_ > 1) mo.replica_group = runner_.group();  // FSDP's: the replica's ranks
  if (resume && replica_id_ == 0) mo.start_step = checkpointer().resume();
  ft_ = std::make_unique<ft::Manager>(
      mo, ft::StateFns{[this](auto& ar) { save_state(ar); }, [this](auto& ar) { load_state(ar); }});
  const LrSchedule schedule(cfg_.optim.lr * plan_.lr_scale, cfg_.schedule.warmup_steps,
                            plan_.total_steps, cfg_.schedule.min_lr_ratio);
  model_->train();
  t_loop_ = now_s();
  LoopResult r;
  r.step = ft_->step();  // a resumed replica's
  while (ft_->step() < plan_.total_steps) {
    if (!ft_->start_step()) break;  // the others finished the job without this replica
    const int64_t step = ft_->step();
    degraded_pause(ft_->replicas(), replicas_);
    if (!log_) {
      log_ = std::make_unique<StepLog>(cfg_, ctx_, plan_, step);
      record_.joined_at = step;
    }
    const double lr = schedule.lr(step);
    const double t0 = now_s();
    double loss = 0;
    if (!make_step(step, lr, &loss)) continue;
    r.step = step + 1;
    r.last_loss = loss;
    log_->record(r.step, step / plan_.steps_per_epoch, loss, lr, now_s() - t0);
    after_commit(r.step, loss, evaluate);
    if (cfg_.train.stop_after_steps > 0 && r.step == cfg_.train.stop_after_steps &&
        r.step < plan_.total_steps) {
      r.stopped = true;
      break;
    }
  }
  if (log_) log_->finish();
  record_.stats = ft_->stats();
  // An earlier step's first member that the others finished without does not report.
  reports_ = reports_ && (r.step == plan_.total_steps || r.stopped);
  ft_.reset();  // BYE: done, not lost
  return r;
}

}  // namespace lockstep::train
