// lockstep/compress/policy.h: which layers are compressed, and how, from code or environment.
//
// Small layers gain nothing from compression (their metadata and the fixed cost of a
// collective dominate) and biases / normalization parameters are sensitive to noise while
// being tiny, so by default layers under `min_layer` elements or whose name contains one of
// `exclude` travel uncompressed, in one plain allreduce per call.
//
// Environment (read by apply_env(); qsgd() applies it, so a job can turn compression on or
// retune it without recompiling; a set variable overrides the code's value):
//   LOCKSTEP_COMPRESSION_BITS         1..8 bits per value, or 32 = off (plain allreduce)
//   LOCKSTEP_COMPRESSION_BUCKET_SIZE  values per bucket (1..2^24; default 128)
//   LOCKSTEP_COMPRESSION_MIN_LAYER    layers with fewer elements go uncompressed (default 1024)
//   LOCKSTEP_COMPRESSION_EXCLUDE      comma-separated substrings of layer names sent
//                                     uncompressed (default "bias,norm"; "" = none)
//   LOCKSTEP_COMPRESSION_ERROR_FEEDBACK  0|1
//   LOCKSTEP_COMPRESSION_SEED         seed of the rounding random numbers
// A malformed value raises lockstep::ConfigError naming the variable.
#pragma once

#include <lockstep/compress/qsgd_codec.h>

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::compress {

struct QsgdOptions {
  int bits = 4;               // 1..8; 32 = compression off (every layer plain)
  int64_t bucket_size = 128;  // values per bucket (never spans two layers)
  int64_t min_layer = 1024;   // layers with fewer elements are sent uncompressed
  std::vector<std::string> exclude = {"bias", "norm"};  // name substrings sent uncompressed
  bool stochastic = true;       // unbiased rounding; false = round to nearest
  bool error_feedback = false;  // add each step's quantization residual to the next step
  uint64_t seed = 0;            // with (step, rank, bucket) selects the rounding decisions
  bool use_env = true;          // qsgd(): apply LOCKSTEP_COMPRESSION_* overrides
  // Pipelining of the compressed allreduce: each rank's part is exchanged in rounds of about
  // this many values (at most 16 rounds), so the codec work of one round overlaps the
  // transfer of another (on a helper thread the plan keeps from its first pipelined call
  // until it is destroyed). 0 = one round, no helper. Results do not depend on it; every
  // rank must use the same value (it shapes the messages).
  int64_t pipeline_chunk = int64_t(1) << 20;
  // On a two-level group (the hier backend: several nodes, several ranks each), reduce
  // inside each node in full precision and quantize only the exchange between nodes
  // (compressed_allreduce.h); false: the flat algorithm over all ranks, every hop
  // compressed. Every rank must use the same value.
  bool across_nodes_only = true;

  CodecOptions codec() const { return {bits, bucket_size, stochastic}; }
  bool enabled() const { return bits != 32; }
};

// Returns `o` with every set LOCKSTEP_COMPRESSION_* variable applied; ConfigError naming
// the variable on a bad value. Also validates the result.
QsgdOptions apply_env(QsgdOptions o);
// The options from the environment alone, if LOCKSTEP_COMPRESSION_BITS is set (how a
// launcher-level switch turns compression on for an unmodified program).
std::optional<QsgdOptions> options_from_env();
// InvalidArgument unless bits in 1..8 or 32, bucket_size 1..2^24, min_layer >= 0.
void validate(const QsgdOptions& o);

// True if a layer with this name and element count is quantized under `o`.
bool should_compress(const QsgdOptions& o, const std::string& name, int64_t numel);

}  // namespace lockstep::compress
