// train/report/loss_plot.h: the loss-curve PNG, drawn in-process (png_image.h).
#pragma once

#include "train/report/png_image.h"

#include <string>
#include <utility>
#include <vector>

namespace lockstep::train {

// One line of the chart: (step, loss) points in step order.
using LossSeries = std::vector<std::pair<double, double>>;

// The line colours of the series, in order (then repeating).
Rgb series_color(size_t index);

// What a line chart says: the axes' names and the series' names (legend; none: no legend).
struct ChartLabels {
  std::string x = "step", y = "loss";
  std::vector<std::string> names;
  bool legend_at_bottom = false;  // bottom right instead of top right (for rising curves)
};

// A width x height chart: one line per series (series_color(i)), axes with tick labels,
// light grid lines, and a legend. The axes span the data (the vertical one padded by 5%).
RgbImage render_line_chart(const std::vector<LossSeries>& series, const ChartLabels& labels,
                           int width = 900, int height = 500);

// The loss chart: "step" across, "loss" up, a legend "rank i" when there is more than one
// series.
RgbImage render_loss_plot(const std::vector<LossSeries>& series, int width = 900, int height = 500);

// Plots metrics_dir/loss-rank-R.csv for R < world_size (columns step,epoch,loss,...), one
// line per rank, into `png` (written atomically). Returns false (and says why on stderr)
// when there is nothing to plot or the file cannot be written: the plot is a convenience,
// never a reason to fail a training run.
bool plot_loss_curves(const std::string& metrics_dir, int world_size, const std::string& png);

}  // namespace lockstep::train
