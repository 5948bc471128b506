// compress/progress_thread.h (private): one persistent helper thread that runs one job at a
// time for its owner.
//
// The pipelined compressed allreduce overlaps its codec work with its transfers: the thread
// running the composite op makes the backend calls, this thread does the encoding and
// decoding of the rounds in between. A plan keeps one for its whole life instead of
// starting a std::thread per call (thread creation and teardown on every gradient bucket).
//
// Thread safety: post() and wait() are called by one thread at a time (the owner's call in
// flight); the destructor must not race with them.
#pragma once

#include <condition_variable>
#include <exception>
#include <functional>
#include <mutex>
#include <thread>

namespace lockstep::compress {

class ProgressThread {
 public:
  ProgressThread();   // starts the thread; it sleeps until a job is posted
  ~ProgressThread();  // runs a job still posted to its end, then stops and joins the thread
  ProgressThread(const ProgressThread&) = delete;
  ProgressThread& operator=(const ProgressThread&) = delete;

  // Hands `job` to the thread and returns at once. One job at a time: the previous one must
  // have been wait()ed for. What the job references must outlive the matching wait().
  void post(std::function<void()> job);
  // Blocks until the posted job returned (at once if none is pending); rethrows what it threw.
  void wait();

 private:
  void loop();

  std::mutex mu_;
  std::condition_variable cv_;
  std::function<void()> job_;  // posted, not yet taken by the thread
  bool pending_ = false;       // posted and not yet finished
  bool stop_ = false;
  std::exception_ptr error_;  // what the latest job threw
  std::thread thread_;        // last: starts once the members above exist
};

}  // namespace lockstep::compress
