// ctsm/backtest_metrics.h: AUC, recall@k and log loss over all ranks.
//
// Each rank scores only its own clients, so metrics must be combined across ranks
// without gathering every score: AUC comes from per-rank histograms of predicted
// probability for positives and negatives (`bins` equal-width bins on [0,1]), summed
// with one allreduce; ties inside a bin count one half, so the error is bounded by the
// mass sharing a bin (under 1e-3 at 4096 bins for these data). recall@k is a per-client
// quantity (kept items among the client's top-k scored candidates / min(k, kept)) whose
// sums allreduce exactly. The same is computed from the generator's true probabilities
// ("oracle"): the best any model could reach on these events.
#pragma once

#include <ctsm/batch.h>
#include <lockstep/comm/process_group.h>

#include <torch/torch.h>

#include <memory>

namespace ctsm {

struct BacktestResult {
  double auc = 0, recall_at_k = 0, logloss = 0;
  double oracle_auc = 0, oracle_recall_at_k = 0;
  int64_t positives = 0, negatives = 0, clients = 0;
  double value(const std::string& metric) const { return metric == "auc" ? auc : recall_at_k; }
};

class BacktestMetrics {
 public:
  BacktestMetrics(int64_t bins, int64_t k);
  // logits [B,L] for the batch; targets are batch.is_target (one client per row).
  void add(const torch::Tensor& logits, const CtsmBatch& batch);
  // Sums the statistics over the group (nullptr or size 1: local) and computes the metrics.
  BacktestResult reduce(lockstep::comm::ProcessGroup* group) const;

 private:
  int64_t bins_, k_;
  torch::Tensor hist_;  // [4, bins] float64: model pos, model neg, oracle pos, oracle neg
  double sums_[5] = {0, 0, 0, 0,
                     0};  // logloss sum, recall hits, recall denom, oracle hits, clients
};

}  // namespace ctsm
