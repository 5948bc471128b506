// lockstep/parallel/fsdp/core.h: the non-template part of FullyShardedDataParallel.
// Users hold a FullyShardedDataParallel (fully_sharded_data_parallel.h); see docs/fsdp.md.
#pragma once
#include <lockstep/comm/process_group.h>
#include <lockstep/compat.h>
#include <lockstep/parallel/fsdp/options.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/ordered_dict.h>

#include <functional>
#include <memory>
#include <string>
#include <type_traits>
#include <unordered_set>
#include <vector>

namespace lockstep::fsdp {

class BufferPool;
class FlatUnit;
class UnitHooksImpl;

// Bytes each rank holds for the model's state, by kind (docs/fsdp.md, "Memory model").
struct MemoryStats {
  int64_t shard_bytes = 0;      // the optimizer's parameters: the local shards
  int64_t gathered_bytes = 0;   // full parameters currently gathered (all units)
  int64_t grad_bytes = 0;       // gradients of the local shards
  int64_t pool_bytes = 0;       // the kept gather and flat-gradient buffers, in use or free
  int64_t secondary_bytes = 0;  // hpZ's secondary shards currently held
};

class FSDPCore {
 public:
  FSDPCore(std::shared_ptr<torch::nn::Module> root, std::shared_ptr<comm::ProcessGroup> group,
           FSDPOptions options);
  ~FSDPCore();
  FSDPCore(const FSDPCore&) = delete;
  FSDPCore& operator=(const FSDPCore&) = delete;

  // The root forward's arguments: floating-point tensors in param_dtype (mixed precision);
  // anything else passes through.
  at::Tensor cast_input(const at::Tensor& t) const;
  template <class T, class = std::enable_if_t<!std::is_same_v<std::decay_t<T>, at::Tensor>>>
  T&& cast_input(T&& x) const {
    return std::forward<T>(x);
  }

  // Around the root module's forward.
  void before_root_forward();
  void after_root_forward(const std::vector<at::Tensor>& outputs);

  // The optimizer's parameters: one flat local shard per unit (1-D, padded, same dtype
  // as the unit's parameters); their .grad() holds the averaged gradient shard after
  // backward.
  std::vector<at::Tensor> parameters() const;
  // Clips the gradient shards to a global L2 norm of at most max_norm (collective: one
  // allreduce of a scalar); returns the norm before clipping.
  double clip_grad_norm(double max_norm);

  // Collective. Full parameters and buffers, by the module's own names, gathered one
  // unit at a time: on rank 0 a copy of each (the whole model's bytes), elsewhere empty.
  torch::OrderedDict<std::string, at::Tensor> full_state_dict();
  // Collective. full_state_dict() saved by rank 0 to `path` (written to a temporary file
  // and renamed) in the format of torch::save(module): torch::load(plain_module, path)
  // reads it into a non-FSDP copy of the model.
  void save_full_state_dict(const std::string& path);

  // Sharded checkpoints (docs/fsdp.md, "State dicts"). Not collective: this rank's part,
  // the bytes of a torch archive holding its shard of every unit, the units' layout, the
  // world size and, if `opt` is given, the optimizer's state for the shards (SGD, Adam,
  // AdamW). Store it as sharded_file_name(rank) next to the other ranks' files.
  std::string sharded_state(const torch::optim::Optimizer* opt = nullptr) const;
  static std::string sharded_file_name(int rank);  // "fsdp-shard-00003.pt"
  // Not collective: loads a checkpoint written at any world size; `read(name)` returns the
  // bytes of one of its files (it reads sharded_file_name(0) first, then those that
  // overlap this rank's shards). A checkpoint of a different model is an error naming the
  // unit or parameter; a missing file is an error naming it.
  void load_sharded_state(const std::function<std::string(const std::string& name)>& read,
                          torch::optim::Optimizer* opt = nullptr);
  // Collective. Both through a directory: every rank writes into `dir`.tmp, then rank 0
  // renames it to `dir` (replacing an older one), so a crash leaves the previous intact.
  void save_sharded_state(const std::string& dir, const torch::optim::Optimizer* opt = nullptr);
  void load_sharded_state(const std::string& dir, torch::optim::Optimizer* opt = nullptr);

