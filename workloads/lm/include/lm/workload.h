// lm/workload.h: the byte-level language model as a lockstep::train::Workload.
//
//   lockstep::train::WorkloadRegistry registry;
//   lm::register_workload(registry);            // name "lm"
//
// Config: [data], [model] and eval.batch_size / max_tokens / sample_* (lm/config.h,
// workloads/lm/README.md). Data: the corpus (the KJV of Debian's bible-kjv-text unless
// data.corpus names a file), loaded by every rank, checked equal across ranks (one
// broadcast of a fingerprint), split into training and held-out blocks (lm/corpus.h).
// Training: windows of context + 1 bytes of the training text, shuffled per epoch and dealt
// to the ranks (lm/batch_stream.h); loss: mean next-byte cross-entropy. Evaluation: mean
// cross-entropy over the held-out text in non-overlapping windows (each rank scores every
// P-th window; sums combined over ranks), reported as perplexity = exp(cross-entropy),
// with bits per byte and a generated sample; gate metrics "perplexity" and
// "bits_per_byte", both lower-is-better. Export: export/lm.pt and export/model_card.json.
#pragma once

#include <lm/config.h>
#include <lm/corpus.h>
#include <lm/model.h>

#include <lockstep/train/workload.h>

#include <memory>
#include <string>
#include <vector>

namespace lm {

class LmWorkload : public lockstep::train::Workload {
 public:
  void declare_config(lockstep::train::ConfigSchema& schema) override { cfg_.declare(schema); }
  void validate_config(const std::string& source) override;
  std::vector<std::string> gate_metrics() const override { return {"perplexity", "bits_per_byte"}; }
  lockstep::train::GateRule gate_rule(const std::string& metric) const override;

  void prepare_data(const lockstep::train::RunContext& ctx) override;
  std::vector<int64_t> examples_per_rank(const lockstep::train::RunContext& ctx) override;

  std::shared_ptr<torch::nn::Module> build_model(const lockstep::train::RunContext& ctx) override;
  std::string model_name() const override { return "byte-level decoder-only transformer"; }
  bool supports_activation_checkpointing() const override { return true; }

  std::unique_ptr<lockstep::train::BatchStream> train_batches(
      const lockstep::train::RunContext& ctx) override;
  torch::Tensor loss(const lockstep::train::Batch& batch) override;

  lockstep::train::EvalResult evaluate(const lockstep::train::RunContext& ctx) override;
  lockstep::train::ExportResult export_model(const lockstep::train::ExportInfo& info) override;

  const LmConfig& config() const { return cfg_; }

 private:
  void check_sizes(const lockstep::train::RunContext& ctx) const;
  std::string data_json() const;
  LmConfig cfg_;
  std::string source_;  // the config file, for errors
  // After prepare_data: the corpus's size and fingerprint, and its two sides.
  int64_t corpus_bytes_ = 0;
  uint64_t corpus_fingerprint_ = 0;
  int64_t blocks_ = 0, heldout_blocks_ = 0;
  std::shared_ptr<const std::string> train_, heldout_;
  Lm model_{nullptr};  // after build_model
};

// Registers LmWorkload as "lm". Explicit, so no linker can drop it.
void register_workload(lockstep::train::WorkloadRegistry& registry);

}  // namespace lm
