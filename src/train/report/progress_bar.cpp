#include <lockstep/train/progress_bar.h>

#include <unistd.h>
#include <cmath>
#include <cstdio>

namespace lockstep::train {

std::string format_duration(double s) {
  if (!(s >= 0) || s > 1e7) return "--:--";
  const int64_t t = std::llround(s);
  char buf[32];
  if (t >= 3600)
    std::snprintf(buf, sizeof buf, "%lld:%02lld:%02lld", (long long)(t / 3600),
                  (long long)(t / 60 % 60), (long long)(t % 60));
  else
    std::snprintf(buf, sizeof buf, "%02lld:%02lld", (long long)(t / 60), (long long)(t % 60));
  return buf;
}

ProgressBar::ProgressBar(int64_t total, int64_t start, bool enabled)
    : total_(total),
      start_(start),
      enabled_(enabled),
      tty_(::isatty(2)),
      t0_(std::chrono::steady_clock::now()) {}

void ProgressBar::update(int64_t done, const std::string& note) {
  if (!enabled_ || total_ <= 0) return;
  const auto now = std::chrono::steady_clock::now();
  const double el = std::chrono::duration<double>(now - t0_).count();
  const double rate = done > start_ ? double(done - start_) / el : 0;
  const double eta = rate > 0 ? double(total_ - done) / rate : -1;
  const int decile = int(10 * done / total_);
  if (tty_) {
    if (done < total_ && std::chrono::duration<double>(now - last_draw_).count() < 0.2) return;
    last_draw_ = now;
    const int width = 30, fill = int(width * done / total_);
    std::fprintf(stderr, "\r[%s%s] %lld/%lld %.1f it/s ETA %s %s   ",
                 std::string(fill, '#').c_str(), std::string(width - fill, ' ').c_str(),
                 (long long)done, (long long)total_, rate, format_duration(eta).c_str(),
                 note.c_str());
  } else {
    if (decile == last_decile_) return;
    last_decile_ = decile;
    std::fprintf(stderr, "progress %3d%% step %lld/%lld %.1f it/s ETA %s %s\n", 10 * decile,
                 (long long)done, (long long)total_, rate, format_duration(eta).c_str(),
                 note.c_str());
  }
  std::fflush(stderr);
}

void ProgressBar::finish() {  // NOLINT(readability-make-member-function-const): ends the bar
  if (enabled_ && tty_) std::fprintf(stderr, "\n");
}

}  // namespace lockstep::train
