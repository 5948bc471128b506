// lockstep-bench: benchmarks that measure lockstep beside its peers in the same run.
//
//   lockstep-bench collectives|compression|ddp|fsdp|train|optimizer|memory|blas|checkpoint|
//                  thin-links|faults|ctsm-faults
//                  [OPTIONS]
//   (--help on each)
//
// Exit status: 0 ok, 1 a benchmark failed, 2 a usage error (unknown flag, bad value).
#include "commands.h"

#include <lockstep/launch/cli.h>

#include <cstdio>
#include <exception>
#include <iostream>
#include <vector>

int main(int argc, char** argv) {
  using namespace lockstep::bench;
  CLI::App app{"lockstep-bench: benchmarks that measure lockstep beside its peers in the same run",
               "lockstep-bench"};
  app.require_subcommand(1);
  const std::vector<Command> commands{
      collectives_command(app), compression_command(app), ddp_command(app),
      fsdp_command(app),        train_command(app),       optimizer_command(app),
      memory_command(app),      blas_command(app),        checkpoint_command(app),
      thin_links_command(app),  faults_command(app),      ctsm_faults_command(app)};
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  try {
    for (const auto& c : commands)
      if (c.app->parsed()) return c.run();
    return 2;  // unreachable: require_subcommand(1)
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-bench: %s\n", e.what());
    return 1;
  }
}
