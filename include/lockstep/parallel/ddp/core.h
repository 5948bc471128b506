// lockstep/parallel/ddp/core.h: the non-template part of DistributedDataParallel.
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/parallel/ddp/no_sync_guard.h>
#include <lockstep/parallel/ddp/options.h>
#include <lockstep/parallel/ddp/reducer.h>
#include <lockstep/parallel/ddp/state_broadcaster.h>

#include <torch/nn/module.h>

#include <memory>

namespace lockstep::ddp {

// Construction (collective, same order on every rank):
//   1. verify_same_model(): same parameter count, shapes, dtypes everywhere
//      (else ModelMismatch on every rank);
//   2. broadcast all parameters and buffers from rank 0 (coalesced per dtype);
//   3. build the Reducer over the parameters that require grad.
// before_forward(): buffer broadcast (if enabled and world > 1) and
// Reducer::prepare_for_forward(). Holds the module, the group and the options.
class DDPCore {
 public:
  DDPCore(std::shared_ptr<torch::nn::Module> module, std::shared_ptr<comm::ProcessGroup> group,
          DDPOptions options);

  void before_forward();
  NoSyncGuard no_sync() { return NoSyncGuard(*reducer_); }

  Reducer& reducer() { return *reducer_; }
  const Reducer& reducer() const { return *reducer_; }
  comm::ProcessGroup& group() { return *group_; }
  const DDPOptions& options() const { return options_; }

 private:
  std::shared_ptr<torch::nn::Module> module_;
  std::shared_ptr<comm::ProcessGroup> group_;
  DDPOptions options_;
  std::unique_ptr<StateBroadcaster> buffers_;
  std::unique_ptr<Reducer> reducer_;
};

}  // namespace lockstep::ddp
