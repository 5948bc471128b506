// The corpus and its split: the KJV loads from Debian's bible-kjv-text; the split is
// disjoint, covering, deterministic and holds out the asked share; bad input is named.
#include <lm/corpus.h>

#include <lockstep/data/data_error.h>
#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

using namespace lm;

namespace {

// `lines` lines of 0..79 letters (some empty); the last without a newline when `open_end`.
std::string lines_of_text(int lines, bool open_end, uint64_t seed = 3) {
  std::mt19937_64 rng(seed);
  std::string s;
  for (int i = 0; i < lines; ++i) {
    const int len = int(rng() % 80);
    for (int j = 0; j < len; ++j) s += char('a' + rng() % 26);
    if (i + 1 < lines || !open_end) s += '\n';
  }
  return s;
}

}  // namespace

TEST(LmSplit, BlocksAreDisjointAndCoverTheText) {
  for (bool open_end : {false, true}) {
    const std::string text = lines_of_text(1003, open_end);
    SplitOptions o;
    o.block_lines = 10;
    o.heldout_fraction = 0.1;
    const CorpusSplit s = split_corpus(text, o);
    ASSERT_EQ(s.blocks.size(), 101u);  // 100 full blocks and one of 3 lines
    int64_t at = 0, train = 0, held = 0, held_blocks = 0;
    std::string train_text, held_text;
    for (const TextBlock& b : s.blocks) {
      ASSERT_EQ(b.begin, at) << "a gap or an overlap";
      ASSERT_GT(b.end, b.begin);
      at = b.end;
      const std::string part = text.substr(size_t(b.begin), size_t(b.end - b.begin));
      (b.heldout ? held_text : train_text) += part;
      (b.heldout ? held : train) += b.end - b.begin;
      held_blocks += b.heldout;
    }
    EXPECT_EQ(at, int64_t(text.size()));
    EXPECT_EQ(held_blocks, 10);  // round(0.1 x 101)
    EXPECT_EQ(s.heldout_blocks, 10);
    EXPECT_EQ(s.train, train_text);  // each side is its blocks, in text order
    EXPECT_EQ(s.heldout, held_text);
    EXPECT_EQ(int64_t(s.train.size()) + int64_t(s.heldout.size()), int64_t(text.size()));
  }
}

TEST(LmSplit, DeterministicAndSeeded) {
  const std::string text = lines_of_text(2000, false);
  SplitOptions o;
  o.block_lines = 20;
  const CorpusSplit a = split_corpus(text, o), b = split_corpus(text, o);
  EXPECT_EQ(a.heldout, b.heldout);
  o.seed = 12;
  const CorpusSplit c = split_corpus(text, o);
  EXPECT_EQ(c.heldout_blocks, a.heldout_blocks);
  EXPECT_NE(c.heldout, a.heldout);  // another seed holds out other blocks
}

TEST(LmSplit, AtLeastOneBlockOnEachSide) {
  SplitOptions o;
  o.block_lines = 1;
  o.heldout_fraction = 0.01;  // rounds to 0 blocks of 2: one is held out anyway
  const CorpusSplit s = split_corpus("one\ntwo\n", o);
  EXPECT_EQ(s.heldout_blocks, 1);
  EXPECT_FALSE(s.train.empty());
  EXPECT_FALSE(s.heldout.empty());
  o.block_lines = 5;
  EXPECT_THROW(split_corpus("one\ntwo\n", o), lockstep::InvalidArgument);  // one block
}

TEST(LmCorpus, KjvFromDebiansPackage) {
  // bible-kjv-text and bible-kjv are in scripts/install-deps.sh's list.
  const std::string kjv = load_corpus("");
  EXPECT_EQ(kjv.size(), 4298239u);
  EXPECT_EQ(
      kjv.rfind("\nGenesis 1\n\n  1 In the beginning God created the heaven and the earth.\n", 0),
      0u);
  EXPECT_NE(kjv.find("  21 The grace of our Lord Jesus Christ be with you all. Amen.\n"),
            std::string::npos);
  EXPECT_EQ(fingerprint(kjv), fingerprint(load_corpus("")));  // the reader is deterministic
  const CorpusSplit s = split_corpus(kjv, SplitOptions{});
  EXPECT_EQ(s.blocks.size(), 694u);  // 34,669 lines / 50
  EXPECT_EQ(s.heldout_blocks, 35);   // 5%
}

TEST(LmCorpus, MissingFileNamesItAndTheFix) {
  try {
    load_corpus("/nonexistent/corpus.txt");
    FAIL() << "no error";
  } catch (const lockstep::data::DataError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("/nonexistent/corpus.txt: no such corpus file (data.corpus"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("bible-kjv-text"), std::string::npos) << m;
  }
}

TEST(LmCorpus, FingerprintSeesEveryByte) {
  EXPECT_NE(fingerprint("abc"), fingerprint("abd"));
  EXPECT_NE(fingerprint("ab"), fingerprint("ba"));
  EXPECT_EQ(fingerprint(""), 0xcbf29ce484222325ull);
}
