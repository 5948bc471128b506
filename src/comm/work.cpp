#include <lockstep/comm/work.h>

namespace lockstep::comm {

namespace {
// Time the backend gets past the op's timeout to report the failure itself (with
// its better diagnosis) before wait() gives up on it.
constexpr Millis kReportGrace{2000};
}  // namespace

Work::Work(OpDesc desc, Millis timeout, CommContext base,
           std::function<void(std::exception_ptr)> on_timeout, std::function<void(Work&)> run_here)
    : desc_(desc),
      timeout_(timeout),
      base_(std::move(base)),
      on_timeout_(std::move(on_timeout)),
      run_here_(std::move(run_here)) {}

bool Work::is_completed() const {
  std::lock_guard<std::mutex> lock(mu_);
  return done_;
}

void Work::mark_started() {
  std::lock_guard<std::mutex> lock(mu_);
  started_ = true;
  start_time_ = Clock::now();
}

void Work::finish(std::exception_ptr error) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    done_ = true;
    error_ = std::move(error);
  }
  cv_.notify_all();
}

void Work::wait() {
  if (run_here_) {
    bool started;
    {
      std::lock_guard<std::mutex> lock(mu_);
      started = started_;
    }
    if (!started) run_here_(*this);  // saves two thread hand-offs when it can
  }
  std::unique_lock<std::mutex> lock(mu_);
  // Queued ops wait for the ones ahead of them, each bounded by its own timeout;
  // once this one runs, it gets its timeout plus the report grace.
  while (!done_) {
    if (!started_) {
      cv_.wait_for(lock, Millis(50));
      continue;
    }
    const auto limit = start_time_ + timeout_ + kReportGrace;
    if (cv_.wait_until(lock, limit, [&] { return done_; })) break;
    CommContext ctx = base_;
    ctx.elapsed_s = std::chrono::duration<double>(Clock::now() - start_time_).count();
    ctx.timeout_s = std::chrono::duration<double>(timeout_).count();
    auto err = std::make_exception_ptr(
        CommError(CommError::Kind::Timeout, ctx,
                  "the operation did not complete; a peer may be stuck or dead "
                  "(raise the timeout with LOCKSTEP_TIMEOUT_S if it is just slow)"));
    lock.unlock();
    if (on_timeout_) on_timeout_(err);
    std::rethrow_exception(err);
  }
  if (error_) std::rethrow_exception(error_);
  lock.unlock();
  if (on_wait_) on_wait_();
}

}  // namespace lockstep::comm
