// lockstep/data/elastic_sampler.h: the data position of a fault-tolerant job, whose
// number of replicas changes between steps (docs/fault-tolerance.md).
//
// DistributedSampler fixes each rank's share of an epoch when the epoch starts, so a
// change of the world size mid-epoch would re-deal samples already seen. This sampler
// instead keeps one position for the whole job and deals each step afresh over the
// replicas of that step:
//
//  - State = (epoch, cursor). cursor = samples of this epoch consumed by COMMITTED steps,
//    in [0, N) (or 0 when N = 0). It is the same on every replica, and two integers, so a
//    healed replica takes a healthy one's position with state() / set_state().
//  - The epoch's order is epoch_permutation(N, seed, epoch) (the same permutation as
//    DistributedSampler's, computed without communication), or 0..N-1 without shuffle.
//  - batch(rank, replicas): replica `rank` of `replicas` trains on positions
//    [cursor + rank*b, cursor + (rank+1)*b) of the order, clipped at N. At the epoch's
//    end this gives short batches, then empty ones: with N - cursor = 7, b = 4 and 3
//    replicas, rank 0 gets 4 samples, rank 1 gets 3, rank 2 none.
//    drop_last = true: a step that would give any replica fewer than b samples (fewer than
//    replicas*b left) gives EVERY replica an empty batch instead; committing it ends the
//    epoch, skipping those samples this epoch (a different few each epoch when shuffled).
//  - commit(replicas): the step committed on every replica: cursor += replicas*b, clipped
//    to N; once the epoch is exhausted the next one begins at once: (epoch + 1, 0).
//  - A discarded step calls nothing: the next attempt, with whatever replicas it has,
//    deals the same positions again. So every sample is used exactly once per epoch by
//    committed steps (at most once with drop_last), whatever the replica counts; the
//    samples of a discarded step are retried, not lost.
//  - epoch_done(): true at the start of an epoch after the first (the last commit ended
//    an epoch), until the next commit.
//  - With N = 0 every batch is empty and every commit ends an (empty) epoch.
//
// Cost: the current epoch's order is kept (8 bytes per sample) and recomputed, O(N), only
// when the epoch changes; batch() copies b indices.
//
// Pure: no communication, no tensors. The caller passes the step's replica rank and count
// (lockstep::ft::Manager's replica_rank() and replicas()), which are the same on every
// replica between two quorums; then every replica computes the same batches.
//
// Thread safety: none; a copy per thread, or calls from one thread at a time.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace lockstep::data {

struct ElasticSamplerOptions {
  // Permute the indices each epoch (by seed and epoch). false: 0..N-1 every epoch.
  bool shuffle = true;
  // Base of the permutation; must be the same on every replica.
  uint64_t seed = 0;
  // true: never a short batch; the epoch's last, incomplete step is dropped (see above).
  bool drop_last = false;
};

class ElasticSampler {
 public:
  // dataset_size N >= 0; batch_size b >= 1, per replica. Throws InvalidArgument otherwise.
  ElasticSampler(int64_t dataset_size, int64_t batch_size, ElasticSamplerOptions options = {});

  // The indices replica `rank` of `replicas` trains on in the step being made (see the
  // contract above). Throws InvalidArgument unless 1 <= replicas and 0 <= rank < replicas.
  std::vector<int64_t> batch(int rank, int replicas) const;
  // The step made by `replicas` replicas committed: advance past its samples (next epoch
  // when this one is exhausted). Call it on every replica, with the step's replica count.
  void commit(int replicas);

  // True when the last committed step finished an epoch: the state is at the start
  // (cursor 0) of an epoch after the first. Derived from the state, so every replica,
  // healed ones included, agrees; for end-of-epoch work (evaluation, a log line).
  bool epoch_done() const { return cursor_ == 0 && epoch_ > 0; }
  int64_t epoch() const { return epoch_; }
  int64_t cursor() const { return cursor_; }
  // Samples of this epoch not yet consumed by committed steps.
  int64_t remaining() const { return size_ - cursor_; }

  // (epoch, cursor): what a healing replica sends and a joiner restores, or a checkpoint.
  std::pair<int64_t, int64_t> state() const { return {epoch_, cursor_}; }
  // Throws InvalidArgument unless epoch >= 0 and cursor is in [0, N) (0 when N = 0): the
  // end of an epoch is stored as (epoch + 1, 0), never as cursor = N.
  void set_state(int64_t epoch, int64_t cursor);

  // The current epoch's order: position k of it is the k-th sample the epoch deals.
  const std::vector<int64_t>& order() const { return order_; }
  int64_t dataset_size() const { return size_; }
  int64_t batch_size() const { return batch_size_; }
  const ElasticSamplerOptions& options() const { return options_; }

 private:
  void begin_epoch(int64_t epoch);

  int64_t size_;
  int64_t batch_size_;
  ElasticSamplerOptions options_;
  int64_t epoch_ = 0;
  int64_t cursor_ = 0;
  std::vector<int64_t> order_;  // of epoch_, recomputed when the epoch changes
};

}  // namespace lockstep::data
