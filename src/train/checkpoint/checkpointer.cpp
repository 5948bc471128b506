#include "train/checkpoint/checkpointer.h"

#include "train/loop/diloco_support.h"

#include <lockstep/env_contract.h>
#include <lockstep/train/atomic_file.h>

#include <ATen/CPUGeneratorImpl.h>
#include <c10/util/Exception.h>
#include <nlohmann/json.hpp>

#include <cstdlib>
#include <iostream>
#include <map>
#include <mutex>
#include <sstream>

using json = nlohmann::json;

namespace lockstep::train {
namespace {

bool debug_enabled() {
  const char* v = std::getenv(env::kDebug);
  return v && *v && std::string(v) != "0";
}

// libtorch's message without its stack trace, on one line (the trace with LOCKSTEP_DEBUG=1).
std::string torch_message(const c10::Error& e) {
  if (debug_enabled()) return e.what();
  std::string m = e.what_without_backtrace();
  m = m.substr(0, m.find('\n'));
  return m + " (set " + env::kDebug + "=1 for libtorch's trace)";
}

// A file libtorch cannot parse: damage when the checkpoint has no checksums to tell, else
// (the bytes are the ones written) a checkpoint that does not fit this model or optimizer.
[[noreturn]] void throw_load_error(const CheckpointReader& ck, const std::string& name,
                                   const c10::Error& e) {
  if (!ck.verified())
    throw CheckpointError(ck.path(name) +
                          ": libtorch cannot load it (damaged or truncated?): " + torch_message(e));
  throw Error(ck.path(name) +
              ": intact (checksum ok) but it does not fit this run: " + torch_message(e));
}

template <class T>
void load_file(T& obj, const CheckpointReader& ck, const std::string& name) {
  std::istringstream is(ck.read(name));
  try {
    torch::load(obj, is);
  } catch (const c10::Error& e) {
    throw_load_error(ck, name, e);
  }
}

// Every parameter's and buffer's shape, by name.
std::map<std::string, std::vector<int64_t>> shapes_of(const torch::nn::Module& m) {
  std::map<std::string, std::vector<int64_t>> out;
  for (const auto& p : m.named_parameters()) out[p.key()] = p.value().sizes().vec();
  for (const auto& b : m.named_buffers()) out[b.key()] = b.value().sizes().vec();
  return out;
}

std::string shape_text(const std::vector<int64_t>& s) {
  std::string out = "[";
  for (size_t i = 0; i < s.size(); ++i) out += (i ? "," : "") + std::to_string(s[i]);
  return out + "]";
}

// libtorch's Module::load replaces a tensor whatever its shape, so a checkpoint of another
// model (e.g. another model.d_ff) would load silently: compare the shapes it left.
void check_shapes(const CheckpointReader& ck,
                  const std::map<std::string, std::vector<int64_t>>& want,
                  const std::map<std::string, std::vector<int64_t>>& got) {
  for (const auto& [name, shape] : want) {
    const auto it = got.find(name);
    if (it != got.end() && it->second == shape) continue;
    throw Error(ck.path("model.pt") + ": " +
                (ck.verified() ? "intact (checksum ok) but it" : "it") +
                " does not fit this run: '" + name + "' is " +
                (it == got.end() ? std::string("missing") : shape_text(it->second)) +
                " in the checkpoint, " + shape_text(shape) +
                " in this model (resume with the configuration that wrote it)");
  }
}

// Whether a checkpoint holds FSDP's sharded files (its meta.json says strategy "fsdp";
// checkpoints older than the key hold model.pt and optimizer.pt).
bool is_sharded(const json& meta) { return meta.value("strategy", std::string()) == "fsdp"; }

// How loading one checkpoint went on this rank.
struct Attempt {
  std::string damage;  // a CheckpointError: try the previous checkpoint
  std::string fatal;   // anything else: stop
};

// Collective: the lowest rank whose attempt failed fatally and the lowest whose checkpoint
// was damaged (ctx.world for none), identical on every rank.
std::pair<int, int> agree(const RunContext& ctx, const Attempt& a) {
  int fatal = a.fatal.empty() ? ctx.world : ctx.rank;
  int damaged = a.damage.empty() ? ctx.world : ctx.rank;
  if (ctx.group) {
    auto t = torch::tensor({int64_t(fatal), int64_t(damaged)}, torch::kInt64);
    ctx.group->allreduce(t, {comm::ReduceOp::Min})->wait();
    fatal = int(t[0].item<int64_t>());
    damaged = int(t[1].item<int64_t>());
  }
  return {fatal, damaged};
}

}  // namespace

int64_t restart_count_from_env() {
  for (const char* name : {env::kRestartCount, env::kTorchelasticRestartCount}) {
    const char* v = std::getenv(name);
    if (!v) continue;
    char* end = nullptr;
    const long long n = std::strtoll(v, &end, 10);
    if (!*v || *end || n < 0)
      throw ConfigError(std::string(name) + "='" + v + "' is not a non-negative integer");
    return n;
  }
  return 0;
}

Checkpointer::Checkpointer(const TrainConfig& cfg, const RunContext& ctx, const BatchPlan& plan,
                           std::shared_ptr<torch::nn::Module> model,
                           torch::optim::Optimizer& optimizer, fsdp::FSDPCore* fsdp)
    : cfg_(cfg),
      ctx_(ctx),
      plan_(plan),
      model_(std::move(model)),
      optimizer_(optimizer),
      fsdp_(fsdp),
      store_(cfg.checkpoint.dir, ctx.group, cfg.checkpoint.keep),
      writer_(std::make_unique<CheckpointWriter>(cfg.checkpoint.mode == "async")) {
  // Saves create step-N.tmp/ without a barrier: crash leftovers go first (a step-N.tmp/
  // of this run's own steps would otherwise mix its files with the new ones).
  if (ctx_.rank == 0) store_.remove_leftovers();
  ctx_.barrier();
  if (!async()) return;
  check_snapshot_supported(optimizer_);  // before training, not at the first save
  if (fsdp_) fsdp_layout_ = std::make_unique<FsdpShardLayout>(read_fsdp_layout(*fsdp_));
}

Checkpointer::~Checkpointer() = default;  // writer_ first: it waits for its running job

// Rank 0's list, so that every rank tries the same checkpoints in the same order.
std::vector<std::string> Checkpointer::shared_candidates() const {
  std::vector<int64_t> steps;
  if (ctx_.rank == 0) {
    std::string note;
    for (const auto& d : store_.candidates(&note))
      steps.push_back(*CheckpointStore::parse_step_name(d.substr(d.rfind('/') + 1)));
    if (!note.empty()) ctx_.say("warning: " + note);
  }
  if (ctx_.group) {
    auto n = torch::tensor({int64_t(steps.size())}, torch::kInt64);
    ctx_.group->broadcast(n)->wait();
    auto t = torch::zeros({std::max<int64_t>(n.item<int64_t>(), 1)}, torch::kInt64);
    for (size_t i = 0; i < steps.size(); ++i) t[int64_t(i)] = steps[i];
    ctx_.group->broadcast(t)->wait();
    steps.resize(size_t(n.item<int64_t>()));
    for (size_t i = 0; i < steps.size(); ++i) steps[i] = t[int64_t(i)].item<int64_t>();
  }
  std::vector<std::string> out;
  for (int64_t s : steps) out.push_back(store_.dir() + "/" + CheckpointStore::step_name(s));
  return out;
}

int64_t Checkpointer::resume() {
  const std::vector<std::string> dirs = shared_candidates();
  if (dirs.empty()) {
    ctx_.say("resume: no checkpoint in " + store_.dir() + "; starting from step 0");
    return 0;
  }
  for (size_t i = 0; i < dirs.size(); ++i) {
    Attempt a;
    int64_t step = 0;
    try {
      step = load(dirs[i]);
    } catch (const CheckpointError& e) {
      a.damage = e.what();
    } catch (const json::exception& e) {  // meta.json of an unverified checkpoint
      a.damage = dirs[i] + "/meta.json: damaged: " + e.what();
    } catch (const ConfigError&) {
      throw;  // every rank reads the same meta.json and raises the same error
    } catch (const std::exception& e) {
      a.fatal = e.what();
    }
    const auto [fatal, damaged] = agree(ctx_, a);
    if (fatal < ctx_.world) {
      if (fatal == ctx_.rank) throw Error("resume: " + a.fatal);
      throw Error("resume: loading " + dirs[i] + " failed on rank " + std::to_string(fatal) +
                  " (see its error)");
    }
    if (damaged == ctx_.world) {
      ctx_.say(resumed_note_);
      return step;
    }
    if (!a.damage.empty())
      std::cerr << "lockstep-train: warning: rank " << ctx_.rank << ": " << a.damage << "\n";
    const bool last = i + 1 == dirs.size();
    ctx_.say("warning: skipping damaged checkpoint " + dirs[i] + " (rank " +
             std::to_string(damaged) + ": " +
             (damaged == ctx_.rank ? a.damage : "see its warning") + ")" +
             (last ? "" : "; trying " + dirs[i + 1]));
    if (last)
      throw CheckpointError("resume: no intact checkpoint in " + store_.dir() + " (tried " +
                            std::to_string(dirs.size()) + ", newest " + dirs.front() +
                            "): remove the directory to start from step 0");
  }
  return 0;  // not reached
}

// One checkpoint into the model, optimizer and RNG; returns its step.
int64_t Checkpointer::load(const std::string& dir) {
  const CheckpointReader ck(dir);
  const json meta = json::parse(ck.meta_json());
  if (!ck.verified())
    ctx_.say("warning: " + dir +
             " has no checksums (written before lockstep recorded them): loading it unverified");
  check_compatible(dir, meta);
  const int64_t step = meta.at("step");
  const int saved_world = meta.at("world_size").get<int>();
  load_state(ck);
  restore_rng(ck, step, saved_world);
  if (scaler_ != nullptr && meta.contains("loss_scaler"))  // else the scaler starts afresh
    scaler_->restore(meta["loss_scaler"].at("scale").get<double>(),
                     meta["loss_scaler"].at("growth_tracker").get<int64_t>());
  resumed_note_ =
      "resumed from " + dir + " at step " + std::to_string(step) +
      (saved_world == ctx_.world
           ? ""
           : " (written by " + std::to_string(saved_world) + " ranks, " +
                 (fsdp_ ? "resharded onto " : "continuing on ") + std::to_string(ctx_.world) + ")");
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
  const bool replicas = meta.value("strategy", std::string("ddp")) == "diloco";
  if (replicas != (diloco_ != nullptr))
    throw ConfigError(dir + ": written with strategy.kind = \"" +
                      meta.value("strategy", std::string("ddp")) +
                      "\"; this run has strategy.kind = \"" + cfg_.strategy.kind +
                      "\": resume with the kind that wrote it");
  if (replicas && meta.at("world_size").get<int>() != ctx_.world)
    throw ConfigError(lockstep::detail::concat(
        dir, ": written by ", meta.at("world_size").get<int>(),
        " DiLoCo replicas (ranks), whose parameters differ inside a round; this run has ",
        ctx_.world, ": resume on ", meta.at("world_size").get<int>(), " ranks"));
  // Any world size: full files load anywhere and FSDP reshards; the data position is the
  // step's fraction of the epoch on every rank's new part (see restore_rng for the RNG).
  const int saved_world = meta.at("world_size").get<int>();
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
void Checkpointer::load_state(const CheckpointReader& ck) {
  if (diloco_) return load_replica(ck);
  if (!fsdp_) {
    const auto before = shapes_of(*model_);
    load_file(model_, ck, "model.pt");
    check_shapes(ck, before, shapes_of(*model_));
    load_file(optimizer_, ck, "optimizer.pt");
    return;
  }
  std::string current;  // the file FSDP is reading, for libtorch's errors
  try {
    fsdp_->load_sharded_state(
        [&](const std::string& name) {
          current = name;
          return ck.read(name);
        },
        &optimizer_);
  } catch (const c10::Error& e) {
    throw_load_error(ck, current, e);
  }
}

// DiLoCo: this rank's replica and the outer loop's state (the same world size: checked).
void Checkpointer::load_replica(const CheckpointReader& ck) {
  const int r = ctx_.rank;
  const auto before = shapes_of(*model_);
  load_file(model_, ck, rank_file_name("model", r));
  check_shapes(ck, before, shapes_of(*model_));
  load_file(optimizer_, ck, rank_file_name("optimizer", r));
  const std::string name = diloco_file_name(r);
  std::istringstream is(ck.read(name));
  try {
    torch::serialize::InputArchive ar;
    ar.load_from(is);
    diloco_->load_state(read_named(ar));
  } catch (const c10::Error& e) {
    throw_load_error(ck, name, e);
  } catch (const InvalidArgument& e) {
    throw ConfigError(ck.path(name) + ": " + e.what());
  }
}

// The same world size continues every rank's generator; another one (FSDP) has no state
// for the new ranks, so every rank reseeds from (run.seed, step, rank).
void Checkpointer::restore_rng(const CheckpointReader& ck, int64_t step, int saved_world) const {
  if (saved_world != ctx_.world) {
    torch::manual_seed(uint64_t(cfg_.run.seed) * 1000003u + uint64_t(step) * 1009u +
                       uint64_t(ctx_.rank));
    return;
  }
  torch::Tensor rng;
  load_file(rng, ck, "rng-rank-" + std::to_string(ctx_.rank) + ".pt");
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(rng);
}

bool Checkpointer::due(int64_t step) const {
  const bool periodic = cfg_.checkpoint.every_steps > 0 && step % cfg_.checkpoint.every_steps == 0;
  const bool stop_now = cfg_.train.stop_after_steps > 0 && step == cfg_.train.stop_after_steps;
  return periodic || stop_now || step == plan_.total_steps;
}

}  // namespace lockstep::train
