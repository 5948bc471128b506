// lockstep/train/loss_plot.h: the loss-curve PNG, drawn by gnuplot (Debian gnuplot-nox).
#pragma once

#include <string>

namespace lockstep::train {

// Plots metrics_dir/loss-rank-R.csv for R < world_size (one line per rank) into `png`.
// Writes the gnuplot script next to the PNG (loss.gp) so the plot can be redrawn by hand.
// Returns false (and says why on stderr) when gnuplot is missing or fails: the plot is a
// convenience, never a reason to fail a training run.
bool plot_loss_curves(const std::string& metrics_dir, int world_size, const std::string& png);

}  // namespace lockstep::train
