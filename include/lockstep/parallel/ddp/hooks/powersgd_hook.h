// lockstep/parallel/ddp/hooks/powersgd_hook.h: PowerSGD (low-rank gradients with error
// feedback) as a DDP communication hook; the semantics of PyTorch's `powerSGD_hook`
// (torch.distributed.algorithms.ddp_comm_hooks.powerSGD_hook, not the batched variant).
//
//   lockstep::ddp::hooks::PowerSgdOptions o;
//   o.matrix_approximation_rank = 4;
//   o.start_iter = 100;
//   auto state = std::make_shared<lockstep::ddp::hooks::PowerSgdState>(o);
//   ddp.register_comm_hook(lockstep::ddp::hooks::powersgd_hook(state));
//
// Per bucket and step, once `start_iter` steps ran as plain allreduces:
//   1. error feedback: the bucket += this rank's error of the previous step;
//   2. each parameter's gradient is seen as an n x m matrix M (n = its first dimension);
//      r = min(n, m, rank); it is compressed when (n + m) r * min_compression_rate < n m,
//      else it joins the others in ONE flat allreduce (vectors, unless the rate is < 1);
//   3. Q (m x r) is drawn as PyTorch draws it (below) on the first compressed step, or
//      every step without warm_start, and orthogonalised; with warm_start the previous
//      step's Q is orthogonalised and reused;
//   4. P = M Q; ONE allreduce of every P of the bucket; orthogonalise each P;
//   5. Q = M^T P; ONE allreduce of every Q of the bucket; M <- P Q^T (the average's
//      rank-r approximation);
//   6. error = this rank's input of step 1 minus the result, in PyTorch's units.
// Orthogonalisation as PyTorch's: Gram-Schmidt for r <= 2 (column /= its norm, or
// norm + epsilon), Householder QR (at::linalg_qr) above.
//
// The bucket arrives divided by the world size W (GradBucket's contract) where PyTorch's
// hook gets the raw gradient and divides after each allreduce; the projections are linear
// and the orthogonalisation scale-free, so the result is the same average, and the error
// is kept divided by W too (PyTorch's error / W). For W a power of two the values equal
// PyTorch's up to BLAS rounding.
//
// Initial Q: PyTorch draws seed = numpy.random.RandomState(random_seed).randint(10^9) per
// bucket that needs a fresh Q (in hook order), then torch.randn per compressed tensor with
// the CPU generator seeded by it, tensors in the order of their first-seen matrix shape.
// This hook draws the same seeds (MT19937, masked rejection) and the same normals
// (at::CPUGeneratorImpl): the same random_seed gives the same Q as PyTorch's.
//
// Bytes per step of a compressed n x m gradient: r (n + m) elements in two allreduces,
// against n m for the plain allreduce (docs/algorithms.md, "PowerSGD").
//
// Needs start_iter >= 2 with error feedback or warm start (as PyTorch): DDP rebuilds its
// buckets after the first step, which would change what the state is kept for. A bucket
// whose layout changes anyway restarts its error and Q. Buckets of other dtypes than
// float32/float64 are allreduced uncompressed. A zero column met by Gram-Schmidt with
// epsilon 0 becomes zeros (PyTorch's code divides by zero there and gets NaN). A step whose
// result is not finite (identical on every rank) drops the error and Q on every rank, so the
// next step starts afresh (PyTorch's would carry the NaN on).
//
// Thread safety: the hook runs its exchange as ONE composite op on the group's comm thread
// (backward goes on meanwhile); state accessors are for between steps only.
#pragma once

#include <lockstep/parallel/ddp/grad_bucket.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <random>
#include <string>
#include <vector>

namespace lockstep::ddp::hooks {

struct PowerSgdOptions {
  // r: the rank of the approximation; lower compresses more. PyTorch suggests 1, 2, 4, ...
  int64_t matrix_approximation_rank = 1;
  // Steps of plain allreduce before compression starts (PyTorch's start_powerSGD_iter):
  // the first steps are the most sensitive to inexact gradients.
  int64_t start_iter = 1000;
  // A gradient is compressed only if it shrinks by more than this factor.
  double min_compression_rate = 2.0;
  bool use_error_feedback = true;
  bool warm_start = true;  // reuse each step's Q as the next step's start
  // Added to each column's norm in Gram-Schmidt (guards vanishing gradients); 0 = exact.
  double orthogonalization_epsilon = 0.0;
  // Seeds the stream of seeds of the initial Qs; the same on every rank.
  uint32_t random_seed = 0;
};

// Throws InvalidArgument naming the option and the fix.
void validate(const PowerSgdOptions& o);

// The hook's state: the options, the step counter, the seed stream and, per bucket index,
// the error and P/Q memory. Shared by the hook and its owner (tests, checkpoints).
class PowerSgdState {
 public:
  explicit PowerSgdState(PowerSgdOptions options = {});  // validates

  struct Bucket {
    std::vector<int64_t> layout;  // what the state below was built for
    at::Tensor error;             // this rank's error / world size (undefined: none yet)
    at::Tensor p, q;              // all Ps, all Qs of the bucket, flat
  };

  const PowerSgdOptions& options() const { return options_; }
  // Optimizer steps seen (synchronised backwards, counted at each step's last bucket).
  int64_t iter() const;
  // E.g. on resume: the next step counts as step `iter` (compression starts at start_iter).
  void set_iter(int64_t iter);
  // The state of bucket `index`, or null. Read it between steps only.
  std::shared_ptr<const Bucket> bucket(int64_t index) const;

 private:
  friend struct PowerSgdAccess;  // the hook (src/parallel/ddp/hooks/powersgd_hook.cpp)
  const PowerSgdOptions options_;
  mutable std::mutex mu_;
  int64_t iter_ = 0;
  std::mt19937 seeds_;  // numpy.random.RandomState(random_seed)'s generator
  std::map<int64_t, std::shared_ptr<Bucket>> buckets_;
};

// The hook over `state` (kept alive by the hook).
CommHook powersgd_hook(std::shared_ptr<PowerSgdState> state);
// The same over a fresh state.
CommHook powersgd_hook(PowerSgdOptions options = {});

}  // namespace lockstep::ddp::hooks
