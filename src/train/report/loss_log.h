// train/report/loss_log.h: the per-rank CSV of per-step training loss.
//
// Columns: step,epoch,loss,lr,step_s. Losses are written with 9 significant digits
// (round-trips a float32 exactly), so two runs can be compared bit for bit from their
// CSVs. Opening for a resumed run keeps only the rows up to the resume step: rows an
// interrupted run wrote after its last checkpoint are dropped, and the file then reads
// exactly like an uninterrupted run's.
#pragma once

#include <cstdint>
#include <cstdio>
#include <string>

namespace lockstep::train {

// Opens `path` for appending as a CSV with `header` (its first line): for a resumed run
// (resume_step > 0) the rows whose first column is at most resume_step are kept, the rest
// dropped; otherwise the file starts anew. Throws Error when it cannot be opened.
std::FILE* open_csv(const std::string& path, const std::string& header, int64_t resume_step);

class LossLog {
 public:
  LossLog(std::string path, int64_t resume_step);
  ~LossLog();
  LossLog(const LossLog&) = delete;
  LossLog& operator=(const LossLog&) = delete;
  void append(int64_t step, int64_t epoch, double loss, double lr, double step_s);

 private:
  std::string path_;
  std::FILE* f_ = nullptr;
};

}  // namespace lockstep::train
