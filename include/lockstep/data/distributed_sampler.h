// lockstep/data/distributed_sampler.h: each rank's share of a dataset, per epoch.
//
// The semantics of PyTorch's torch.utils.data.DistributedSampler:
//  - Every rank gets the same number of samples, num_samples().
//  - drop_last = false: the index list is padded by wrapping around to its start
//    until it divides evenly by the world size (so a few samples are seen twice
//    per epoch); num_samples = ceil(size / world_size).
//    drop_last = true: the tail is dropped instead; num_samples = floor(size / world_size).
//  - Rank r takes positions r, r + W, r + 2W, ... of the (shuffled, padded) list,
//    so without padding the ranks' shares are disjoint and cover the dataset.
//  - shuffle = true: the list is a permutation that depends only on (seed, epoch,
//    size). Every rank computes the same one from its own deterministic generator
//    (mt19937_64 + our own Fisher-Yates, no thread-global RNG, no
//    implementation-defined std::shuffle), so the shares agree across ranks,
//    processes, compilers and libtorch versions without communication.
//    Call set_epoch(e) before each epoch, or every epoch sees the same order.
//
// It is a torch::data::samplers::Sampler<>, so it drives libtorch's loaders:
//
//   DistributedSampler sampler(dataset.size().value(), group->size(), group->rank());
//   auto loader = torch::data::make_data_loader(dataset, sampler, 64);
//   for (int e = 0; e < epochs; ++e) {
//     sampler.set_epoch(e);         // reaches the loader's copy (see below)
//     for (auto& batch : *loader) { ... }
//   }
//
// make_data_loader takes the sampler by value. Copies of a sampler share one epoch
// counter, so set_epoch on your handle also sets the loader's copy; it takes effect
// at the copy's next reset(), which the loader calls at the start of every pass
// (begin()). Everything else (the cursor of next()) is per copy.
//
// Optional types are torch::optional (c10::optional in libtorch 1.13, std::optional in 2.x),
// as the Sampler<> interface requires.
//
// Thread safety: set_epoch/epoch may be called from any thread; the other members
// must not race with each other (the loader calls them from one thread).
#pragma once

#include <torch/data/samplers/base.h>
#include <torch/serialize/archive.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <vector>

namespace lockstep::data {

struct DistributedSamplerOptions {
  // Permute the indices each epoch (by seed and epoch). false: ranks read in order.
  bool shuffle = true;
  // Base of the permutation; must be the same on every rank.
  uint64_t seed = 0;
  // true: drop the tail that does not divide by the world size (every sample at most
  // once per epoch). false: pad by wrapping around (every sample at least once).
  bool drop_last = false;
};

class DistributedSampler : public torch::data::samplers::Sampler<std::vector<size_t>> {
 public:
  using BatchRequest = std::vector<size_t>;

  // num_replicas: the world size (>= 1); rank in [0, num_replicas). The order of
  // PyTorch's DistributedSampler(dataset, num_replicas, rank); with a process group:
  // (size, group->size(), group->rank()). Throws InvalidArgument on a bad pair, so a
  // call written for the opposite order (rank, world) fails loudly: rank < world there
  // makes "rank" >= "num_replicas" here.
  DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                     DistributedSamplerOptions options = {});

  // Selects the permutation of the coming epoch; shared by all copies of this sampler.
  void set_epoch(uint64_t epoch);
  uint64_t epoch() const;

  // This rank's indices for the current epoch, in the order next() yields them.
  std::vector<size_t> indices() const;
  // Samples each rank gets per epoch (identical on every rank).
  size_t num_samples() const { return num_samples_; }
  size_t dataset_size() const { return dataset_size_; }
  int rank() const { return rank_; }
  int world_size() const { return world_size_; }
  const DistributedSamplerOptions& options() const { return options_; }

  // --- torch::data::samplers::Sampler<> ---
  // Recomputes this rank's share for the current epoch and rewinds; new_size (if
  // given) replaces the dataset size.
  void reset(torch::optional<size_t> new_size = torch::nullopt) override;
  // The next up to batch_size indices of this rank's share; nullopt when exhausted.
  torch::optional<BatchRequest> next(size_t batch_size) override;
  // Saves epoch and position (and size/seed/rank/world to check them on load).
  void save(torch::serialize::OutputArchive& archive) const override;
  // Restores epoch and position; throws InvalidArgument if the archive was written by
  // a sampler with a different dataset size, seed, shuffle, drop_last, rank or world size.
  void load(torch::serialize::InputArchive& archive) override;

 private:
  size_t dataset_size_;
  int rank_;
  int world_size_;
  DistributedSamplerOptions options_;
  size_t num_samples_ = 0;
  std::shared_ptr<std::atomic<uint64_t>> epoch_;  // shared by copies (see header comment)
  std::vector<size_t> share_;                     // this rank's indices, from the last reset()
  size_t cursor_ = 0;
};

// The permutation of [0, n) for (seed, epoch): what every rank computes. Exposed for
// tests and for users who shard by hand.
std::vector<size_t> epoch_permutation(size_t n, uint64_t seed, uint64_t epoch);

}  // namespace lockstep::data
