// lockstep/train/progress_bar.h: a one-line progress bar with rate and ETA (rank 0 only).
//
// On a terminal it redraws one line with '\r'; when stderr is a file or pipe (CI logs,
// lockstep-run's prefixed output) it prints a plain line every 10% instead, so logs stay
// readable.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

namespace lockstep::train {

class ProgressBar {
 public:
  ProgressBar(int64_t total, int64_t start = 0, bool enabled = true);
  // `done` steps finished; `note` is appended (e.g. "loss 0.512").
  void update(int64_t done, const std::string& note);
  void finish();

 private:
  int64_t total_, start_;
  bool enabled_, tty_;
  int last_decile_ = -1;
  std::chrono::steady_clock::time_point t0_, last_draw_;
};

std::string format_duration(double seconds);  // "1:02:03" / "02:03"

}  // namespace lockstep::train
