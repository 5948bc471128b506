// The byte tokenizer: every byte string round-trips exactly, ids are the byte values, and
// anything that is not a byte is refused.
#include <lm/tokenizer.h>

#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <random>
#include <string>

using lm::ByteTokenizer;

TEST(LmTokenizer, RoundTripsEveryByteValue) {
  std::string all;
  for (int b = 0; b < 256; ++b) all += char(static_cast<unsigned char>(b));
  const auto ids = ByteTokenizer::encode(all);
  ASSERT_EQ(ids.size(), 256u);
  for (int b = 0; b < 256; ++b) EXPECT_EQ(ids[size_t(b)], b);  // unsigned, whatever char is
  EXPECT_EQ(ByteTokenizer::decode(ids), all);
}

TEST(LmTokenizer, RoundTripsArbitraryBytes) {
  std::mt19937_64 rng(5);
  for (size_t len : {size_t(0), size_t(1), size_t(7), size_t(4096)}) {
    std::string s(len, '\0');
    for (auto& c : s) c = char(static_cast<unsigned char>(rng() & 0xff));
    EXPECT_EQ(ByteTokenizer::decode(ByteTokenizer::encode(s)), s) << "length " << len;
    const auto t = ByteTokenizer::encode_tensor(s);
    ASSERT_EQ(t.numel(), int64_t(len));
    EXPECT_EQ(t.scalar_type(), torch::kInt64);
    const auto ids = ByteTokenizer::encode(s);
    for (size_t i = 0; i < len; ++i) ASSERT_EQ(t[int64_t(i)].item<int64_t>(), ids[i]);
  }
  // UTF-8 text is bytes like any other: "é" is two tokens.
  EXPECT_EQ(ByteTokenizer::encode("\xC3\xA9"), (std::vector<int64_t>{0xC3, 0xA9}));
}

TEST(LmTokenizer, RefusesIdsOutsideTheVocabulary) {
  EXPECT_EQ(ByteTokenizer::kVocabSize, 256);
  EXPECT_THROW(ByteTokenizer::decode({65, 256}), lockstep::InvalidArgument);
  EXPECT_THROW(ByteTokenizer::decode({-1}), lockstep::InvalidArgument);
}

TEST(LmTokenizer, PrintableEscapesWhatATerminalWouldNotShow) {
  EXPECT_EQ(lm::printable("In the beginning\n"), "In the beginning\n");
  EXPECT_EQ(lm::printable(std::string("a\tb\x01\xFF", 5)), "a b\\x01\\xFF");
}
