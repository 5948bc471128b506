#include "train/report/loss_plot.h"

#include <lockstep/train/atomic_file.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <sstream>

namespace lockstep::train {
namespace {

constexpr Rgb kAxis{0, 0, 0}, kGrid{225, 225, 225}, kLabel{60, 60, 60};
constexpr int kLeft = 80, kRight = 20, kTop = 20, kBottom = 50;  // plot-area margins

struct Range {
  double lo, hi;
};

// About `n` round tick values (1, 2 or 5 x 10^k apart) inside [lo, hi].
std::vector<double> ticks(Range r, int n) {
  const double raw = (r.hi - r.lo) / n, mag = std::pow(10.0, std::floor(std::log10(raw)));
  const double step = raw / mag < 1.5   ? mag
                      : raw / mag < 3.5 ? 2 * mag
                      : raw / mag < 7.5 ? 5 * mag
                                        : 10 * mag;
  std::vector<double> out;
  for (double t = std::ceil(r.lo / step) * step; t <= r.hi + 1e-9 * step; t += step)
    out.push_back(t);
  return out;
}

std::string label(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", std::abs(v) < 1e-12 ? 0.0 : v);
  return buf;
}

// The data's extent, the loss axis padded by 5% (and widened when flat).
std::pair<Range, Range> extent(const std::vector<LossSeries>& series) {
  Range x{1e300, -1e300}, y{1e300, -1e300};
  for (const auto& s : series)
    for (const auto& [step, loss] : s) {
      if (!std::isfinite(loss)) continue;
      x = {std::min(x.lo, step), std::max(x.hi, step)};
      y = {std::min(y.lo, loss), std::max(y.hi, loss)};
    }
  if (x.lo > x.hi) x = y = {0, 1};
  if (x.hi - x.lo < 1) x.hi = x.lo + 1;
  const double pad = y.hi - y.lo > 0 ? 0.05 * (y.hi - y.lo) : std::max(0.5, 0.05 * std::abs(y.lo));
  return {x, {y.lo - pad, y.hi + pad}};
}

class Chart {
 public:
  Chart(RgbImage& img, Range x, Range y) : img_(img), x_(x), y_(y) {}
  int px(double v) const {
    return kLeft + int(std::lround((v - x_.lo) / (x_.hi - x_.lo) * (w() - 1)));
  }
  int py(double v) const {
    return kTop + int(std::lround((y_.hi - v) / (y_.hi - y_.lo) * (h() - 1)));
  }

  void axes(const ChartLabels& labels) {
    for (double t : ticks(x_, 8)) {
      img_.line(px(t), kTop, px(t), kTop + h() - 1, kGrid);
      img_.text(px(t) - RgbImage::text_width(label(t)) / 2, kTop + h() + 8, label(t), kLabel);
    }
    for (double t : ticks(y_, 6)) {
      img_.line(kLeft, py(t), kLeft + w() - 1, py(t), kGrid);
      img_.text(kLeft - 8 - RgbImage::text_width(label(t)), py(t) - 5, label(t), kLabel);
    }
    img_.line(kLeft, kTop, kLeft, kTop + h() - 1, kAxis);
    img_.line(kLeft, kTop + h() - 1, kLeft + w() - 1, kTop + h() - 1, kAxis);
    img_.text(kLeft + w() / 2 - RgbImage::text_width(labels.x) / 2, kTop + h() + 28, labels.x,
              kAxis);
    img_.text(8, kTop + 2, labels.y, kAxis);
  }

  void series(const LossSeries& s, Rgb c) {
    for (size_t i = 1; i < s.size(); ++i)
      if (std::isfinite(s[i - 1].second) && std::isfinite(s[i].second))
        img_.line(px(s[i - 1].first), py(s[i - 1].second), px(s[i].first), py(s[i].second), c, 2);
    if (s.size() == 1)
      img_.fill_rect(px(s[0].first) - 1, py(s[0].second) - 1, px(s[0].first) + 1,
                     py(s[0].second) + 1, c);
  }

  void legend(const std::vector<std::string>& names, bool bottom) {
    int widest = 0;
    for (const auto& n : names) widest = std::max(widest, RgbImage::text_width(n));
    const int top = bottom ? kTop + h() - 10 - int(names.size()) * 18 : kTop + 10;
    for (size_t i = 0; i < names.size(); ++i) {
      const std::string& name = names[i];
      const int y = top + int(i) * 18, x = kLeft + w() - 30 - widest;
      img_.line(x - 28, y + 5, x - 8, y + 5, series_color(i), 3);
      img_.text(x, y, name, kLabel);
    }
  }

 private:
  int w() const { return img_.width() - kLeft - kRight; }
  int h() const { return img_.height() - kTop - kBottom; }
  RgbImage& img_;
  Range x_, y_;
};

// step,epoch,loss,... rows after the header line.
LossSeries read_series(const std::string& path) {
  LossSeries s;
  std::ifstream in(path);
  std::string line;
  std::getline(in, line);  // header
  while (std::getline(in, line)) {
    double step = 0, epoch = 0, loss = 0;
    if (std::sscanf(line.c_str(), "%lf,%lf,%lf", &step, &epoch, &loss) == 3)
      s.emplace_back(step, loss);
  }
  return s;
}

}  // namespace

Rgb series_color(size_t index) {
  static const Rgb palette[] = {{31, 119, 180},  {255, 127, 14}, {44, 160, 44},   {214, 39, 40},
                                {148, 103, 189}, {140, 86, 75},  {227, 119, 194}, {127, 127, 127}};
  return palette[index % (sizeof palette / sizeof palette[0])];
}

RgbImage render_line_chart(const std::vector<LossSeries>& series, const ChartLabels& labels,
                           int width, int height) {
  RgbImage img(width, height);
  const auto [x, y] = extent(series);
  Chart chart(img, x, y);
  chart.axes(labels);
  for (size_t i = 0; i < series.size(); ++i) chart.series(series[i], series_color(i));
  if (!labels.names.empty()) chart.legend(labels.names, labels.legend_at_bottom);
  return img;
}

RgbImage render_loss_plot(const std::vector<LossSeries>& series, int width, int height) {
  ChartLabels labels;
  if (series.size() > 1)
    for (size_t i = 0; i < series.size(); ++i) labels.names.push_back("rank " + std::to_string(i));
  return render_line_chart(series, labels, width, height);
}

bool plot_loss_curves(const std::string& metrics_dir, int world_size, const std::string& png) {
  std::vector<LossSeries> series;
  size_t points = 0;
  for (int r = 0; r < world_size; ++r) {
    series.push_back(read_series(metrics_dir + "/loss-rank-" + std::to_string(r) + ".csv"));
    points += series.back().size();
  }
  if (points == 0) {
    std::cerr << "[lockstep-train] no loss values in " << metrics_dir << "; no loss curve PNG\n";
    return false;
  }
  try {
    write_file_atomic(png, encode_png(render_loss_plot(series)));
  } catch (const std::exception& e) {
    std::cerr << "[lockstep-train] cannot write the loss curve: " << e.what() << "\n";
    return false;
  }
  return true;
}

}  // namespace lockstep::train