  // Collective. Gathers every unit's full parameters, in the master dtype even under mixed
  // precision, until release_full_params(), for code that reads them (evaluation, export).
  // Read-only: changes are not written back. A forward meanwhile is a plain forward (no
  // gathers or hooks; for evaluation, not for backward). Not during forward/backward.
  void summon_full_params();
  void release_full_params();

  MemoryStats memory_stats() const;
  // Compression (FSDPOptions::compression): the bytes this rank has sent in gathers and
  // reductions so far, and what they would have been uncompressed.
  struct TrafficStats {
    int64_t bytes_sent = 0;
    int64_t bytes_uncompressed = 0;
  };
  TrafficStats traffic() const;
  // The compressed reduce-scatter's rounding follows its count of calls (one per unit per
  // backward): a trainer sets it from its step, so that a resumed run rounds as the
  // uninterrupted one did.
  void set_reduce_calls(uint64_t calls);

  // summon_full_params() for the guard's lifetime (collective on construction and at the
  // end): evaluation and export read the model directly inside it.
  class FullParamsGuard {
   public:
    explicit FullParamsGuard(FSDPCore& core) : core_(core) { core_.summon_full_params(); }
    ~FullParamsGuard() {
      try {
        core_.release_full_params();
      } catch (...) {  // a broken group: the memory stays gathered, nothing else is lost
      }
    }
    FullParamsGuard(const FullParamsGuard&) = delete;
    FullParamsGuard& operator=(const FullParamsGuard&) = delete;

   private:
    FSDPCore& core_;
  };
  int num_units() const { return static_cast<int>(units_.size()); }
  comm::ProcessGroup& group() { return *group_; }
  const FSDPOptions& options() const { return options_; }

  // --- used by the units' hooks ------------------------------------------------------
  void unit_pre_forward(int unit);
  void unit_post_forward(int unit, const std::vector<at::Tensor>& outputs);
  void unit_pre_backward(int unit);

 private:
  struct Candidate;
  void build_units(std::vector<Candidate> candidates, const std::vector<std::string>& names,
                   const std::vector<at::Tensor>& params,
                   const std::unordered_set<const c10::TensorImpl*>& shared);
  FlatUnit& unit(int u);
  void install_grad_hooks();  // on every parameter's current AccumulateGrad node
  void check_parameters_unchanged();
  void check_secondary_group();
  bool keep_after_forward() const;
  void attach_pre_backward(int unit, const std::vector<at::Tensor>& outputs);
  void ensure_backward_started();
  void param_grad_ready(int u, size_t i);
  void launch_ready_reductions();
  void finish_backward();
  // The rank that writes full state dicts and renames checkpoint directories: rank 0 of
  // the group (of the first replica, under hybrid_shard).
  bool is_writer() const;
  // Collective: throws on every rank if `failure` is set on any (naming the rank).
  void agree_or_throw(const std::string& failure, const std::string& what);

  std::shared_ptr<torch::nn::Module> root_;
  std::shared_ptr<comm::ProcessGroup> group_;
  FSDPOptions options_;
  int64_t num_params_ = 0;            // parameter names when wrapped (a later change is an error)
  std::unique_ptr<BufferPool> pool_;  // the units' gather and flat-gradient buffers
  std::vector<std::unique_ptr<FlatUnit>> units_;  // wrapped units in model order, then the root
  int root_unit_ = -1;                            // -1: every parameter is in a wrapped unit
  std::vector<std::unique_ptr<UnitHooksImpl>> hooks_;
  std::vector<compat::PostHookHandle> grad_hooks_;
  std::vector<at::Tensor> buffers_;

  // The iteration in progress.
  std::vector<int> forward_order_;       // units in the order their forward began
  std::vector<int> last_forward_order_;  // ... in the previous iteration (forward prefetch)
  std::vector<int> backward_order_;      // reverse forward order, the unused units, the root
  std::vector<bool> ready_;              // per unit: every gradient arrived this backward
  size_t next_reduce_ = 0;               // position in backward_order_ to launch next
  int last_reduce_ = -1;                 // the unit whose reduction is in flight
  bool in_forward_ = false;
  bool backward_started_ = false;
  bool summoned_ = false;
};

}  // namespace lockstep::fsdp
