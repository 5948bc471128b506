// ctsm/workload.h: the CTSM recommender as a lockstep::train::Workload.
//
//   lockstep::train::WorkloadRegistry registry;
//   ctsm::register_workload(registry);            // name "ctsm"
//
// Config: [data], [model] and eval.k / eval.bins / eval.batch_size (ctsm/config.h,
// workloads/ctsm/README.md). Data: the client event log in data.dir, generated from
// [data] when missing or stale (GENERATOR.txt holds the generator's fingerprint; each
// rank writes shards s with s % world == rank). Training: each rank streams its own part
// of the shards (EventStream), one example per client, events before the cutoff; loss:
// mean binary cross-entropy over the shipped items (CtsmImpl::loss). Evaluation: the
// backtest on items shipped in [cutoff, cutoff + horizon) from each client's pre-cutoff
// history, AUC / recall@k / log loss combined over ranks (BacktestMetrics); gate metrics
// "auc" and "recall_at_k". Export: export/ctsm.pt and export/model_card.json.
#pragma once

#include <ctsm/config.h>
#include <ctsm/model.h>

#include <lockstep/train/workload.h>

#include <string>
#include <vector>

namespace ctsm {

class CtsmWorkload : public lockstep::train::Workload {
 public:
  void declare_config(lockstep::train::ConfigSchema& schema) override { cfg_.declare(schema); }
  void validate_config(const std::string& source) override;
  std::vector<std::string> gate_metrics() const override { return {"auc", "recall_at_k"}; }

  void prepare_data(const lockstep::train::RunContext& ctx) override;
  std::vector<int64_t> examples_per_rank(const lockstep::train::RunContext& ctx) override;

  std::shared_ptr<torch::nn::Module> build_model(const lockstep::train::RunContext& ctx) override;
  std::string model_name() const override { return "CTSM"; }
  bool supports_activation_checkpointing() const override { return true; }

  std::unique_ptr<lockstep::train::BatchStream> train_batches(
      const lockstep::train::RunContext& ctx) override;
  torch::Tensor loss(const lockstep::train::Batch& batch) override;

  lockstep::train::EvalResult evaluate(const lockstep::train::RunContext& ctx) override;
  lockstep::train::ExportResult export_model(const lockstep::train::ExportInfo& info) override;

  const CtsmConfig& config() const { return cfg_; }

 private:
  std::vector<std::string> missing_shards() const;
  bool need_generate(const lockstep::train::RunContext& ctx) const;
  CtsmConfig cfg_;
  std::string source_;               // the config file, for errors
  std::vector<std::string> shards_;  // after prepare_data
  Ctsm model_{nullptr};              // after build_model
};

// Registers CtsmWorkload as "ctsm". Explicit, so no linker can drop it.
void register_workload(lockstep::train::WorkloadRegistry& registry);

}  // namespace ctsm
