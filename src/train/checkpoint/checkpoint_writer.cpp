#include "train/checkpoint/checkpoint_writer.h"

#include <lockstep/error.h>

#include <sched.h>
#include <signal.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>
#include <chrono>
#include <cstdlib>
#include <iostream>
#include <sstream>

namespace lockstep::train {
void run_on_idle_cycles() {
  sched_param none{};
  if (::sched_setscheduler(0, SCHED_IDLE, &none) == 0) return;
  ::setpriority(PRIO_PROCESS, pid_t(::syscall(SYS_gettid)), 19);  // where SCHED_IDLE is refused
}

bool test_point_named(const char* specs, const char* point, int64_t step, int who) {
  if (!specs) return false;
  std::istringstream all(specs);
  for (std::string spec; all >> spec;) {
    std::istringstream in(spec);
    std::string want, s, w;
    std::getline(in, want, ',');
    std::getline(in, s, ',');
    std::getline(in, w, ',');
    if (want == point && (s == "*" || s == std::to_string(step)) && w == std::to_string(who))
      return true;
  }
  return false;
}

void checkpoint_test_point(const char* point, int64_t step, int rank) {
  if (!test_point_named(std::getenv(kTestCheckpointKill), point, step, rank)) return;
  std::cerr << "lockstep-train: " << kTestCheckpointKill << ": rank " << rank << " killed at "
            << point << " of the save of step " << step << std::endl;
  ::kill(::getpid(), SIGKILL);
}

CheckpointWriter::CheckpointWriter(bool background) : background_(background) {
  const char* pause = std::getenv(kTestCheckpointPauseMs);
  pause_ms_ = pause ? std::atoi(pause) : 0;
  if (background_) thread_ = std::thread([this] { loop(); });
}

CheckpointWriter::~CheckpointWriter() {
  if (!background_) return;
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
  if (!error_.empty())
    std::cerr << "lockstep-train: warning: the last background checkpoint write failed: " << error_
              << "\n";
}

void CheckpointWriter::execute(const Job& job) {
  std::string err;
  try {
    job();
  } catch (const std::exception& e) {
    err = e.what();
  } catch (...) {
    err = "unknown exception";
  }
  std::lock_guard<std::mutex> lock(mu_);
  if (!err.empty()) error_ = err;
  busy_ = false;
}

void CheckpointWriter::run(Job job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOCKSTEP_CHECK(!busy_, "CheckpointWriter::run: a job is in flight (wait() first)");
    busy_ = true;
    if (background_) job_ = std::move(job);
  }
  if (!background_) {
    execute(job);  // NOLINT(bugprone-use-after-move): moved above only when background_
    return;
  }
  cv_.notify_all();
}

void CheckpointWriter::loop() {
  run_on_idle_cycles();
  for (;;) {
    Job job;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [this] { return stop_ || job_; });
      if (stop_) return;
      job = std::move(job_);
      job_ = nullptr;
    }
    if (pause_ms_ > 0) std::this_thread::sleep_for(std::chrono::milliseconds(pause_ms_));
    execute(job);
    cv_.notify_all();
  }
}

CheckpointWriter::State CheckpointWriter::state() const {
  std::lock_guard<std::mutex> lock(mu_);
  if (busy_) return State::kBusy;
  return error_.empty() ? State::kIdle : State::kFailed;
}

CheckpointWriter::State CheckpointWriter::wait() {
  {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [this] { return !busy_; });
  }
  return state();
}

std::string CheckpointWriter::error() const {
  std::lock_guard<std::mutex> lock(mu_);
  return error_;
}

void CheckpointWriter::clear_error() {
  std::lock_guard<std::mutex> lock(mu_);
  error_.clear();
}

}  // namespace lockstep::train
