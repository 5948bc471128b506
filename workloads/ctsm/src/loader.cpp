#include <ctsm/loader.h>

namespace ctsm {

CtsmLoader::CtsmLoader(std::vector<std::string> shards, EventPart part, CtsmLoaderOptions options)
    : stream_(std::move(shards), part), part_(part), opt_(options) {}

void CtsmLoader::begin_epoch(int64_t epoch, int64_t skip_examples) {
  stream_.rewind();
  buffer_.clear();
  stream_done_ = false;
  // mt19937_64 with uniform index by modulo (not std::uniform_int_distribution, whose
  // mapping is implementation-defined): the same order on every standard library.
  rng_.seed(opt_.seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(epoch) << 20) ^ uint64_t(part_.part));
  CtsmExample ex;
  for (int64_t i = 0; i < skip_examples; ++i)
    if (!next_example(ex)) break;
}

bool CtsmLoader::next_example(CtsmExample& out) {
  while (!stream_done_ && int64_t(buffer_.size()) < opt_.shuffle_buffer) {
    auto c = stream_.next();
    if (!c) {
      stream_done_ = true;
      break;
    }
    buffer_.push_back(make_train_example(*c, opt_.cutoff_s, opt_.max_len));
  }
  if (buffer_.empty()) return false;
  const size_t i = size_t(rng_() % buffer_.size());
  std::swap(buffer_[i], buffer_.back());
  out = std::move(buffer_.back());
  buffer_.pop_back();
  return true;
}

CtsmBatch CtsmLoader::next_batch(int64_t n) {
  std::vector<CtsmExample> batch;
  batch.reserve(size_t(n));
  CtsmExample ex;
  while (int64_t(batch.size()) < n && next_example(ex)) batch.push_back(std::move(ex));
  return collate(batch);
}

}  // namespace ctsm
