// Internal: the stall inspector (docs/debugging.md). When a collective has waited
// LOCKSTEP_STALL_WARN_S for ranks that have not entered it, rank 0 prints which ranks
// those are and what each of them last entered, and repeats every LOCKSTEP_STALL_WARN_S
// while the stall lasts.
//
// Nothing happens per op: the group records what it entered last under the lock it takes
// anyway, and one thread per group looks every warn/4 seconds. Where it learns the peers'
// state from:
//  - shm: the segment (each rank's posted descriptor); only rank 0 looks, never a syscall.
//  - gloo: the rendezvous store, lazily. A rank whose op has waited warn/2 bumps a question
//    counter; every rank polls that counter (one store round trip per warn/4) and answers
//    a new question by posting its state (one key per rank, overwritten); rank 0 reads the
//    answers and reports.
//  - mpi (no store): each rank reports its own long wait; the ranks that print nothing are
//    the ones the others wait for.
#pragma once

#include <lockstep/comm/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::comm {

class StoreChannel;

// What the inspector knows of one rank.
struct RankActivity {
  bool known = false;  // false: the rank did not answer (stopped, dead, or stuck outside)
  OpDesc last;         // the last collective it entered; last.seq == 0: none yet
  bool in_op_known = false;
  bool in_op = false;   // still inside `last`
  double since_s = -1;  // seconds since it entered `last` (< 0: unknown)
};

// The op some ranks wait in while others have not entered it.
struct StallFinding {
  OpDesc op;                 // op.seq == 0: no stall
  std::vector<int> entered;  // ranks whose last entered op is op.seq
  std::vector<int> missing;  // the others (behind, or unknown)
};

// The most recent collective entered by some known rank but not by all: a stall candidate.
StallFinding find_stall(const std::vector<RankActivity>& ranks);

// How long the op has waited, as the ranks inside it report (max since_s; -1: unknown).
double waited_in(const StallFinding& f, const std::vector<RankActivity>& ranks);

// The report rank 0 prints, one line per missing rank, every line starting "lockstep: stall: ".
std::string format_stall(const StallFinding& f, const std::vector<RankActivity>& ranks,
                         double waited_s, double warn_s, double timeout_s);

// Text form of a rank's activity in the store: "<question> <in_op> <since_ms> <op>" ...
std::string activity_to_text(const RankActivity& a, int64_t question);
// ... and back (nullopt if malformed); `question` receives the question it answered.
std::optional<RankActivity> activity_from_text(const std::string& s, int64_t& question);

class StallInspector {
 public:
  struct Config {
    int rank = 0;
    int size = 1;
    double warn_s = 60;
    double timeout_s = 300;
    // This rank's activity; nullopt once the group is gone. Thread-safe.
    std::function<std::optional<RankActivity>()> local;
    // shm: the last collective each rank has entered, from shared memory (rank 0 only).
    std::function<std::vector<OpDesc>()> peers;
    // gloo: the group's keys in the store (a connection of its own).
    std::shared_ptr<StoreChannel> store;
    // Where reports go (default: stderr, one write per report).
    std::function<void(const std::string&)> print;
  };
  // Starts the thread where this rank has something to do (every rank with a store or
  // without any view of the peers; rank 0 only with `peers`).
  explicit StallInspector(Config c);
  // Stops the thread. One stuck in a store call (rank 0 stopped) is detached, not waited
  // for: it holds no reference to the group.
  ~StallInspector();
  StallInspector(const StallInspector&) = delete;
  StallInspector& operator=(const StallInspector&) = delete;

  struct State;  // shared with the thread

 private:
  std::shared_ptr<State> state_;
};

}  // namespace lockstep::comm
