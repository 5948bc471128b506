// lm/batch_stream.h: training windows over the training text, and batches of them.
//
// An example is a window of context + 1 bytes: the model reads the first `context` and
// predicts each next byte (inputs text[s, s + T), targets text[s + 1, s + T + 1)). Epoch e
// tiles the text with windows every T bytes from a shift in [0, T) drawn from (seed, e),
// so each epoch sees new window boundaries, shuffles the tiles, and deals them to the
// ranks in turn (rank r takes tiles r, r + P, r + 2P, ... of the shuffled order). Every
// epoch has the same number of windows, T-aligned: size / T - 1 (the shift may take up to
// T - 1 bytes at the start). The order is a pure function of (seed, epoch, rank, world):
// a resumed run replays it, and begin_epoch(e, skip) moves past the first `skip` windows
// without touching the text. Shuffles draw with mt19937_64 and a modulo (not
// std::uniform_int_distribution, whose mapping is implementation-defined), so every
// standard library gives the same order.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lm {

struct LmBatch {
  torch::Tensor input;   // [B, T] int64 tokens
  torch::Tensor target;  // [B, T] int64: the next token of each input position
};

// Windows of context + 1 bytes of `text` starting at `starts` (each must fit).
LmBatch window_batch(const std::string& text, const std::vector<int64_t>& starts, int64_t context);

class WindowStream {
 public:
  // `text` is shared, not copied; it must not change while the stream lives. Throws
  // lockstep::InvalidArgument when the text holds fewer windows than ranks.
  WindowStream(std::shared_ptr<const std::string> text, int64_t context, int rank, int world,
               uint64_t seed);

  // Windows per epoch over all ranks: text size / context - 1.
  static int64_t windows_per_epoch(int64_t text_size, int64_t context);
  // This rank's share of them (ranks below the remainder get one more).
  static int64_t windows_of_rank(int64_t text_size, int64_t context, int rank, int world);
  // The start offsets of `rank`'s windows in epoch `epoch`, in the order it trains them.
  static std::vector<int64_t> epoch_starts(int64_t text_size, int64_t context, uint64_t seed,
                                           int64_t epoch, int rank, int world);

  void begin_epoch(int64_t epoch, int64_t skip_windows);
  // The next `n` windows (fewer at the end of the epoch; none after it).
  LmBatch next(int64_t n);
  int64_t size() const { return int64_t(starts_.size()); }  // this rank's windows per epoch

 private:
  std::shared_ptr<const std::string> text_;
  int64_t context_;
  int rank_, world_;
  uint64_t seed_;
  std::vector<int64_t> starts_;
  size_t cursor_ = 0;
};

}  // namespace lm
