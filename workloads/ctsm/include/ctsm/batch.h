// ctsm/batch.h: from client event histories to CTSM input tensors.
//
// A training example is one client's events before the cutoff (the last max_len): every
// event is context (a key) and every shipped item is also a target (its kept/returned
// outcome is the label), predicted only from strictly earlier events. An evaluation
// (backtest) example is the client's events before the cutoff as context plus the items
// shipped in [cutoff, horizon) as targets that are not context: they are scored from
// the pre-cutoff history alone, as a model published at the cutoff would score them.
#pragma once

#include <ctsm/events_format.h>

#include <torch/torch.h>

#include <cstdint>
#include <vector>

namespace ctsm {

inline constexpr int kCtsmTimeFeatures = 2;
// Later than any event, small enough that time differences cannot overflow.
inline constexpr int64_t kCtsmPadTime = int64_t(1) << 60;

// One position of an example (compact: examples wait in shuffle buffers).
struct CtsmPosition {
  int64_t time_s = 0;
  uint32_t item = 0;  // 0 = none
  uint8_t type = 0;   // EventType; 0 = hidden (targets that are not context)
  uint8_t feedback = 0;
  bool is_key = false;
  bool is_target = false;
  float gap_days = 0;  // days since the latest earlier context event (0 for the first)
  float p_true = 0;    // generator ground truth, for the oracle metric only
};

struct CtsmExample {
  uint64_t client_id = 0;
  std::vector<CtsmPosition> positions;  // time order
};

// Padded tensors of a batch (B examples, L positions).
struct CtsmBatch {
  torch::Tensor item;       // [B,L] int64, 0 = none/pad
  torch::Tensor type;       // [B,L] int64, 0 = hidden/pad
  torch::Tensor feedback;   // [B,L] int64
  torch::Tensor time_feat;  // [B,L,kCtsmTimeFeatures] float
  torch::Tensor time_s;     // [B,L] int64: seconds since the data set's epoch (pads: kCtsmPadTime)
  torch::Tensor is_key;     // [B,L] bool
  torch::Tensor is_target;  // [B,L] bool
  torch::Tensor label;      // [B,L] float: 1 = kept
  torch::Tensor p_true;     // [B,L] float
};

CtsmExample make_train_example(const ClientHistory& c, int64_t cutoff_s, int max_len);
CtsmExample make_eval_example(const ClientHistory& c, int64_t cutoff_s, int64_t horizon_end_s,
                              int max_len, int max_candidates);
// Pads to the longest example (at least 1 position).
CtsmBatch collate(const std::vector<CtsmExample>& examples);

}  // namespace ctsm
