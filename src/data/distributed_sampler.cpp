// DistributedSampler: PyTorch's sharding (pad by wrapping or drop the tail, then take
// every world_size-th index) over a permutation that depends only on (seed, epoch).
#include <lockstep/data/distributed_sampler.h>

#include <lockstep/error.h>

#include <torch/torch.h>

#include <algorithm>
#include <numeric>
#include <random>

namespace lockstep::data {
namespace {

// splitmix64: spreads nearby (seed, epoch) pairs over the whole state space, so epoch 1
// of seed 0 and epoch 0 of seed 1 do not start mt19937_64 from related states.
uint64_t splitmix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}

// Uniform in [0, bound) by rejection. std::uniform_int_distribution is
// implementation-defined, and two ranks built by different standard libraries must
// still agree; mt19937_64's output sequence is fixed by the standard.
uint64_t uniform_below(std::mt19937_64& gen, uint64_t bound) {
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % bound);  // multiple of bound
  uint64_t r;
  do {
    r = gen();
  } while (r >= limit);
  return r % bound;
}

}  // namespace

std::vector<size_t> epoch_permutation(size_t n, uint64_t seed, uint64_t epoch) {
  std::vector<size_t> p(n);
  std::iota(p.begin(), p.end(), size_t{0});
  std::mt19937_64 gen(splitmix64(seed ^ splitmix64(epoch)));
  // Fisher-Yates, spelled out because std::shuffle's algorithm is unspecified.
  for (size_t i = n; i > 1; --i) {
    const size_t j = static_cast<size_t>(uniform_below(gen, i));
    std::swap(p[i - 1], p[j]);
  }
  return p;
}

DistributedSampler::DistributedSampler(size_t dataset_size, int num_replicas, int rank,
                                       DistributedSamplerOptions options)
    : dataset_size_(dataset_size),
      rank_(rank),
      world_size_(num_replicas),
      options_(options),
      epoch_(std::make_shared<std::atomic<uint64_t>>(0)) {
  LOCKSTEP_CHECK(num_replicas >= 1,
                 "DistributedSampler: num_replicas (the world size) must be "
                 ">= 1, got ",
                 num_replicas);
  LOCKSTEP_CHECK(rank >= 0 && rank < num_replicas, "DistributedSampler: rank ", rank,
                 " out of range [0, num_replicas = ", num_replicas, ")");
  reset(torch::nullopt);
}

void DistributedSampler::set_epoch(uint64_t epoch) { epoch_->store(epoch); }

uint64_t DistributedSampler::epoch() const { return epoch_->load(); }

std::vector<size_t> DistributedSampler::indices() const {
  const size_t n = dataset_size_;
  const size_t w = static_cast<size_t>(world_size_);
  const size_t total = num_samples_ * w;
  std::vector<size_t> order;
  if (options_.shuffle) {
    order = epoch_permutation(n, options_.seed, epoch());
  } else {
    order.resize(n);
    std::iota(order.begin(), order.end(), size_t{0});
  }
  std::vector<size_t> share;
  share.reserve(num_samples_);
  // Position k of the padded list is order[k % n]: wrapping around, repeatedly if the
  // world is larger than the dataset (as PyTorch does). With drop_last, total <= n.
  for (size_t k = static_cast<size_t>(rank_); k < total; k += w) share.push_back(order[k % n]);
  return share;
}

void DistributedSampler::reset(torch::optional<size_t> new_size) {
  if (new_size) dataset_size_ = *new_size;
  const size_t w = static_cast<size_t>(world_size_);
  num_samples_ = options_.drop_last ? dataset_size_ / w : (dataset_size_ + w - 1) / w;
  share_ = indices();
  cursor_ = 0;
}

torch::optional<DistributedSampler::BatchRequest> DistributedSampler::next(size_t batch_size) {
  if (cursor_ >= share_.size() || batch_size == 0) return torch::nullopt;
  const size_t end = std::min(share_.size(), cursor_ + batch_size);
  BatchRequest batch(share_.begin() + static_cast<std::ptrdiff_t>(cursor_),
                     share_.begin() + static_cast<std::ptrdiff_t>(end));
  cursor_ = end;
  return batch;
}

namespace {
torch::Tensor scalar(int64_t v) { return torch::tensor(v, torch::kInt64); }
int64_t read_scalar(torch::serialize::InputArchive& a, const char* key) {
  torch::Tensor t;
  a.read(key, t);
  return t.item<int64_t>();
}
}  // namespace

void DistributedSampler::save(torch::serialize::OutputArchive& archive) const {
  archive.write("lockstep_sampler/epoch", scalar(static_cast<int64_t>(epoch())));
  archive.write("lockstep_sampler/cursor", scalar(static_cast<int64_t>(cursor_)));
  archive.write("lockstep_sampler/dataset_size", scalar(static_cast<int64_t>(dataset_size_)));
  archive.write("lockstep_sampler/seed", scalar(static_cast<int64_t>(options_.seed)));
  archive.write("lockstep_sampler/flags",
                scalar((options_.shuffle ? 1 : 0) | (options_.drop_last ? 2 : 0)));
  archive.write("lockstep_sampler/rank", scalar(rank_));
  archive.write("lockstep_sampler/world_size", scalar(world_size_));
}

void DistributedSampler::load(torch::serialize::InputArchive& archive) {
  // A checkpoint restored with another world size or seed would silently visit a
  // different set of samples; refuse it instead.
  auto expect = [&](const char* key, int64_t mine, const char* what) {
    const int64_t saved = read_scalar(archive, key);
    if (saved != mine)
      throw InvalidArgument(
          lockstep::detail::concat("DistributedSampler::load: the archive was saved with ", what,
                                   " ", saved, ", this sampler has ", mine));
  };
  expect("lockstep_sampler/dataset_size", static_cast<int64_t>(dataset_size_), "dataset size");
  expect("lockstep_sampler/seed", static_cast<int64_t>(options_.seed), "seed");
  expect("lockstep_sampler/flags", (options_.shuffle ? 1 : 0) | (options_.drop_last ? 2 : 0),
         "flags (1 = shuffle, 2 = drop_last)");
  expect("lockstep_sampler/rank", rank_, "rank");
  expect("lockstep_sampler/world_size", world_size_, "world size");
  const int64_t epoch = read_scalar(archive, "lockstep_sampler/epoch");
  const int64_t cursor = read_scalar(archive, "lockstep_sampler/cursor");
  set_epoch(static_cast<uint64_t>(epoch));
  reset(torch::nullopt);
  cursor_ = std::min(static_cast<size_t>(cursor), share_.size());
}

}  // namespace lockstep::data
