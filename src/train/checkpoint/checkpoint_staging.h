// Host staging for asynchronous checkpoints (docs/checkpoints.md, "Asynchronous saves"):
// the step copies the model's and the optimizer's tensors into buffers that live as long
// as the Checkpointer and are reused by every save, then the background writer serializes
// the copies while training goes on changing the originals.
//
// The snapshots below write the same torch archives, byte for byte, as the synchronous
// path (torch::save of the module and of the optimizer, FSDPCore::sharded_state): the same
// keys in the same order, over tensors of the same geometry (a staged tensor has its
// original's sizes, strides, storage offset, dtype and requires_grad, over a copy of its
// whole storage). tests/unit/test_train_checkpoint.cpp compares the files.
#pragma once

#include <lockstep/parallel/fsdp/core.h>

#include <torch/nn/module.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace lockstep::train {

// Reusable copies of tensors' storages. One per Checkpointer; used by the training
// thread while it snapshots and read by the writer thread while it serializes (never both:
// the next snapshot waits for the previous save). Not thread-safe.
//
// A deferred snapshot (begin(true)) records its copies instead of making them: the copy
// thread runs copy_pending() while the step goes on, and the training thread waits for it
// before it changes what was staged (the optimizer update: Checkpointer::before_update).
class HostStaging {
 public:
  // Starts a snapshot; `defer`: stage() records its copies for copy_pending().
  void begin(bool defer = false);
  // A tensor like `live` (sizes, strides, storage offset, dtype, requires_grad) over the
  // staged copy of its whole storage, copied now or, in a deferred snapshot, by
  // copy_pending(). The copy is allocated on the first snapshot that sees this storage and
  // reused by the later ones; tensors that share a storage share its copy (torch's
  // serializer writes a shared storage once). An undefined tensor stays undefined. Throws
  // Error for a tensor that is not a dense CPU tensor.
  at::Tensor stage(const at::Tensor& live);
  // stage(), copied now in a deferred snapshot too: what the step changes before its
  // optimizer update (a module's buffers: BatchNorm's running statistics, DDP's broadcast).
  at::Tensor stage_now(const at::Tensor& live);
  // Ends a snapshot: copies of storages it did not stage are released.
  void end();
  // The deferred snapshot's copies (on the copy thread); then nothing is pending.
  void copy_pending();
  // Bytes held, and the buffers' addresses (tests check that saves reuse them).
  int64_t bytes() const;
  std::vector<const void*> buffers() const;

 private:
  struct Slot {
    at::Storage copy;
    at::Storage pending;  // the live storage still to copy (deferred snapshots)
    bool used = false;
  };
  at::Tensor stage(const at::Tensor& live, bool now);
  std::unordered_map<const c10::StorageImpl*, Slot> slots_;
  bool defer_ = false;
};

// The module's parameters and buffers, staged, as Module::save writes them: own parameters,
// own buffers, then every serializable child's archive (modules that override save() are
// not supported: use checkpoint.mode = "sync").
struct ModuleSnapshot {
  std::vector<std::pair<std::string, at::Tensor>> params, buffers;
  std::vector<std::pair<std::string, std::unique_ptr<ModuleSnapshot>>> children;
  void write(torch::serialize::OutputArchive& ar) const;
};
std::unique_ptr<ModuleSnapshot> snapshot_module(const torch::nn::Module& m, HostStaging& staging);

// An optimizer's state and parameter groups (its options cloned, its parameters by the
// key torch writes), staged, as torch::optim::serialize writes them. The state of SGD,
// Adam, AdamW and AnyPrecisionAdamW (the trainer's optimizers); another optimizer's is an
// Error naming checkpoint.mode = "sync".
struct OptimizerSnapshot {
  struct Group {
    std::vector<std::string> params;
    std::unique_ptr<torch::optim::OptimizerOptions> options;
  };
  std::vector<std::pair<std::string, std::unique_ptr<torch::optim::OptimizerParamState>>> state;
  std::vector<Group> groups;
  void write(torch::serialize::OutputArchive& ar) const;
};
std::unique_ptr<OptimizerSnapshot> snapshot_optimizer(const torch::optim::Optimizer& opt,
                                                      HostStaging& staging);
// Throws Error when snapshot_optimizer cannot copy `opt`'s state (checked before training).
void check_snapshot_supported(const torch::optim::Optimizer& opt);

// What FSDPCore::sharded_state(opt) writes for this rank, staged. The units' names,
// layouts, sizes and offsets do not change during a run: FsdpShardLayout reads them once
// from a sharded_state() archive (without the optimizer).
struct FsdpShardLayout {
  struct Unit {
    std::string name, layout;
    int64_t numel = 0, offset = 0;
  };
  std::string format;
  int64_t world_size = 0, rank = 0, sharded = 0;
  std::vector<Unit> units;
};
FsdpShardLayout read_fsdp_layout(const fsdp::FSDPCore& core);

struct FsdpShardSnapshot {
  struct Unit {
    at::Tensor shard;
    std::string opt_kind = "none";
    int64_t opt_step = 0;
    std::map<std::string, at::Tensor> opt;  // defined tensors only, by name
  };
  const FsdpShardLayout* layout = nullptr;
  std::vector<Unit> units;
  void write(torch::serialize::OutputArchive& ar) const;
};
std::unique_ptr<FsdpShardSnapshot> snapshot_fsdp(const fsdp::FSDPCore& core,
                                                 const FsdpShardLayout& layout,
                                                 const torch::optim::Optimizer& opt,
                                                 HostStaging& staging);

}  // namespace lockstep::train
