#include "train/checkpointer.h"

#include <lockstep/train/atomic_file.h>

#include <ATen/CPUGeneratorImpl.h>
#include <nlohmann/json.hpp>

#include <mutex>
#include <sstream>

using json = nlohmann::json;

namespace lockstep::train {
namespace {

template <class T>
std::string to_bytes(const T& obj) {
  std::ostringstream os;
  torch::save(obj, os);
  return os.str();
}
template <class T>
void from_file(T& obj, const std::string& path) {
  std::istringstream is(read_file(path));
  torch::load(obj, is);
}

// Whether a checkpoint holds FSDP's sharded files (its meta.json says strategy "fsdp";
// checkpoints older than the key hold model.pt and optimizer.pt).
bool is_sharded(const json& meta) { return meta.value("strategy", std::string()) == "fsdp"; }

// Collective: a failure on any rank (under FSDP each rank reads its own shard files) is
// raised on every rank, naming the first failing rank, so that no rank goes on to train.
void agree_or_throw(const RunContext& ctx, const std::string& failure) {
  int first = failure.empty() ? ctx.world : ctx.rank;
  if (ctx.group) {
    auto t = torch::tensor({int64_t(first)}, torch::kInt64);
    ctx.group->allreduce(t, {comm::ReduceOp::Min})->wait();
    first = int(t.item<int64_t>());
  }
  if (first == ctx.world) return;
  if (first == ctx.rank) throw Error("resume: " + failure);
  throw Error("resume: loading the checkpoint failed on rank " + std::to_string(first) +
              " (see its error)");
}

}  // namespace

Checkpointer::Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
                           std::shared_ptr<torch::nn::Module> model,
                           torch::optim::Optimizer& optimizer, fsdp::FSDPCore* fsdp)
    : cfg_(cfg),
      ctx_(ctx),
      plan_(plan),
      model_(std::move(model)),
      optimizer_(optimizer),
      fsdp_(fsdp),
      store_(cfg.checkpoint.dir, ctx.group, cfg.checkpoint.keep) {}

int64_t Checkpointer::resume() {
  auto dir = store_.latest();
  if (!dir) {
    ctx_.say("--resume: no checkpoint in " + store_.dir() + "; starting from step 0");
    return 0;
  }
  const json meta = json::parse(read_file(*dir + "/meta.json"));
  check_compatible(*dir, meta);
  std::string failure;
  try {
    load_state(*dir);
  } catch (const std::exception& e) {
    failure = e.what();
  }
  agree_or_throw(ctx_, failure);
  const int64_t step = meta.at("step");
  const int saved_world = meta.at("world_size").get<int>();
  restore_rng(*dir, step, saved_world);
  ctx_.say("resumed from " + *dir + " at step " + std::to_string(step) +
           (saved_world == ctx_.world
                ? ""
                : " (written by " + std::to_string(saved_world) + " ranks, resharded onto " +
                      std::to_string(ctx_.world) + ")"));
  return step;
}

void Checkpointer::check_compatible(const std::string& dir, const json& meta) const {
  const bool sharded = is_sharded(meta);
  if (sharded != (fsdp_ != nullptr))
    throw ConfigError(dir + ": written with strategy.kind = \"" +
                      (sharded ? std::string("fsdp") : meta.value("strategy", std::string("ddp"))) +
                      "\" (" + (sharded ? "sharded" : "full") +
                      " model and optimizer files); this run has strategy.kind = \"" +
                      cfg_.strategy.kind + "\": resume with the kind that wrote it");
  const int saved_world = meta.at("world_size").get<int>();
  if (!sharded && saved_world != ctx_.world)
    throw ConfigError(dir + ": written by " + std::to_string(saved_world) + " ranks; resuming on " +
                      std::to_string(ctx_.world) +
                      " is not supported (each rank's data position depends on the world "
                      "size); strategy.kind = \"fsdp\" checkpoints can change it");
  const auto total = meta.at("total_steps").get<int64_t>();
  if (total != plan_.total_steps)
    throw ConfigError(dir + ": the run had " + std::to_string(total) +
                      " total steps, this configuration has " + std::to_string(plan_.total_steps) +
                      (saved_world != ctx_.world
                           ? " on " + std::to_string(ctx_.world) +
                                 " ranks (set train.keep_global_batch = true, or train.max_steps)"
                           : std::string()));
}

// The model and optimizer: rank 0's full copies, or under FSDP the shards of every rank
// that overlap this one's (read on demand; a missing file is an error naming it).
void Checkpointer::load_state(const std::string& dir) {
  if (fsdp_) {
    fsdp_->load_sharded_state(
        [&dir](const std::string& name) { return read_file(dir + "/" + name); }, &optimizer_);
    return;
  }
  from_file(model_, dir + "/model.pt");
  from_file(optimizer_, dir + "/optimizer.pt");
}

// The same world size continues every rank's generator; another one (FSDP) has no state
// for the new ranks, so every rank reseeds from (run.seed, step, rank).
void Checkpointer::restore_rng(const std::string& dir, int64_t step, int saved_world) const {
  if (saved_world != ctx_.world) {
    torch::manual_seed(uint64_t(cfg_.run.seed) * 1000003u + uint64_t(step) * 1009u +
                       uint64_t(ctx_.rank));
    return;
  }
  torch::Tensor rng;
  from_file(rng, dir + "/rng-rank-" + std::to_string(ctx_.rank) + ".pt");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

bool Checkpointer::due(int64_t step) const {
  const bool periodic = cfg_.checkpoint.every_steps > 0 && step % cfg_.checkpoint.every_steps == 0;
  const bool stop_now = cfg_.train.stop_after_steps > 0 && step == cfg_.train.stop_after_steps;
  return periodic || stop_now || step == plan_.total_steps;
}

void Checkpointer::save(int64_t step, double last_loss) {
  json meta = {{"format", "lockstep-checkpoint"},
               {"version", 1},
               {"step", step},
               {"epoch", step / plan_.steps_per_epoch},
               {"examples_in_epoch", (step % plan_.steps_per_epoch) * plan_.per_step},
               {"total_steps", plan_.total_steps},
               {"world_size", ctx_.world},
               {"strategy", cfg_.strategy.kind},
               {"loss", last_loss},
               {"config", json::parse(cfg_.json)}};
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  std::map<std::string, std::string> shared, per_rank;
  per_rank["rng-rank-" + std::to_string(ctx_.rank) + ".pt"] = to_bytes(rng);
  if (fsdp_)
    per_rank[fsdp::FSDPCore::sharded_file_name(ctx_.rank)] = fsdp_->sharded_state(&optimizer_);
  if (ctx_.rank == 0) {
    shared["meta.json"] = meta.dump(2);
    if (!fsdp_) {
      shared["model.pt"] = to_bytes(model_);
      shared["optimizer.pt"] = to_bytes(optimizer_);
    }
  }
  store_.save(step, shared, per_rank);
}

}  // namespace lockstep::train
