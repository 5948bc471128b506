// lockstep-train CONFIG [--resume] [--generate-only] [--set section.key=value ...]
// The config-driven CTSM trainer (docs/trainer.md). Exit codes: 0 ok, 1 error,
// 2 configuration error, 3 quality gate missed (model not exported).
#include <lockstep/data/events_format.h>
#include <lockstep/train/trainer.h>

#include <CLI/CLI.hpp>

#include <iostream>

int main(int argc, char** argv) {
  using namespace lockstep::train;
  CLI::App app{"lockstep-train: config-driven CTSM training, backtest, quality gate and export"};
  std::string config;
  std::vector<std::string> overrides;
  TrainerOptions opt;
  app.add_option("config", config, "TOML configuration (docs/trainer.md)")->required();
  app.add_flag("--resume", opt.resume, "continue from the latest checkpoint in checkpoint.dir");
  app.add_flag("--generate-only", opt.generate_only, "generate the event log, then exit");
  app.add_option("--set", overrides, "override a config value: section.key=value (repeatable)");
  CLI11_PARSE(app, argc, argv);
  try {
    TrainConfig cfg = load_config(config, overrides);
    return Trainer(std::move(cfg), opt).run();
  } catch (const lockstep::ConfigError& e) {
    std::cerr << "lockstep-train: config error: " << e.what() << "\n";
    return kExitConfig;
  } catch (const lockstep::data::EventsFormatError& e) {
    std::cerr << "lockstep-train: data error: " << e.what() << "\n";
    return kExitError;
  } catch (const std::exception& e) {
    std::cerr << "lockstep-train: " << e.what() << "\n";
    return kExitError;
  }
}
