// A rank for the fault tests. Modes:
//   kill-mid-collective  every rank loops over 4 MiB allreduces; the last rank SIGKILLs
//                        itself in the middle of the loop. Survivors must raise CommError:
//                        they print it with the elapsed time and exit 3 (0 = no error seen).
//   join                 just rendezvous and leave (for the missing-rank and port tests).
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>

int main(int argc, char** argv) {
  const std::string mode = argc > 1 ? argv[1] : "";
  try {
    auto pg = lockstep::init();
    if (mode == "join") {
      std::printf("rank %d joined\n", pg->rank());
      return 0;
    }
    if (mode != "kill-mid-collective") {
      std::fprintf(stderr, "usage: fault_program kill-mid-collective|join\n");
      return 2;
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
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::fprintf(stderr, "rank %d caught CommError (%s) at iteration %d, %.2f s after start: %s\n",
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
