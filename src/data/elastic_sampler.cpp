// ElasticSampler: one (epoch, cursor) position for the whole job, dealt afresh each step
// over that step's replicas, and moved only by committed steps.
#include <lockstep/data/elastic_sampler.h>

#include <lockstep/data/distributed_sampler.h>
#include <lockstep/error.h>

#include <cstddef>
#include <numeric>

namespace lockstep::data {
namespace {

// min(count * b, limit) for count >= 0, b >= 1, limit >= 0, without overflowing int64:
// a large replica count times a large batch size must clip, not wrap.
int64_t clipped_product(int64_t count, int64_t b, int64_t limit) {
  return count > limit / b ? limit : count * b;
}

void check_replicas(int rank, int replicas) {
  LOCKSTEP_CHECK(replicas >= 1, "ElasticSampler: replicas = ", replicas,
                 "; pass the step's replica count (ft::Manager::replicas()), at least 1");
  LOCKSTEP_CHECK(rank >= 0 && rank < replicas, "ElasticSampler: rank ", rank,
                 " out of range [0, replicas = ", replicas,
                 "); pass this replica's rank in the step (ft::Manager::replica_rank()), "
                 "in the order batch(rank, replicas)");
}

}  // namespace

ElasticSampler::ElasticSampler(int64_t dataset_size, int64_t batch_size,
                               ElasticSamplerOptions options)
    : size_(dataset_size), batch_size_(batch_size), options_(options) {
  LOCKSTEP_CHECK(dataset_size >= 0, "ElasticSampler: dataset_size = ", dataset_size,
                 "; pass the number of samples, 0 or more");
  LOCKSTEP_CHECK(batch_size >= 1, "ElasticSampler: batch_size = ", batch_size,
                 "; pass the per-replica batch size, 1 or more");
  begin_epoch(0);
}

void ElasticSampler::begin_epoch(int64_t epoch) {
  epoch_ = epoch;
  cursor_ = 0;
  if (options_.shuffle) {
    // DistributedSampler's permutation: one definition of "the order of (seed, epoch)".
    const auto perm =
        epoch_permutation(static_cast<size_t>(size_), options_.seed, static_cast<uint64_t>(epoch));
    order_.assign(perm.begin(), perm.end());
  } else {
    order_.resize(static_cast<size_t>(size_));
    std::iota(order_.begin(), order_.end(), int64_t{0});
  }
}

std::vector<int64_t> ElasticSampler::batch(int rank, int replicas) const {
  check_replicas(rank, replicas);
  const int64_t left = remaining();
  // drop_last: fewer than replicas*b left (replicas > floor(left / b)), so some replica
  // would get a short batch. Every replica sees the same (left, replicas) and agrees.
  if (options_.drop_last && replicas > left / batch_size_) return {};
  const int64_t begin = clipped_product(rank, batch_size_, left);
  const int64_t end = clipped_product(int64_t{rank} + 1, batch_size_, left);
  const auto first = order_.begin() + static_cast<std::ptrdiff_t>(cursor_);
  return std::vector<int64_t>(first + static_cast<std::ptrdiff_t>(begin),
                              first + static_cast<std::ptrdiff_t>(end));
}

void ElasticSampler::commit(int replicas) {
  check_replicas(0, replicas);
  // With drop_last, a step that batch() left empty takes everything left: the tail is
  // skipped and the epoch ends.
  cursor_ += clipped_product(replicas, batch_size_, remaining());
  if (cursor_ >= size_) begin_epoch(epoch_ + 1);
}

void ElasticSampler::set_state(int64_t epoch, int64_t cursor) {
  LOCKSTEP_CHECK(epoch >= 0, "ElasticSampler::set_state: epoch = ", epoch,
                 "; pass a state() of a sampler (epoch >= 0)");
  LOCKSTEP_CHECK(cursor >= 0 && (cursor < size_ || cursor == 0),
                 "ElasticSampler::set_state: cursor = ", cursor, " out of range [0, ", size_,
                 ") for dataset_size ", size_,
                 "; pass a state() of a sampler over the same dataset (the end of an epoch "
                 "is (epoch + 1, 0))");
  if (epoch != epoch_) begin_epoch(epoch);
  cursor_ = cursor;
}

}  // namespace lockstep::data
