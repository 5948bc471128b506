#include "progress.h"

#include <algorithm>
#include <cstdio>
#include <unistd.h>

namespace {
std::string clock_time(double s) {
  const int t = static_cast<int>(s + 0.5);
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%d:%02d", t / 60, t % 60);
  return buf;
}
}  // namespace

ProgressBar::ProgressBar(std::string label, int64_t total_steps, int every_percent)
    : label_(std::move(label)),
      total_(std::max<int64_t>(total_steps, 1)),
      every_percent_(std::clamp(every_percent, 1, 100)),
      tty_(isatty(STDOUT_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {
  next_report_ = std::max<int64_t>(1, total_ * every_percent_ / 100);
}

void ProgressBar::update(int64_t step, double loss, int64_t samples) {
  const auto now = std::chrono::steady_clock::now();
  const bool last = step >= total_;
  if (tty_) {
    // Redrawing costs a write syscall; ten times a second is plenty for the eye.
    if (!last && now - last_draw_ < std::chrono::milliseconds(100)) return;
  } else {
    if (!last && step < next_report_) return;
    while (next_report_ <= step) next_report_ += std::max<int64_t>(1, total_ * every_percent_ / 100);
  }
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? samples / elapsed : 0;
  const double eta = step > 0 ? elapsed * (total_ - step) / step : 0;
  char stats[128];
  std::snprintf(stats, sizeof(stats), "%lld/%lld loss %.4f %.0f samples/s ETA %s",
                static_cast<long long>(step), static_cast<long long>(total_), loss, rate,
                clock_time(eta).c_str());
  if (tty_) {
    constexpr int kWidth = 24;
    const int filled = static_cast<int>(kWidth * step / total_);
    std::string bar(static_cast<size_t>(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(static_cast<size_t>(kWidth - filled - 1), ' ');
    // \033[K clears what a longer previous line left behind.
    std::printf("\r%s [%s] %s\033[K", label_.c_str(), bar.c_str(), stats);
  } else {
    std::printf("%s %3d%% %s\n", label_.c_str(), static_cast<int>(100 * step / total_), stats);
  }
  std::fflush(stdout);
}

void ProgressBar::finish() {
  if (tty_) std::printf("\n");
  std::fflush(stdout);
}
