// lockstep-train CONFIG [--resume] [--generate-only] [--set section.key=value ...]
// The config-driven trainer (docs/trainer.md) with the workloads this program knows
// (today: the CTSM recommender, workloads/ctsm). Exit codes: 0 ok, 1 error,
// 2 configuration error, 3 quality gate missed (model not exported).
#include <ctsm/workload.h>
#include <lockstep/data/data_error.h>
#include <lockstep/train/config.h>
#include <lockstep/train/trainer.h>

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  using namespace lockstep::train;
  CLI::App app{"lockstep-train: config-driven training, evaluation, quality gate and export"};
  std::string config;
  std::vector<std::string> overrides;
  TrainerOptions opt;
  app.add_option("config", config, "TOML configuration (docs/trainer.md)")->required();
  app.add_flag("--resume", opt.resume, "continue from the latest checkpoint in checkpoint.dir");
  app.add_flag("--generate-only", opt.generate_only,
               "prepare (generate) the workload's data, then exit");
  app.add_option("--set", overrides, "override a config value: section.key=value (repeatable)");
  CLI11_PARSE(app, argc, argv);
  WorkloadRegistry registry;
  ctsm::register_workload(registry);  // run.workload = "ctsm" (the default: the only one)
  try {
    LoadedConfig setup = load_config(config, registry, overrides);
    return Trainer(std::move(setup), opt).run();
  } catch (const lockstep::ConfigError& e) {
    std::cerr << "lockstep-train: config error: " << e.what() << "\n";
    return kExitConfig;
  } catch (const lockstep::data::DataError& e) {
    std::cerr << "lockstep-train: data error: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "lockstep-train: " << e.what() << "\n";
    return kExitError;
  }
}
