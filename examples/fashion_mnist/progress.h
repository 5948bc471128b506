// progress.h: a one-line progress bar for rank 0.
//
// On a terminal it redraws one line with \r ("epoch 2/4 [=====>    ] 234/469 loss
// 0.3121 2950 samples/s ETA 0:41"). When stdout is not a terminal (a log file, CI,
// lockstep-run's prefixed output) carriage returns make a mess, so it prints a
// plain line every `every_percent` percent instead.
#pragma once

#include <chrono>
#include <cstdint>
#include <string>

class ProgressBar {
 public:
  ProgressBar(std::string label, int64_t total_steps, int every_percent = 10);
  // After step `step` (1-based) with the running loss and the global samples done so far.
  void update(int64_t step, double loss, int64_t samples);
  // Ends the line (terminal) so the next output starts on a fresh one.
  void finish();

 private:
  std::string label_;
  int64_t total_;
  int every_percent_;
  bool tty_;
  int64_t next_report_ = 0;  // non-TTY: step of the next printed line
  std::chrono::steady_clock::time_point start_;
  std::chrono::steady_clock::time_point last_draw_{};
};
