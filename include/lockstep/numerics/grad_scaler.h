// lockstep/numerics/grad_scaler.h: dynamic loss scaling for mixed-precision training, on
// every rank of a data-parallel job at once (PyTorch's torch.amp.GradScaler, distributed).
//
//   lockstep::numerics::GradScaler scaler({}, group);
//   for (...) {
//     opt.zero_grad();
//     auto loss = ddp.forward(...);              // under lockstep::numerics::Autocast
//     scaler.scale(loss).backward();            // gradients are scaled by scale()
//     scaler.unscale(opt);                      // optional: before clipping
//     clip_grad_norm_(...);
//     scaler.step(opt);                         // skipped when any rank saw inf/NaN
//     scaler.update();                          // back off or grow the scale
//   }
//
// Small float16 gradients underflow to zero; multiplying the loss by a large scale lifts
// them into range, and unscaling divides it out before the optimizer sees them. When the
// scale is too large some gradients overflow (inf/NaN): that step is skipped and the scale
// backs off; after `growth_interval` good steps in a row it grows again.
//
// Distributed: unscale() finds inf/NaN in this rank's gradients only - all of them under
// DDP (already averaged), a shard under FSDP - and combines the flag across the group
// with one allreduce (MAX of one slot per rank), so every rank skips the same steps and
// keeps the same scale; without it an FSDP rank whose shard overflowed would skip alone
// and the replicas would diverge. Every rank must call unscale()/step() in the same
// place of its collective sequence. The decision is the group's; skipped_ranks() says
// which ranks saw the non-finite values.
#pragma once

#include <ATen/core/Tensor.h>
#include <torch/optim/optimizer.h>
#include <torch/serialize/archive.h>

#include <cstdint>
#include <memory>
#include <vector>

namespace lockstep::comm {
class ProcessGroup;
}

namespace lockstep::numerics {

struct GradScalerOptions {
  double init_scale = 65536.0;  // 2^16
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;  // good steps in a row before the scale grows
  // false: scale() returns the loss unchanged, step() always steps (the same code runs
  // with and without loss scaling).
  bool enabled = true;
};

class GradScaler {
 public:
  // `group`: the data-parallel group whose ranks must agree (null: one process).
  explicit GradScaler(GradScalerOptions options = {},
                      std::shared_ptr<comm::ProcessGroup> group = nullptr);

  // loss * scale (in the loss's dtype).
  at::Tensor scale(const at::Tensor& loss) const;

  // Divides the gradients of `optimizer`'s parameters by the scale, in place, and decides
  // (collectively) whether this step is skipped. At most once per step: a second call
  // before update() throws. step() calls it when the caller did not.
  void unscale(torch::optim::Optimizer& optimizer);

  // Runs optimizer.step() unless a rank found inf/NaN; returns whether it stepped.
  bool step(torch::optim::Optimizer& optimizer);

  // After step(): backs the scale off (skipped step) or counts a good step and grows it
  // every growth_interval good steps. The new scale is kept only if it is finite.
  void update();

  double get_scale() const { return scale_; }
  int64_t growth_tracker() const { return growth_tracker_; }
  bool is_enabled() const { return options_.enabled; }
  // Of the last unscale(): the ranks whose gradients held inf/NaN (empty: a good step).
  const std::vector<int>& skipped_ranks() const { return found_ranks_; }
  const GradScalerOptions& options() const { return options_; }

  // The scale and the growth tracker, for checkpoints (keys "scale", "growth_tracker").
  void save(torch::serialize::OutputArchive& archive) const;
  void load(torch::serialize::InputArchive& archive);
  // The same state from numbers (e.g. a checkpoint's metadata).
  void restore(double scale, int64_t growth_tracker);

 private:
  enum class Stage { Ready, Unscaled, Stepped };
  GradScalerOptions options_;
  std::shared_ptr<comm::ProcessGroup> group_;
  double scale_;
  int64_t growth_tracker_ = 0;
  Stage stage_ = Stage::Ready;
  std::vector<int> found_ranks_;
};

}  // namespace lockstep::numerics
