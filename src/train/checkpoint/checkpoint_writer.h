// The background writer of asynchronous checkpoints (docs/checkpoints.md, "Asynchronous
// saves"): one persistent thread, started with the Checkpointer and stopped with it, that
// runs one job at a time (serialize, checksum, write, fsync, rename: local file work, never
// a collective). In inline mode (checkpoint.mode = "sync") jobs run on the caller's thread.
#pragma once

#include <condition_variable>
#include <functional>
#include <mutex>
#include <string>
#include <thread>

namespace lockstep::train {

// Test-only hooks (tests/train/async_ckpt_test.sh), read when a job reaches the point:
//   LOCKSTEP_TEST_CHECKPOINT_KILL="POINT,STEP,RANK": the process kills itself (SIGKILL) at
//     POINT of the save of STEP on RANK, as a crash there would. POINT is one of
//     write-start, write-mid (after the first file), write-end (every file durable, the
//     checkpoint not yet committed), commit-rename (meta.json written, before the
//     directory's rename), commit-latest (renamed, before LATEST is replaced).
//   LOCKSTEP_TEST_CHECKPOINT_PAUSE_MS=N (read when the writer is built): every background
//     job sleeps N ms before it starts, and so does a staging copy beside the step.
inline constexpr const char* kTestCheckpointKill = "LOCKSTEP_TEST_CHECKPOINT_KILL";
inline constexpr const char* kTestCheckpointPauseMs = "LOCKSTEP_TEST_CHECKPOINT_PAUSE_MS";
// The kill hook: returns when `point` of `step` on `rank` is not the one the variable names.
void checkpoint_test_point(const char* point, int64_t step, int rank);
// Whether `specs` (a test hook's value: "POINT,STEP,WHO" specs separated by spaces, STEP *
// for any; null or "" for none) names `point` of `step` on `who` (a rank, a replica).
bool test_point_named(const char* specs, const char* point, int64_t step, int who);

// Puts the calling thread on the cycles no other thread wants (Linux SCHED_IDLE, per
// thread; nice 19 where it is refused): the checkpoint's writer and staging copy take what
// the training step leaves, so the step runs at its speed while a save is written, and a
// step that waits for them (the update after a save, the next save) lends them its core
// (docs/checkpoints.md, "Cost").
void run_on_idle_cycles();

class CheckpointWriter {
 public:
  using Job = std::function<void()>;
  enum class State { kIdle, kBusy, kFailed };

  // `background`: a thread runs the jobs; else run() runs them itself.
  explicit CheckpointWriter(bool background);
  // Waits for the running job (its error, if any, is printed to stderr: nobody is left to
  // report it to), then stops the thread.
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  bool background() const { return background_; }
  int test_pause_ms() const { return pause_ms_; }
  // Starts `job`. Requires state() != kBusy (the caller waits first: one job in flight).
  // Inline mode: runs it now; its exception sets kFailed (as in the background).
  void run(Job job);
  // kBusy while a job runs; kFailed when the last one threw (error() says why).
  State state() const;
  // Waits until no job runs; returns state() then.
  State wait();
  // The last failed job's message ("" if none); clear_error() forgets it.
  std::string error() const;
  void clear_error();

 private:
  void loop();
  void execute(const Job& job);

  const bool background_;
  int pause_ms_ = 0;  // kTestCheckpointPauseMs, read once when the writer starts
  mutable std::mutex mu_;
  std::condition_variable cv_;
  Job job_;
  bool busy_ = false, stop_ = false;
  std::string error_;
  std::thread thread_;
};

}  // namespace lockstep::train
