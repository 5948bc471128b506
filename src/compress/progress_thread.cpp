// A persistent helper thread that runs one job at a time (see progress_thread.h).
#include "compress/progress_thread.h"

#include <lockstep/error.h>

#include <utility>

namespace lockstep::compress {

ProgressThread::ProgressThread() : thread_([this] { loop(); }) {}

ProgressThread::~ProgressThread() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  thread_.join();
}

void ProgressThread::post(std::function<void()> job) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    LOCKSTEP_CHECK(!pending_, "ProgressThread::post(): the previous job was not waited for");
    job_ = std::move(job);
    pending_ = true;
    error_ = nullptr;
  }
  cv_.notify_all();
}

void ProgressThread::wait() {
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [this] { return !pending_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void ProgressThread::loop() {
  std::unique_lock<std::mutex> lock(mu_);
  for (;;) {
    cv_.wait(lock, [this] { return stop_ || job_; });
    if (!job_) return;  // stopping, nothing posted
    std::function<void()> job = std::move(job_);
    job_ = nullptr;
    lock.unlock();
    std::exception_ptr error;
    try {
      job();
    } catch (...) {
      error = std::current_exception();
    }
    job = nullptr;  // its captures die here, before the owner hears the job is done
    lock.lock();
    error_ = error;
    pending_ = false;
    cv_.notify_all();
  }
}

}  // namespace lockstep::compress
