// The per-rank error file: written by a failing rank, read by lockstep-run's summary.
#include "lockstep/launch/error_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <sstream>

#include "lockstep/env_contract.h"

namespace lockstep::launch {
namespace {

// The value of the first "message": "..." in torchelastic's JSON (nested or not).
std::string json_message(const std::string& text) {
  std::size_t at = 0;
  for (;;) {
    at = text.find("\"message\"", at);
    if (at == std::string::npos) return text;  // not the format we know: show it whole
    std::size_t q = text.find_first_not_of(" \t\r\n:", at + 9);
    at += 9;
    if (q == std::string::npos || text[q] != '"') continue;  // {"message": {...}}: go inside
    std::string out;
    for (std::size_t i = q + 1; i < text.size(); ++i) {
      char c = text[i];
      if (c == '"') return out;
      if (c == '\\' && i + 1 < text.size()) {
        c = text[++i];
        out += c == 'n' ? '\n' : c == 't' ? '\t' : c;
        continue;
      }
      out += c;
    }
    return out;
  }
}

}  // namespace

bool record_error(const std::string& message) {
  const char* path = std::getenv(env::kErrorFile);
  if (!path || !*path) path = std::getenv(env::kTorchelasticErrorFile);
  if (!path || !*path) return false;
  // O_EXCL: the first error of the process wins, even across threads.
  int fd = ::open(path, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0644);
  if (fd < 0) return false;
  std::string text = message;
  if (text.empty() || text.back() != '\n') text += '\n';
  std::size_t off = 0;
  while (off < text.size()) {
    ssize_t n = ::write(fd, text.data() + off, text.size() - off);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    off += std::size_t(n);
  }
  ::close(fd);
  return off == text.size();
}

std::string read_error_file(const std::string& path) {
  std::ifstream in(path);
  if (!in) return {};
  std::ostringstream ss;
  ss << in.rdbuf();
  std::string text = ss.str();
  const std::size_t first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return {};
  if (text[first] == '{') text = json_message(text);
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

std::string error_file_path(const std::string& dir, int rank) {
  return dir + "/error_rank_" + std::to_string(rank) + ".txt";
}

}  // namespace lockstep::launch
