// lm/heldout.h: the model's cross-entropy on held-out text.
//
// The text is cut into non-overlapping windows of context + 1 bytes at 0, T, 2T, ... (the
// tail that fills no window, under T bytes, is left out); every window's T next-byte
// predictions are scored, so each position sees between 1 and T bytes of context, as in
// the usual "non-overlapping chunks" evaluation (a sliding window would give every byte a
// full context at T times the cost). Rank r scores windows r, r + P, r + 2P, ...; the sums
// over ranks add up to the whole text's, whatever P. Perplexity = exp(nats / tokens).
#pragma once

#include <lm/model.h>

#include <cstdint>
#include <string>

namespace lm {

struct HeldoutOptions {
  int64_t batch_size = 32;  // windows per forward
  int64_t max_tokens = 0;   // score only the first ceil(max_tokens / T) windows (0: all)
  int rank = 0, world = 1;
};

struct HeldoutLoss {
  double nats = 0;     // summed cross-entropy
  int64_t tokens = 0;  // predictions scored
};

// Windows of `text` that the evaluation scores (over all ranks).
int64_t heldout_windows(int64_t text_size, int64_t context, int64_t max_tokens);
// This rank's part of the evaluation. Runs under NoGradGuard; the caller sets eval mode.
HeldoutLoss heldout_loss(LmImpl& model, const std::string& text, const HeldoutOptions& options);

}  // namespace lm
