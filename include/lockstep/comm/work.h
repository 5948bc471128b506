// lockstep/comm/work.h: the handle of one asynchronous communication operation.
#pragma once

#include <lockstep/comm/types.h>
#include <lockstep/error.h>

#include <condition_variable>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>

namespace lockstep::comm {

// Returned by every ProcessGroup operation. Thread-safe. The operation runs on the
// group's communication thread, or on the thread that waits for it if that thread
// comes first and the comm thread has nothing else to do; wait() blocks until it
// finished on this rank and rethrows its failure as CommError. Once the op runs,
// wait() is bounded: past its timeout (plus a short grace for the backend to report
// itself) wait() throws CommError(Timeout) and breaks the group, so the ops queued
// behind it (each bounded the same way) fail at once instead of waiting.
class Work {
 public:
  // on_timeout: called (without locks held) when wait() gives up on the op, so the group
  // can break itself: the op may still be running and must not be followed by others.
  // run_here: called by wait() (without locks held) while the op has not started: the
  // group may run it on the waiting thread instead of handing it to its comm thread.
  Work(OpDesc desc, Millis timeout, CommContext base,
       std::function<void(std::exception_ptr)> on_timeout = {},
       std::function<void(Work&)> run_here = {});

  bool is_completed() const;
  void wait();
  // The op's description (kind, seq, numel, dtype).
  const OpDesc& desc() const { return desc_; }
  // Run by every successful wait() on the waiting thread, after the op finished (device
  // tensors: makes the waiter's current stream wait for the op's copies, never the host).
  // Set before the Work is handed out.
  void on_wait(std::function<void()> f) { on_wait_ = std::move(f); }

  // --- used by the ProcessGroup's comm thread ---
  void mark_started();
  void finish(std::exception_ptr error = nullptr);

 private:
  const OpDesc desc_;
  const Millis timeout_;
  const CommContext base_;
  const std::function<void(std::exception_ptr)> on_timeout_;
  const std::function<void(Work&)> run_here_;
  std::function<void()> on_wait_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  bool started_ = false;
  bool done_ = false;
  Clock::time_point start_time_;  // set by mark_started(): wait()'s timeout runs from it
  std::exception_ptr error_;
};

using WorkPtr = std::shared_ptr<Work>;

}  // namespace lockstep::comm
