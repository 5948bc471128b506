// lm/corpus.h: the text the language model learns, and its train / held-out split.
//
// The default corpus is the King James Bible that Debian's bible-kjv-text ships
// (/usr/lib/bible.data, 1.7 MB in the reader's own compressed format), printed by the
// package's reader `bible` (package bible-kjv) one verse a line: 4.3 MB of ASCII,
// 31,102 verses under 1,189 chapter headings. Any other text file serves as well
// (data.corpus). Every rank loads the corpus itself (the reader takes ~40 ms), so there
// is no file to share between nodes; the workload checks that all ranks hold the same bytes.
//
// The split: the text is cut into blocks of `block_lines` lines (the last may be shorter),
// and the `heldout_fraction` of them with the smallest seeded hash values are held out.
// Deterministic (a function of the text and the options), disjoint and covering: every byte
// is in exactly one block, every block on exactly one side. Blocks of many lines keep the
// held-out text in passages the model has not seen, not single verses between seen ones.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace lm {

// The file the KJV text comes from, and the reader that prints it.
inline constexpr const char* kKjvDataFile = "/usr/lib/bible.data";
inline constexpr const char* kKjvReader = "bible";

// The corpus: the file at `path`, or the KJV when `path` is empty. Throws
// lockstep::data::DataError naming the file and the fix (the Debian package to install,
// or data.corpus) when it is missing, unreadable or empty.
std::string load_corpus(const std::string& path);
// The KJV, one verse a line, as `bible` prints it. Throws DataError when bible-kjv-text or
// bible-kjv is not installed or the reader fails.
std::string kjv_text();
// FNV-1a, 64 bits: equal corpora on every rank, checked with one broadcast.
uint64_t fingerprint(std::string_view text);

struct SplitOptions {
  int64_t block_lines = 50;
  double heldout_fraction = 0.05;  // in (0, 0.5]; at least one block is held out
  uint64_t seed = 11;
};

// One block of the text: bytes [begin, end).
struct TextBlock {
  int64_t begin = 0, end = 0;
  bool heldout = false;
};

struct CorpusSplit {
  std::vector<TextBlock> blocks;  // in text order, covering [0, text size) without gaps
  std::string train;              // the training blocks, concatenated in text order
  std::string heldout;            // the held-out blocks, likewise
  int64_t heldout_blocks = 0;
};

// Splits `text`; throws lockstep::InvalidArgument when it has fewer than two blocks (nothing
// would be left on one side).
CorpusSplit split_corpus(const std::string& text, const SplitOptions& options);

}  // namespace lm
