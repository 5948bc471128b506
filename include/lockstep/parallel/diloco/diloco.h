// lockstep/parallel/diloco/diloco.h: DiLoCo, Streaming DiLoCo and local SGD: data parallelism
// that synchronises every H steps instead of every step (docs/thin-links.md).
//
//   auto opt = std::make_unique<torch::optim::AdamW>(model->parameters(), ...);  // inner
//   lockstep::diloco::DiLoCoOptions o;  // H = 50, outer Nesterov SGD lr 0.7, momentum 0.9
//   lockstep::diloco::DiLoCo outer(group, model->parameters(), o);  // broadcasts rank 0's
//   for (...) { loss.backward(); opt->step(); opt->zero_grad(); outer.step(); }
//   outer.synchronize();  // the end: every replica holds the outer parameters
//
// Each rank is a replica: it trains on its own data with its own inner optimizer (whose
// state never travels). The parameters are split into F fragments (F = 1: DiLoCo). Fragment
// f synchronises after the inner steps s with s mod H = offset(f) (the offsets staggered
// over the round: offset(f) = floor((f + 1) H / F) mod H), in three parts:
//   1. start (step s): the pseudo-gradient delta = anchor - local parameters of f, where the
//      anchor is f's outer parameters (the same on every replica), is averaged over the
//      replicas by one allreduce (or the 4-bit QSGD compressed allreduce), asynchronously;
//   2. the replica runs `overlap_steps` (tau) more inner steps meanwhile;
//   3. apply (step s + tau): the outer optimizer (SGD with momentum mu, Nesterov or not, as
//      torch.optim.SGD) steps the anchor with the average as its gradient:
//        buf = mu buf + g (g on the first step), d = nesterov ? g + mu buf : buf (mu > 0),
//        anchor -= outer_lr d;
//      then the local parameters become  mixing * local + (1 - mixing) * anchor.
// With mixing = 0 (the default) every replica leaves step 3 at the same parameters. Local
// SGD (parameter averaging every H steps) is outer SGD with lr 1 and no momentum
// (DiLoCoOptions::local_sgd). With H = 1, that and plain inner SGD equal DDP.
//
// Bytes per replica and round: F fragments, together the model once (n values), allreduced
// once: about 2 (P-1)/P n * 4 bytes in float32 (1/H of DDP's per step), or ~1/7 of that with
// 4-bit QSGD. Memory: anchor and momentum (2 n) plus one exchange buffer per fragment (n).
//
// Collectives: step() starts and applies exchanges at inner-step counts that are the same
// on every rank, so every rank must call step() after every inner step (a skipped step
// included: it is counted alike everywhere). Thread safety: one thread; the exchanges run
// on the group's comm thread meanwhile.
#pragma once

#include <lockstep/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::compress {
class CompressedAllreduce;
}

namespace lockstep::diloco {

enum class OuterCompression { kNone, kQsgd };

struct DiLoCoOptions {
  int64_t inner_steps = 50;  // H: inner steps per round
  double outer_lr = 0.7;
  double outer_momentum = 0.9;
  bool nesterov = true;
  // F > 1: Streaming DiLoCo (each fragment synchronises once per round, staggered).
  int64_t fragments = 1;
  // tau: inner steps between a fragment's start and its apply (the exchange overlaps them).
  int64_t overlap_steps = 0;
  // The local fragment's weight when the outer result is applied (the paper's alpha).
  double mixing = 0.0;
  OuterCompression compression = OuterCompression::kNone;
  int qsgd_bits = 4;
  int64_t qsgd_bucket_size = 128;
  int64_t qsgd_min_layer = 1024;  // parameters with fewer elements go uncompressed
  uint64_t seed = 0;              // QSGD's rounding (the same on every rank)

  // Parameter averaging every `inner_steps`: outer SGD with lr 1, no momentum.
  static DiLoCoOptions local_sgd(int64_t inner_steps);
};

// Throws InvalidArgument naming the option and the fix.
void validate(const DiLoCoOptions& o);

// A fragment: parameters [first, first + count) of the list, and its offset in the round.
struct Fragment {
  int64_t first = 0, count = 0;
  int64_t numel = 0;
  int64_t offset = 0;  // synchronises after inner steps s with s mod H == offset
};
// Splits parameters of sizes `numels` (in order) into `fragments` contiguous runs of about
// equal element count (every run at least one parameter) and staggers their offsets.
// Throws InvalidArgument when there are fewer parameters than fragments.
std::vector<Fragment> plan_fragments(const std::vector<int64_t>& numels, int64_t fragments,
                                     int64_t inner_steps);

struct DiLoCoStats {
  int64_t syncs = 0;       // fragment exchanges applied
  int64_t bytes_sent = 0;  // payload this rank sent (ring estimate for the plain allreduce)
  double wait_s = 0;       // time step() waited for exchanges (exposed communication)
};

class DiLoCo {
 public:
  // Collective: broadcasts rank 0's parameters (every replica starts from them) and takes
  // them as the anchors. `params`: floating CPU tensors of one dtype, contiguous.
  DiLoCo(std::shared_ptr<comm::ProcessGroup> group, std::vector<at::Tensor> params,
         DiLoCoOptions options);
  // Waits for exchanges still in flight (not collective: every rank started them).
  ~DiLoCo();
  DiLoCo(const DiLoCo&) = delete;
  DiLoCo& operator=(const DiLoCo&) = delete;

  // Collective: after every inner optimizer step.
  void step();
  // Collective: applies the exchanges in flight, then synchronises every fragment now (an
  // extra outer step each, mixing 0), so every replica holds the outer parameters. For the
  // end of training; the round goes on from here.
  void synchronize();

  const DiLoCoOptions& options() const { return opts_; }
  const std::vector<Fragment>& fragments() const { return frags_; }
  int64_t inner_step() const { return inner_; }
  const DiLoCoStats& stats() const { return stats_; }

  // The state a checkpoint needs (the anchors, the momentum buffers, the inner step count,
  // the exchanges in flight, their results included: it waits for them, which changes no
  // value). Names are stable; tensors are this object's own (copy them to keep them).
  std::map<std::string, at::Tensor> state();
  // Restores state() of a DiLoCo over the same parameter layout and options (not
  // collective). Throws InvalidArgument naming what does not fit.
  void load_state(const std::map<std::string, at::Tensor>& state);

 private:
  struct Slot;  // one fragment's buffers and exchange
  void start(size_t f);
  void apply(size_t f, double mixing);
  void complete(Slot& s);
  void outer_step(Slot& s, const at::Tensor& avg);
  at::Tensor flat_local(size_t f) const;
  void set_local(size_t f, const at::Tensor& flat);

  std::shared_ptr<comm::ProcessGroup> group_;
  std::vector<at::Tensor> params_;
  DiLoCoOptions opts_;
  std::vector<Fragment> frags_;
  std::vector<std::unique_ptr<Slot>> slots_;
  int64_t inner_ = 0;
  DiLoCoStats stats_;
};

}  // namespace lockstep::diloco
