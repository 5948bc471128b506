#include <lm/corpus.h>

#include <lockstep/error.h>

#include <algorithm>
#include <cmath>
#include <numeric>

namespace lm {
namespace {

// splitmix64's finaliser: a well-mixed hash of (seed, block index), the same everywhere.
uint64_t block_hash(uint64_t seed, uint64_t index) {
  uint64_t z = seed * 0x9E3779B97F4A7C15ull + index + 0x632BE59BD9B4E019ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Blocks of `lines` lines each (a line ends after '\n'; the text's last line may lack it).
std::vector<TextBlock> cut_blocks(const std::string& text, int64_t lines) {
  std::vector<TextBlock> blocks;
  int64_t begin = 0, count = 0;
  for (int64_t i = 0; i < int64_t(text.size()); ++i) {
    if (text[size_t(i)] != '\n' || ++count < lines) continue;
    blocks.push_back({begin, i + 1, false});
    begin = i + 1;
    count = 0;
  }
  if (begin < int64_t(text.size())) blocks.push_back({begin, int64_t(text.size()), false});
  return blocks;
}

}  // namespace

CorpusSplit split_corpus(const std::string& text, const SplitOptions& o) {
  LOCKSTEP_CHECK(o.block_lines >= 1, "split_corpus: block_lines ", o.block_lines, " < 1");
  LOCKSTEP_CHECK(o.heldout_fraction > 0 && o.heldout_fraction <= 0.5,
                 "split_corpus: heldout_fraction ", o.heldout_fraction, " not in (0, 0.5]");
  CorpusSplit s;
  s.blocks = cut_blocks(text, o.block_lines);
  const int64_t n = int64_t(s.blocks.size());
  if (n < 2)
    throw lockstep::InvalidArgument(
        "the corpus (" + std::to_string(text.size()) + " bytes) makes " + std::to_string(n) +
        " block(s) of data.block_lines = " + std::to_string(o.block_lines) +
        " lines; the split needs at least 2: lower data.block_lines or use a longer text");
  // The k blocks with the smallest hashes: exactly k, whatever the seed, and a different
  // seed draws an independent set.
  const int64_t k = std::clamp<int64_t>(std::llround(o.heldout_fraction * double(n)), 1, n - 1);
  std::vector<int64_t> order(size_t(n), 0);
  std::iota(order.begin(), order.end(), 0);
  std::nth_element(order.begin(), order.begin() + k, order.end(), [&](int64_t a, int64_t b) {
    return block_hash(o.seed, uint64_t(a)) < block_hash(o.seed, uint64_t(b));
  });
  for (int64_t i = 0; i < k; ++i) s.blocks[size_t(order[size_t(i)])].heldout = true;
  s.heldout_blocks = k;
  for (const TextBlock& b : s.blocks)
    (b.heldout ? s.heldout : s.train).append(text, size_t(b.begin), size_t(b.end - b.begin));
  return s;
}

}  // namespace lm
