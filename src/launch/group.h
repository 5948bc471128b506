// group.h (internal): one start of the rank group, from spawn to the last rank reaped.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <string>
#include <vector>

#include "line_buffer.h"
#include "lockstep/launch/options.h"
#include "lockstep/launch/rank_env.h"
#include "signal_pipe.h"

namespace lockstep::launch {

// One line of the launcher's own on stderr: "lockstep-run: <msg>".
void say(const std::string& msg);

struct AttemptResult {
  enum class Outcome { Success, RankFailed, CannotExecute, Interrupted, ServiceLost };
  Outcome outcome = Outcome::Success;
  int exit_code = 0;  // what lockstep-run should exit with if this attempt is the last
};

// Runs the group once: spawns every rank, forwards output, tears down on the first failure
// or on a signal to the launcher, and prints the failure summary. Owns the pipes it opens;
// borrows the signal pipe and the per-rank log fds (-1 = no log), which outlive it.
class Group {
 public:
  using Clock = std::chrono::steady_clock;

  // error_dir: where each rank's error file goes (error_file.h); empty: none.
  Group(const LaunchOptions& opt, const GroupContext& ctx, const EnvMap& base, SignalPipe& signals,
        const std::vector<int>& log_fds, std::string error_dir = {});
  ~Group();
  Group(const Group&) = delete;
  Group& operator=(const Group&) = delete;

  AttemptResult run();

 private:
  enum class Stop { None, Term, Kill };  // the strongest signal lockstep-run sent a rank
  struct Rank {
    int local_rank = 0, rank = 0;
    pid_t pid = -1;
    int fds[2] = {-1, -1};  // stdout, stderr read ends; -1 once at EOF
    LineBuffer lines[2];
    TailBuffer tail{20};  // last stderr lines, for the summary
    Clock::time_point start, end;
    bool running = false;
    int status = 0;
    Stop stopped = Stop::None;
    int stop_signal = 0;           // SIGSTOP/SIGTSTP/...: seen stopped (not by us)
    Clock::time_point stopped_at;  // when first seen stopped
    int restarts = 0;              // --fault-tolerant: restarted alone this often
    bool replica_restart = false;  // --replica-size: restarted with a failed mate
  };

  bool spawn_all();
  // Starts local rank `local` into `r` (restarts: how often this rank was restarted alone);
  // false when the program cannot be executed.
  bool spawn_one(int local, int restarts, Rank& r);
  // --fault-tolerant: a replica failed; restart it alone while the others go on.
  void replica_failed(std::size_t i);
  // --replica-size S > 1: once none of the replica of ranks_[i] runs, starts its S ranks.
  void respawn_replica_when_down(std::size_t i);
  void last_words(Rank& r);
  bool usage_error_in_replica(std::size_t i) const;
  void check_service();
  bool remote_service_lost();
  void loop();
  int poll_timeout_ms() const;
  void handle_signals();
  void read_stream(Rank& r, int stream);
  void emit(Rank& r, int stream, const std::string& line);
  void close_stream(Rank& r, int stream);
  void reap();
  void begin_teardown();
  void first_failure(std::size_t i);
  std::string error_of(const Rank& r) const;
  void signal_groups(int sig);
  void drain_output();
  bool any_running() const;
  bool any_open() const;
  bool only_stopped_left() const;
  bool any_succeeded() const;
  void print_failure_summary() const;
  void print_interrupt_summary() const;
  std::string outcome_of(const Rank& r) const;

  const LaunchOptions& opt_;
  const GroupContext& ctx_;
  const EnvMap& base_;
  SignalPipe& signals_;
  const std::vector<int>& log_fds_;
  const std::string error_dir_;
  std::vector<Rank> ranks_;
  bool tearing_down_ = false;
  bool killed_ = false;        // SIGKILL already sent to every group
  bool noticing_ = false;      // a rank failed: the others get --notice-seconds to see it
  Clock::time_point term_at_;  // when the notice period ends
  Clock::time_point kill_at_;  // when the grace period ends
  int first_failed_ = -1;      // index into ranks_
  int interrupted_by_ = 0;     // signal that asked the launcher to stop
  int exec_errno_ = 0;
  int ft_restarts_ = 0;             // --fault-tolerant: single-replica restarts so far
  std::vector<int> replica_ports_;  // --replica-size: each local replica's MASTER_PORT
  bool service_gone_ = false;       // the quorum service exited (or, remote, cannot be reached)
  int service_status_ = 0;
  bool service_done_ = false;  // the quorum service ended by itself: the job is finished
};

}  // namespace lockstep::launch
