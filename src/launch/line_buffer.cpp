// Line splitting for rank output.
#include "line_buffer.h"

namespace lockstep::launch {

std::vector<std::string> LineBuffer::feed(const char* data, std::size_t n) {
  std::vector<std::string> lines;
  pending_.append(data, n);
  std::size_t start = 0;
  for (;;) {
    std::size_t nl = pending_.find('\n', start);
    if (nl == std::string::npos) break;
    lines.emplace_back(pending_, start, nl - start);
    start = nl + 1;
  }
  pending_.erase(0, start);
  while (pending_.size() >= kMaxLine) {
    lines.emplace_back(pending_, 0, kMaxLine);
    pending_.erase(0, kMaxLine);
  }
  return lines;
}

bool LineBuffer::flush(std::string* line) {
  if (pending_.empty()) return false;
  line->swap(pending_);
  pending_.clear();
  return true;
}

void TailBuffer::push(std::string line) {
  if (capacity_ == 0) return;
  if (lines_.size() == capacity_) lines_.pop_front();
  lines_.push_back(std::move(line));
}

}  // namespace lockstep::launch
