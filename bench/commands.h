// The benchmarks of lockstep-bench, one subcommand each. Every benchmark is one program
// in two roles: the driver (what a user runs) starts worker jobs of this same program
// with --worker and the worker flags, collects their results and prints the tables.
#pragma once

#include <CLI/CLI.hpp>

#include <functional>

namespace lockstep::bench {

// A benchmark's subcommand (its flags bound to its options) and what runs it once the
// command line is parsed; returns the exit status.
struct Command {
  CLI::App* app;
  std::function<int()> run;
};

Command blas_command(CLI::App& bench);
Command checkpoint_command(CLI::App& bench);
Command collectives_command(CLI::App& bench);
Command compression_command(CLI::App& bench);
Command ctsm_faults_command(CLI::App& bench);
Command ddp_command(CLI::App& bench);
Command faults_command(CLI::App& bench);
Command fsdp_command(CLI::App& bench);
Command memory_command(CLI::App& bench);
Command optimizer_command(CLI::App& bench);
Command train_command(CLI::App& bench);
Command thin_links_command(CLI::App& bench);

// The option group of flags only workers take (their drivers pass them): CLI11 leaves
// the group "" out of --help.
inline constexpr const char* kWorkerOnly = "";

}  // namespace lockstep::bench
