#include <lm/tokenizer.h>

#include <lockstep/error.h>

#include <cstdio>
#include <cstring>

namespace lm {

std::vector<int64_t> ByteTokenizer::encode(std::string_view text) {
  std::vector<int64_t> out(text.size());
  for (size_t i = 0; i < text.size(); ++i) out[i] = int64_t(static_cast<unsigned char>(text[i]));
  return out;
}

std::string ByteTokenizer::decode(const std::vector<int64_t>& tokens) {
  std::string out(tokens.size(), '\0');
  for (size_t i = 0; i < tokens.size(); ++i) {
    LOCKSTEP_CHECK(tokens[i] >= 0 && tokens[i] < kVocabSize, "ByteTokenizer::decode: token ",
                   tokens[i], " at position ", i, " is not a byte (0..255)");
    out[i] = char(static_cast<unsigned char>(tokens[i]));
  }
  return out;
}

torch::Tensor ByteTokenizer::encode_tensor(std::string_view text) {
  auto t = torch::empty({int64_t(text.size())}, torch::kInt64);
  int64_t* p = t.data_ptr<int64_t>();
  for (size_t i = 0; i < text.size(); ++i) p[i] = int64_t(static_cast<unsigned char>(text[i]));
  return t;
}

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (char c : text) {
    const auto u = static_cast<unsigned char>(c);
    if (c == '\n' || (u >= 0x20 && u < 0x7f)) {
      out += c;
    } else if (c == '\t') {
      out += ' ';
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02X", unsigned(u));
      out += buf;
    }
  }
  return out;
}

}  // namespace lm
