// lockstep/parallel/ddp/reducer.h: gradient buckets, autograd hooks, overlap, statistics.
//
// The Reducer is the non-template core of DistributedDataParallel. It owns one
// flat buffer per bucket (allocated once per layout, never per step) and a
// post-hook on every parameter's AccumulateGrad node. In a synchronized backward:
//
//   hook(param i)  -> with the built-in allreduce (no comm hook registered) and a
//                     dense contiguous grad: nothing to do, the bucket's collective
//                     will average param.grad where it lies (allreduce_coalesced, or
//                     allreduce of the buffer when grads are bucket views). Otherwise
//                     the "copy path" for the whole bucket: grads copied into their
//                     bucket slots (for a comm hook divided by world_size in the same
//                     pass, one fused at::mul_out). The first hook of the pass queues
//                     the end-of-backward callback with autograd.
//   bucket full    -> buckets launch (in-place allreduce or comm hook) strictly in
//                     index order (a bucket that fills early waits for its
//                     predecessors), while backward goes on computing.
//   end of backward-> (callback) parameters whose hook never fired are filled in
//                     (zero / their accumulated grad) so every rank launches every
//                     bucket; wait for all buckets; copy-path buckets write averages
//                     back to param.grad (unless grads are bucket views).
//
// The in-place path saves two passes over every gradient (the copy in and the copy
// back); on the shm backend the division rides along with the reduction too. With
// shared buckets (shm, DDPOptions::shared_buckets) the buffers live in memory every
// rank maps and grads are views into them (as gradient_as_bucket_view), so the
// allreduce reads and writes the peers' gradients where they lie: no staging copy.
//
// Ranks must run the same number of synchronized backward passes; the bucket
// layout (and so the sequence of collectives) is identical on every rank because
// it is computed from the parameter list, which construction verified equal, and
// the rebuilt layout follows rank 0's observed order.
//
// Thread safety: hooks and the callback run on the autograd engine's thread and
// take the reducer's mutex; prepare_for_forward()/set_require_sync() run on the
// user's thread between passes. A failed collective makes the callback throw the
// CommError, which propagates out of backward(); the reducer resets its step
// state first, so the next forward starts clean (though a broken group stays broken).
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/parallel/ddp/bucket_assignment.h>
#include <lockstep/parallel/ddp/grad_bucket.h>
#include <lockstep/parallel/ddp/options.h>

#include <ATen/core/Tensor.h>

#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace lockstep::compat {
struct PostHookHandle;
}

namespace lockstep::ddp {

class Reducer {
 public:
  // `params` (all requiring grad, distinct leaves) and their `names`, in
  // registration order. Installs the autograd hooks.
  Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
          std::shared_ptr<comm::ProcessGroup> group, DDPOptions options);
  ~Reducer();  // removes the hooks; waits (ignoring errors) for in-flight buckets
  Reducer(const Reducer&) = delete;
  Reducer& operator=(const Reducer&) = delete;

  // Replaces the communication hook (default: the built-in allreduce, which reduces
  // gradients in place; hooks see the copy path, see top). Not
  // allowed while a backward pass is reducing.
  void register_comm_hook(CommHook hook);

  // Called before each forward: rebuilds the buckets if the first synchronized
  // pass just recorded its order (a broadcast from rank 0: every rank must call
  // this at the same point), discards the state of a backward that failed, and
  // records whether the coming backward synchronizes.
  void prepare_for_forward();

  // no_sync(): while false, backward passes only accumulate into param.grad.
  void set_require_sync(bool sync) { require_sync_ = sync; }
  bool require_sync() const { return require_sync_; }

  const StepStats& last_step_stats() const { return stats_; }
  const std::vector<GradBucket>& buckets() const { return infos_; }
  int64_t num_buckets() const { return static_cast<int64_t>(infos_.size()); }
  bool buckets_rebuilt() const { return rebuilt_; }
  // Parameter indices in the order their gradients became ready in the first
  // synchronized pass (this rank's observation; the rebuild used rank 0's).
  const std::vector<int64_t>& observed_order() const { return observed_order_; }
  const std::vector<at::Tensor>& parameters() const { return params_; }

 private:
  struct Slot {
    int64_t bucket = -1;
    int64_t index = -1;  // position within the bucket
  };
  struct BucketState {
    std::vector<at::Tensor> views;  // one per parameter, shaped like it, into the buffer
    int64_t pending = 0;            // parameters not yet ready in this pass
    bool launched = false;
    bool fell_back = false;  // this pass: a grad could not be reduced in place
    bool as_views = false;   // grads become views into the buffer (see options.h)
    HookResult result;
  };

  void build_buckets(const std::vector<int64_t>& order);
  void on_grad_ready(int64_t i);
  void begin_step_locked();
  void mark_ready_locked(int64_t i);
  bool in_place_ok_locked(int64_t i) const;
  void stage_grad_locked(int64_t i);
  void copy_grad_to_bucket_locked(int64_t i);
  HookResult builtin_allreduce_locked(int64_t bi);
  void launch_ready_buckets_locked();
  void finalize();
  void write_back_locked(const at::Tensor& used_global);
  void abandon_step_locked() noexcept;
  std::string missing_message(const std::vector<int64_t>& missing) const;

  std::vector<at::Tensor> params_;
  std::vector<std::string> names_;
  std::shared_ptr<comm::ProcessGroup> group_;
  const DDPOptions options_;
  const int world_size_;
  const double scale_;
  const at::Tensor scale_t_;  // scale_ as a 0-dim tensor, for the fused copy-and-scale
  CommHook hook_;             // empty: the built-in allreduce (buckets may reduce in place)
  bool builtin_hook() const { return !hook_; }
  // This pass reduces the bucket's grads in place (see top) rather than copying them.
  bool direct(const BucketState& b) const { return builtin_hook() && !b.fell_back; }
  std::vector<compat::PostHookHandle> hook_handles_;

  // Layout (rebuilt at most once).
  std::vector<GradBucket> infos_;
  std::vector<BucketState> buckets_;
  std::vector<Slot> slots_;
  bool rebuilt_ = false;
  bool rebuild_pending_ = false;

  // Per-step state, guarded by mu_.
  std::mutex mu_;
  bool require_sync_ = true;
  bool armed_ = false;        // prepare_for_forward() ran since the last pass
  bool armed_sync_ = true;    // require_sync_ as of that forward
  bool step_active_ = false;  // a synchronized backward is in progress
  std::vector<char> ready_;   // per parameter, this pass
  int64_t next_launch_ = 0;
  bool record_order_ = false;
  std::vector<int64_t> observed_order_;
  at::Tensor used_map_;  // int32 per parameter (find_unused_parameters)
  std::chrono::steady_clock::time_point first_hook_;
  StepStats stats_;
};

}  // namespace lockstep::ddp
