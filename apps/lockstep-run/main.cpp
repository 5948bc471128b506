// lockstep-run: starts and supervises the ranks of a data-parallel job (torchrun for C++).
// All logic lives in lockstep_launch; main only maps outcomes to exit codes.
#include <iostream>

#include "lockstep/launch/launcher.h"
#include "lockstep/launch/options.h"
#include "lockstep/launch/rank_env.h"

int main(int argc, char** argv) {
  using namespace lockstep::launch;
  LaunchOptions opt;
  try {
    opt = parse_args(std::vector<std::string>(argv + 1, argv + argc), current_environment());
  } catch (const UsageError& e) {
    // The message, then the usage line (the first line of --help).
    const std::string usage = usage_text();
    std::cerr << e.what() << "\n" << usage.substr(0, usage.find('\n')) << "\n";
    return kExitUsage;
  }
  if (opt.help) {
    std::cout << usage_text();
    return 0;
  }
  try {
    return run_launcher(opt);
  } catch (const std::exception& e) {
    std::cerr << e.what() << "\n";
    return kExitLauncherError;
  }
}
