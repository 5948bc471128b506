#include <lockstep/train/loss_plot.h>

#include <lockstep/train/atomic_file.h>

#include <cstdlib>
#include <filesystem>
#include <iostream>
#include <sstream>

namespace lockstep::train {

bool plot_loss_curves(const std::string& metrics_dir, int world_size, const std::string& png) {
  if (std::system("command -v gnuplot >/dev/null 2>&1") != 0) {
    std::cerr << "[lockstep-train] gnuplot not found (install gnuplot-nox); no loss curve PNG\n";
    return false;
  }
  const std::string script = std::filesystem::path(png).replace_extension(".gp").string();
  std::ostringstream gp;
  gp << "set terminal pngcairo size 900,500\nset output '" << png << "'\n"
     << "set datafile separator ','\nset key autotitle columnhead\nset xlabel 'step'\nset ylabel 'training loss (BCE)'\n"
     << "set grid\nplot ";
  for (int r = 0; r < world_size; ++r)
    gp << (r ? ", " : "") << "'" << metrics_dir << "/loss-rank-" << r << ".csv' using 1:3 with lines title 'rank "
       << r << "'";
  gp << "\n";
  write_file_atomic(script, gp.str());
  const std::string cmd = "gnuplot '" + script + "' 2>&1";
  if (std::system(cmd.c_str()) != 0) {
    std::cerr << "[lockstep-train] gnuplot failed on " << script << "; no loss curve PNG\n";
    return false;
  }
  return true;
}

}  // namespace lockstep::train
