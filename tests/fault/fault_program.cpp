// A rank for the fault tests. Modes:
//   kill-mid-collective  every rank loops over 4 MiB allreduces; the last rank SIGKILLs
//                        itself in the middle of the loop. Survivors must raise CommError:
//                        they print it with the elapsed time and exit 3 (0 = no error seen).
//   join                 just rendezvous and leave (for the missing-rank and port tests).
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>
#include <CLI/CLI.hpp>

#include <csignal>
#include <cstdio>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  CLI::App app{"fault_program: a rank for the fault tests (tests/fault/comm_fault_test.sh)"};
  std::string mode;
  app.add_option("mode", mode, "kill-mid-collective or join")
      ->required()
      ->check(CLI::IsMember({"kill-mid-collective", "join"}));
  app.failure_message(CLI::FailureMessage::help);
  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e) == 0 ? 0 : 2;  // --help: 0; a bad command line: message, usage, 2
  }
  try {
    auto pg = lockstep::init();
    if (mode == "join") {
      // Rank 0 hosts the store: leaving before the others finish their last store reads
      // would break their connection; the barrier (not through the store) waits for them.
      pg->barrier()->wait();
      std::printf("rank %d joined\n", pg->rank());
      return 0;
    }
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
        std::fprintf(stderr,
                     "rank %d caught CommError (%s) at iteration %d, %.2f s after start: %s\n",
                     pg->rank(), lockstep::CommError::kind_name(e.kind()), i, s, e.what());
        return 3;
      }
    }
    return 0;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "fault_program: %s\n", e.what());
    return 1;
  }
}
