// lockstep-train CONFIG [--resume] [--generate-only] [--yes] [--set section.key=value ...]
// The config-driven trainer (docs/trainer.md) with the workloads this program knows
// (the CTSM recommender, workloads/ctsm, and the byte-level language model, workloads/lm).
// Exit codes: 0 ok, 1 error,
// 2 configuration error or bad command line, 3 quality gate missed (model not exported).
#include <ctsm/workload.h>
#include <lm/workload.h>
#include <lockstep/data/data_error.h>
#include <lockstep/launch/cli.h>
#include <lockstep/launch/error_file.h>
#include <lockstep/train/config.h>
#include <lockstep/train/trainer.h>

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  using namespace lockstep::train;
  CLI::App app{"lockstep-train: config-driven training, evaluation, quality gate and export",
               "lockstep-train"};
  std::string config;
  std::vector<std::string> overrides;
  TrainerOptions opt;
  bool yes = false;
  app.add_option("config", config, "TOML configuration (docs/trainer.md)")->required();
  app.add_flag("--resume", opt.resume,
               "continue from the newest intact checkpoint in checkpoint.dir (implied when "
               "lockstep-run restarts the job)");
  app.add_flag("--generate-only", opt.generate_only,
               "prepare (generate) the workload's data, then exit");
  app.add_flag("--yes", yes, "go ahead with large data generation (above 1 GB) without asking");
  app.add_option("--set", overrides, "override a config value: section.key=value (repeatable)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  WorkloadRegistry registry;
  ctsm::register_workload(registry);  // run.workload = "ctsm"
  lm::register_workload(registry);    // run.workload = "lm"
  registry.set_default("ctsm");       // a config without run.workload (as before lm)
  try {
    LoadedConfig setup = load_config(config, registry, overrides);
    setup.config.run.assume_yes = yes;
    return Trainer(std::move(setup), opt).run();
  } catch (const lockstep::ConfigError& e) {
    // Also in this rank's error file, which lockstep-run's failure summary prints.
    lockstep::launch::record_error(std::string("config error: ") + e.what());
    std::cerr << "lockstep-train: config error: " << e.what() << "\n";
    return kExitConfig;
  } catch (const lockstep::data::DataError& e) {
    lockstep::launch::record_error(std::string("data error: ") + e.what());
    std::cerr << "lockstep-train: data error: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    lockstep::launch::record_error(e.what());
    std::cerr << "lockstep-train: " << e.what() << "\n";
    return kExitError;
  }
}
