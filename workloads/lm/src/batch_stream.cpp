#include <lm/batch_stream.h>

#include <lockstep/error.h>

#include <algorithm>
#include <random>

namespace lm {

LmBatch window_batch(const std::string& text, const std::vector<int64_t>& starts, int64_t context) {
  const int64_t B = int64_t(starts.size()), T = context;
  auto input = torch::empty({B, T}, torch::kInt64);
  auto target = torch::empty({B, T}, torch::kInt64);
  int64_t* in = input.data_ptr<int64_t>();
  int64_t* tg = target.data_ptr<int64_t>();
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  for (int64_t b = 0; b < B; ++b) {
    const int64_t s = starts[size_t(b)];
    LOCKSTEP_CHECK(s >= 0 && s + T + 1 <= int64_t(text.size()), "window_batch: window at ", s,
                   " of ", T + 1, " bytes does not fit a text of ", text.size());
    for (int64_t t = 0; t < T; ++t) {
      in[b * T + t] = bytes[s + t];
      tg[b * T + t] = bytes[s + t + 1];
    }
  }
  return {input, target};
}

WindowStream::WindowStream(std::shared_ptr<const std::string> text, int64_t context, int rank,
                           int world, uint64_t seed)
    : text_(std::move(text)), context_(context), rank_(rank), world_(world), seed_(seed) {
  LOCKSTEP_CHECK(context_ >= 1 && world_ >= 1 && rank_ >= 0 && rank_ < world_,
                 "WindowStream: context ", context_, ", rank ", rank_, " of ", world_);
  const int64_t n = windows_per_epoch(int64_t(text_->size()), context_);
  if (n < world_)
    throw lockstep::InvalidArgument("the training text (" + std::to_string(text_->size()) +
                                    " bytes) holds " + std::to_string(n) + " windows of " +
                                    std::to_string(context_ + 1) + " bytes, fewer than the " +
                                    std::to_string(world_) + " ranks");
}

int64_t WindowStream::windows_per_epoch(int64_t text_size, int64_t context) {
  // Tiles at shift + i T, i < n, each of T + 1 bytes, for any shift < T: (n + 1) T <= size.
  return std::max<int64_t>(text_size / context - 1, 0);
}

int64_t WindowStream::windows_of_rank(int64_t text_size, int64_t context, int rank, int world) {
  const int64_t n = windows_per_epoch(text_size, context);
  return n / world + (rank < n % world ? 1 : 0);
}

std::vector<int64_t> WindowStream::epoch_starts(int64_t text_size, int64_t context, uint64_t seed,
                                                int64_t epoch, int rank, int world) {
  const int64_t n = windows_per_epoch(text_size, context);
  std::mt19937_64 rng(seed * 0x9E3779B97F4A7C15ull ^ (uint64_t(epoch) + 1) * 0xD1B54A32D192ED03ull);
  const int64_t shift = int64_t(rng() % uint64_t(context));
  std::vector<int64_t> tiles(size_t(n), 0);
  for (int64_t i = 0; i < n; ++i) tiles[size_t(i)] = i;
  for (int64_t i = n - 1; i > 0; --i)  // Fisher-Yates, the same on every rank
    std::swap(tiles[size_t(i)], tiles[size_t(rng() % uint64_t(i + 1))]);
  std::vector<int64_t> out;
  out.reserve(size_t(windows_of_rank(text_size, context, rank, world)));
  for (int64_t j = rank; j < n; j += world) out.push_back(shift + tiles[size_t(j)] * context);
  return out;
}

void WindowStream::begin_epoch(int64_t epoch, int64_t skip_windows) {
  starts_ = epoch_starts(int64_t(text_->size()), context_, seed_, epoch, rank_, world_);
  cursor_ = size_t(std::clamp<int64_t>(skip_windows, 0, int64_t(starts_.size())));
}

LmBatch WindowStream::next(int64_t n) {
  const size_t end = std::min(starts_.size(), cursor_ + size_t(std::max<int64_t>(n, 0)));
  std::vector<int64_t> batch(starts_.begin() + std::ptrdiff_t(cursor_),
                             starts_.begin() + std::ptrdiff_t(end));
  cursor_ = end;
  return window_batch(*text_, batch, context_);
}

}  // namespace lm
