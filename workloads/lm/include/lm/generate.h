// lm/generate.h: text from the model, one byte at a time.
//
// Each step runs the model on the last `context` bytes (no key/value cache: a sample of a
// few hundred bytes from a small model takes well under a second) and picks the next byte
// from the last position's logits: the most likely one (temperature 0, greedy), or a draw
// from softmax(logits / temperature). Draws use mt19937_64 seeded with `seed` and the
// inverse CDF over the 256 bytes in float64, so a seed gives the same text on every
// standard library for the same logits.
#pragma once

#include <lm/model.h>

#include <cstdint>
#include <string>

namespace lm {

struct SampleOptions {
  int64_t tokens = 200;      // bytes to generate after the prompt
  double temperature = 0.8;  // 0: greedy
  uint64_t seed = 1;
};

// The `options.tokens` bytes that follow `prompt` (not including it). Runs under
// NoGradGuard; the caller puts the model in eval mode (dropout off). Throws
// lockstep::InvalidArgument for an empty prompt.
std::string generate(LmImpl& model, const std::string& prompt, const SampleOptions& options);

}  // namespace lm
