// src/launch/line_buffer.h: splitting a rank's byte stream into whole lines.
//
// Ranks write arbitrary chunks; the launcher must print whole prefixed lines so output of
// different ranks never interleaves mid-line. Not thread-safe (one poll loop owns it).
#pragma once

#include <cstddef>
#include <deque>
#include <string>
#include <vector>

namespace lockstep::launch {

class LineBuffer {
 public:
  // A line longer than this is emitted in pieces, so a rank that never writes '\n'
  // cannot grow the launcher's memory without bound.
  static constexpr std::size_t kMaxLine = std::size_t{64} * 1024;

  // Appends bytes; returns the lines completed by them (without the '\n').
  std::vector<std::string> feed(const char* data, std::size_t n);
  // At end of stream: the partial last line, if any (then the buffer is empty).
  bool flush(std::string* line);

 private:
  std::string pending_;
};

// The last `capacity` lines of a stream (for the failure summary).
class TailBuffer {
 public:
  explicit TailBuffer(std::size_t capacity = 20) : capacity_(capacity) {}
  void push(std::string line);
  const std::deque<std::string>& lines() const { return lines_; }
  void clear() { lines_.clear(); }

 private:
  std::size_t capacity_;
  std::deque<std::string> lines_;
};

}  // namespace lockstep::launch
