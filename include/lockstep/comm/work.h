// lockstep/comm/work.h: the handle of one asynchronous communication operation.
#pragma once

#include <lockstep/comm/types.h>
#include <lockstep/error.h>

#include <condition_variable>
#include <exception>
#include <memory>
#include <mutex>

namespace lockstep::comm {

// Returned by every ProcessGroup operation. Thread-safe. The operation runs on the
// group's communication thread; wait() blocks until it finished on this rank and
// rethrows its failure as CommError. wait() never blocks forever: if the op has
// been running longer than its timeout (plus a short grace for the backend to
// report itself), wait() throws CommError(Timeout).
class Work {
 public:
  Work(OpDesc desc, Millis timeout, CommContext base);

  bool is_completed() const;
  void wait();
  // The op's description (kind, seq, numel, dtype).
  const OpDesc& desc() const { return desc_; }
  // Seconds the op ran on the comm thread (0 until it finished).
  double duration_s() const;

  // --- used by the ProcessGroup's comm thread ---
  void mark_started();
  void finish(std::exception_ptr error = nullptr);

 private:
  const OpDesc desc_;
  const Millis timeout_;
  const CommContext base_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool done_ = false;
  Clock::time_point start_time_;
  Clock::time_point end_time_;
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace lockstep::comm
