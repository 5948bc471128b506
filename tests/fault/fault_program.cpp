// A rank for the fault tests. Modes:
//   kill-mid-collective  every rank loops over 4 MiB allreduces; the last rank SIGKILLs
//                        itself in the middle of the loop. Survivors must raise CommError:
//                        they print it with the elapsed time and exit 3 (0 = no error seen).
//   die-in-loop          every rank loops over collectives (--op); rank --victim sends itself
//                        --signal before iteration --at, after writing the wall-clock time to
//                        --death-file (--signal RETURN: it raises an error of its own, catches
//                        it and returns 1 from main, as a program does after an error that
//                        only one rank sees). Survivors print "caught CommError ... S s after the
//                        death: <what()>", record it in their error file (LOCKSTEP_ERROR_FILE)
//                        and exit 3 (tests/fault/death_test.sh).
//   join                 just rendezvous and leave (for the missing-rank and port tests).
#include <lockstep/launch/error_file.h>
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>
#include <lockstep/launch/cli.h>

#include <chrono>
#include <csignal>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <string>
#include <thread>

namespace {

double wall_now() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

struct LoopOptions {
  std::string op = "allreduce";  // allreduce | barrier | mixed
  std::string signal = "KILL";   // KILL | STOP | RETURN
  int victim = -1;               // -1: the last rank
  int at = 5;
  std::string death_file;
  std::string ready_file;  // multi-host tests: rank 0 creates it once the loop runs
};

// Survivors: the CommError's message and how long after the victim's death it came.
int die_in_loop(lockstep::comm::ProcessGroup& pg, const LoopOptions& o) {
  const int victim = o.victim < 0 ? pg.size() - 1 : o.victim;
  auto x = at::ones({1 << 18}, at::kFloat);
  for (int i = 0; i < 100000; ++i) {
    if (pg.rank() == victim && i == o.at) {
      if (!o.death_file.empty()) {
        std::ofstream(o.death_file) << std::to_string(wall_now()) << "\n";
      }
      if (o.signal == "RETURN") {
        lockstep::launch::record_error("an error of this rank's own (the test's)");
        std::fprintf(stderr, "rank %d leaves after an error of its own\n", pg.rank());
        return 1;
      }
      std::raise(o.signal == "STOP" ? SIGSTOP : SIGKILL);
    }
    // An outside killer (tests/multihost: a whole host) waits for this before it strikes.
    if (i == o.at && pg.rank() == 0 && !o.ready_file.empty()) std::ofstream(o.ready_file) << i;
    const bool barrier = o.op == "barrier" || (o.op == "mixed" && i % 2 == 1);
    try {
      if (barrier)
        pg.barrier()->wait();
      else
        pg.allreduce(x, {lockstep::comm::ReduceOp::Sum})->wait();
      x.fill_(1);
    } catch (const lockstep::CommError& e) {
      double since = -1;
      if (!o.death_file.empty()) {
        double died = 0;
        std::ifstream in(o.death_file);
        if (in >> died) since = wall_now() - died;
      }
      lockstep::launch::record_error(e.what());
      std::fprintf(stderr,
                   "rank %d caught CommError (%s) at iteration %d, %.2f s after the death: %s\n",
                   pg.rank(), lockstep::CommError::kind_name(e.kind()), i, since, e.what());
      return 3;
    }
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fault_program: a rank for the fault tests (tests/fault/*.sh)", "fault_program"};
  std::string mode;
  LoopOptions loop;
  app.add_option("mode", mode, "kill-mid-collective, die-in-loop or join")
      ->required()
      ->check(CLI::IsMember({"kill-mid-collective", "die-in-loop", "join"}));
  app.add_option("--op", loop.op, "die-in-loop: allreduce, barrier or mixed")
      ->check(CLI::IsMember({"allreduce", "barrier", "mixed"}));
  app.add_option("--signal", loop.signal, "die-in-loop: KILL, STOP or RETURN")
      ->check(CLI::IsMember({"KILL", "STOP", "RETURN"}));
  app.add_option("--victim", loop.victim, "die-in-loop: the rank that dies (default: the last)");
  app.add_option("--at", loop.at, "die-in-loop: the iteration it dies at");
  app.add_option("--death-file", loop.death_file, "die-in-loop: where the victim notes its death");
  app.add_option("--ready-file", loop.ready_file,
                 "die-in-loop: rank 0 creates it at iteration --at (for a killer outside; "
                 "--victim beyond the world size: nobody kills itself)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  try {
    auto pg = lockstep::init();
    if (mode == "join") {
      // Rank 0 hosts the store: leaving before the others finish their last store reads
      // would break their connection; the barrier (not through the store) waits for them.
      pg->barrier()->wait();
      std::printf("rank %d joined\n", pg->rank());
      return 0;
    }
    if (mode == "die-in-loop") return die_in_loop(*pg, loop);
    const bool victim = pg->rank() == pg->size() - 1;
    auto x = at::ones({1 << 20}, at::kFloat);
    const auto start = std::chrono::steady_clock::now();
    for (int i = 0; i < 100000; ++i) {
      if (victim && i == 5) std::raise(SIGKILL);
      auto w = pg->allreduce(x, {lockstep::comm::ReduceOp::Avg});
      try {
        w->wait();
      } catch (const lockstep::CommError& e) {
        const double s =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        lockstep::launch::record_error(e.what());
        std::fprintf(stderr,
                     "rank %d caught CommError (%s) at iteration %d, %.2f s after start: %s\n",
                     pg->rank(), lockstep::CommError::kind_name(e.kind()), i, s, e.what());
        return 3;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    lockstep::launch::record_error(e.what());
    std::fprintf(stderr, "fault_program: %s\n", e.what());
    return 1;
  }
}
