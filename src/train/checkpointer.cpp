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

}  // namespace

Checkpointer::Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
                           std::shared_ptr<torch::nn::Module> model,
                           torch::optim::Optimizer& optimizer)
    : cfg_(cfg),
      ctx_(ctx),
      plan_(plan),
      model_(std::move(model)),
      optimizer_(optimizer),
      store_(cfg.checkpoint.dir, ctx.group, cfg.checkpoint.keep) {}

int64_t Checkpointer::resume() {
  auto dir = store_.latest();
  if (!dir) {
    ctx_.say("--resume: no checkpoint in " + store_.dir() + "; starting from step 0");
    return 0;
  }
  const json meta = json::parse(read_file(*dir + "/meta.json"));
  if (meta.at("world_size").get<int>() != ctx_.world)
    throw ConfigError(*dir + ": written by " + std::to_string(meta.at("world_size").get<int>()) +
                      " ranks; resuming on " + std::to_string(ctx_.world) +
                      " is not supported (each rank's data position depends on the world size)");
  if (meta.at("total_steps").get<int64_t>() != plan_.total_steps)
    throw ConfigError(*dir + ": the run had " +
                      std::to_string(meta.at("total_steps").get<int64_t>()) +
                      " total steps, this configuration has " + std::to_string(plan_.total_steps));
  from_file(model_, *dir + "/model.pt");
  from_file(optimizer_, *dir + "/optimizer.pt");
  torch::Tensor rng;
  from_file(rng, *dir + "/rng-rank-" + std::to_string(ctx_.rank) + ".pt");
  auto gen = at::detail::getDefaultCPUGenerator();
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    gen.set_state(rng);
  }
  const int64_t step = meta.at("step");
  ctx_.say("resumed from " + *dir + " at step " + std::to_string(step));
  return step;
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
               {"loss", last_loss},
               {"config", json::parse(cfg_.json)}};
  auto gen = at::detail::getDefaultCPUGenerator();
  torch::Tensor rng;
  {
    std::lock_guard<std::mutex> lock(gen.mutex());
    rng = gen.get_state();
  }
  std::map<std::string, std::string> shared;
  if (ctx_.rank == 0) {
    shared = {{"model.pt", to_bytes(model_)},
              {"optimizer.pt", to_bytes(optimizer_)},
              {"meta.json", meta.dump(2)}};
  }
  store_.save(step, shared, {{"rng-rank-" + std::to_string(ctx_.rank) + ".pt", to_bytes(rng)}});
}

}  // namespace lockstep::train
