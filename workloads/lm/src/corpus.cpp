#include <lm/corpus.h>

#include "command.h"

#include <lockstep/data/data_error.h>

#include <filesystem>
#include <fstream>
#include <sstream>

namespace lm {
namespace {

using lockstep::data::DataError;

// The whole Bible, Genesis 1:1 to Revelation 22:21, one verse a line (no verse is longer
// than 532 bytes, so a 10000-column line never wraps). stdin from /dev/null: the reader is
// interactive when it gets no verses.
constexpr const char* kKjvCommand =
    "bible -l10000 Genesis1:1-Revelation22:21 </dev/null 2>/dev/null";
// The reader prints 4,298,239 bytes; less than this means it failed part way.
constexpr size_t kKjvMinBytes = 4000000;
const char* const kKjvFix =
    "apt-get install bible-kjv-text bible-kjv (or scripts/install-deps.sh), or set "
    "data.corpus to a text file of your own";

std::string read_text_file(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::exists(path, ec))
    throw DataError(DataError::Kind::NotFound, path,
                    path +
                        ": no such corpus file (data.corpus; leave it empty for the KJV of "
                        "Debian's bible-kjv-text)");
  if (std::filesystem::is_directory(path, ec))
    throw DataError(DataError::Kind::Io, path,
                    path + ": data.corpus is a directory; it must name a text file");
  std::ifstream in(path, std::ios::binary);
  std::ostringstream s;
  if (!in || !(s << in.rdbuf()))
    throw DataError(DataError::Kind::Io, path, path + ": cannot read the corpus (permissions?)");
  return s.str();
}

}  // namespace

std::string kjv_text() {
  std::error_code ec;
  if (!std::filesystem::exists(kKjvDataFile, ec))
    throw DataError(DataError::Kind::NotFound, kKjvDataFile,
                    std::string(kKjvDataFile) +
                        ": the King James Bible text (Debian package bible-kjv-text) is not "
                        "installed: " +
                        kKjvFix);
  const CommandOutput out = run_command(kKjvCommand);
  if (out.status == 127)
    throw DataError(DataError::Kind::NotFound, kKjvReader,
                    std::string("'") + kKjvReader +
                        "', the reader of bible-kjv-text's compressed text (Debian package "
                        "bible-kjv), is not installed: " +
                        kKjvFix);
  if (out.status != 0 || out.text.size() < kKjvMinBytes)
    throw DataError(DataError::Kind::Io, kKjvDataFile,
                    std::string("'") + kKjvCommand + "' exited " + std::to_string(out.status) +
                        " after printing " + std::to_string(out.text.size()) + " bytes (want " +
                        std::to_string(kKjvMinBytes) + " or more): reinstall bible-kjv-text (" +
                        kKjvFix + ")");
  return out.text;
}

std::string load_corpus(const std::string& path) {
  std::string text = path.empty() ? kjv_text() : read_text_file(path);
  if (text.empty()) throw DataError(DataError::Kind::Io, path, path + ": the corpus file is empty");
  return text;
}

uint64_t fingerprint(std::string_view text) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (char c : text) {
    h ^= static_cast<unsigned char>(c);
    h *= 0x100000001b3ull;
  }
  return h;
}

}  // namespace lm
