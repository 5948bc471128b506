#include "train/report/loss_log.h"

#include <lockstep/error.h>
#include <lockstep/train/atomic_file.h>

#include <filesystem>
#include <sstream>

namespace lockstep::train {

std::FILE* open_csv(const std::string& path, const std::string& header, int64_t resume_step) {
  std::string kept = header + "\n";
  if (resume_step > 0 && std::filesystem::exists(path)) {
    std::istringstream in(read_file(path));
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line))
      if (!line.empty() && std::stoll(line.substr(0, line.find(','))) <= resume_step)
        kept += line + "\n";
  }
  write_file_atomic(path, kept);
  std::FILE* f = std::fopen(path.c_str(), "a");
  if (!f) throw Error(path + ": cannot open for appending");
  return f;
}

LossLog::LossLog(std::string path, int64_t resume_step) : path_(std::move(path)) {
  f_ = open_csv(path_, "step,epoch,loss,lr,step_s", resume_step);
}

LossLog::~LossLog() {
  if (f_) std::fclose(f_);
}

void LossLog::append(int64_t step, int64_t epoch, double loss, double lr, double step_s) {
  std::fprintf(f_, "%lld,%lld,%.9g,%.9g,%.6f\n", (long long)step, (long long)epoch, loss, lr,
               step_s);
  std::fflush(f_);
}

}  // namespace lockstep::train
