// op_check: op fingerprints and the stall inspector (docs/debugging.md), on the group
// lockstep::init() builds. Run under lockstep-run or mpirun with 2+ ranks.
//
//   op_check --case kind|count|dtype   rank 0 issues one collective, the others another
//       (allgather vs barrier; 1024 vs 1000 elements; float32 vs float64) as op #4, after
//       three matching ones. Every rank must raise CommError(Mismatch) naming both ops,
//       well before the timeout (--within seconds): the test sets a long LOCKSTEP_TIMEOUT_S,
//       so a mismatch found only by the timeout fails here.
//   op_check --stall SECONDS [--late R]   rank R (default 1) sleeps before entering op #4;
//       with LOCKSTEP_STALL_WARN_S=1 rank 0's stderr must name rank R and the op it last
//       entered, and the job must then complete with correct results.
#include <lockstep/comm/init.h>
#include <lockstep/comm/launch_env.h>

#include <ATen/ATen.h>
#include <lockstep/launch/cli.h>

#include "tally.h"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <fstream>
#include <iostream>
#include <memory>
#include <sstream>
#include <string>
#include <thread>

using lockstep::CommError;
using lockstep::comm::ProcessGroup;

namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Three matching collectives, so the mismatched one is #4 on every rank.
void warm_up(ProcessGroup& pg) {
  auto x = at::ones({16}, at::kFloat);
  pg.allreduce(x)->wait();
  pg.barrier()->wait();
  pg.allreduce(x)->wait();
}

// What rank 0 and the other ranks enter as op #4 in case `which`, as errors describe it.
struct Mismatch {
  std::string leader;
  std::string others;
};

Mismatch expected(const std::string& which) {
  if (which == "kind") return {"allgather #4 (float32, 1024)", "barrier #4"};
  if (which == "count")
    return {"allreduce #4 (float32, 1024, sum)", "allreduce #4 (float32, 1000, sum)"};
  return {"allreduce #4 (float32, 1024, sum)", "allreduce #4 (float64, 1024, sum)"};
}

void issue_mismatch(ProcessGroup& pg, const std::string& which) {
  const bool lead = pg.rank() == 0;
  if (which == "kind") {
    if (lead) {
      auto in = at::ones({1024}, at::kFloat);
      auto out = at::empty({int64_t{1024} * pg.size()}, at::kFloat);
      pg.allgather(out, in)->wait();
    } else {
      pg.barrier()->wait();
    }
  } else if (which == "count") {
    auto x = at::ones({lead ? 1024 : 1000}, at::kFloat);
    pg.allreduce(x)->wait();
  } else {
    auto x = at::ones({1024}, lead ? at::kFloat : at::kDouble);
    pg.allreduce(x)->wait();
  }
}

int run_mismatch(ProcessGroup& pg, const std::string& which, double within) {
  warm_up(pg);
  const auto start = std::chrono::steady_clock::now();
  const Mismatch want = expected(which);
  try {
    issue_mismatch(pg, which);
    tally::check("mismatched op #4 raises", false, "it completed");
  } catch (const CommError& e) {
    const double took = seconds_since(start);
    const std::string msg = e.what();
    std::printf("rank %d raised after %.3f s: %s\n", pg.rank(), took, msg.c_str());
    tally::check("raises CommError(Mismatch)", e.kind() == CommError::Kind::Mismatch,
                 CommError::kind_name(e.kind()));
    tally::check("promptly", took < within,
                 std::to_string(took) + " s (limit " + std::to_string(within) + " s)");
    tally::check("names rank 0's op", contains(msg, "rank 0 entered " + want.leader));
    tally::check("names the other side's op", contains(msg, "but rank 1 entered " + want.others));
  }
  // The group is broken now: later ops fail at once with the same cause.
  try {
    pg.barrier()->wait();
    tally::check("later ops fail", false, "a barrier completed");
  } catch (const CommError& e) {
    tally::check("later ops fail with the mismatch", e.kind() == CommError::Kind::Mismatch,
                 e.what());
  }
  return tally::finish();
}

// Rank 0's stderr goes to a file while the stall happens, so the program can check it
// (and echoes it afterwards).
class CaptureStderr {
 public:
  CaptureStderr() : path_("/tmp/op_check_stderr_" + std::to_string(::getpid())) {
    std::fflush(stderr);
    saved_ = ::dup(2);
    std::FILE* f = std::fopen(path_.c_str(), "w");
    ::dup2(::fileno(f), 2);
    std::fclose(f);
  }
  CaptureStderr(const CaptureStderr&) = delete;
  CaptureStderr& operator=(const CaptureStderr&) = delete;
  // Restores stderr if finish() was not called (e.g. an exception): what was captured
  // must not vanish.
  ~CaptureStderr() {
    if (saved_ >= 0) finish();
  }
  // Restores stderr, echoes what was captured, and returns it.
  std::string finish() {
    std::fflush(stderr);
    ::dup2(saved_, 2);
    ::close(saved_);
    saved_ = -1;
    std::ifstream in(path_);
    std::stringstream ss;
    ss << in.rdbuf();
    std::remove(path_.c_str());
    std::fprintf(stderr, "%s", ss.str().c_str());
    return ss.str();
  }

 private:
  std::string path_;
  int saved_ = -1;
};

// Rank `late` sleeps before op #4; the others wait in it. Rank 0's stderr must report the
// stall, naming the late rank and what it last entered (on mpi, which shows no peers:
// rank 0's own wait, unless rank 0 is the late one).
int run_stall(double sleep_s, int late) {
  const bool leader = lockstep::comm::LaunchEnv::from_environment().rank == 0;
  std::unique_ptr<CaptureStderr> cap;
  if (leader) cap = std::make_unique<CaptureStderr>();
  auto pg = lockstep::init();
  tally::rank = pg->rank();
  warm_up(*pg);
  if (pg->rank() == late) std::this_thread::sleep_for(std::chrono::duration<double>(sleep_s));
  auto x = at::full({1000}, double(pg->rank() + 1), at::kDouble);
  const auto start = std::chrono::steady_clock::now();
  pg->allreduce(x)->wait();  // op #4
  const double took = seconds_since(start);
  const int p = pg->size();
  const double want = p * (p + 1) / 2.0;
  tally::report("allreduce after the stall", (x - want).abs().max().item<double>(), 0);
  pg->barrier()->wait();
  if (cap) {
    const std::string err = cap->finish();
    std::printf("rank 0 waited %.2f s in op #4\n", took);
    const bool peers_shown = pg->backend_name() != "mpi";
    const std::string who = std::to_string(late);
    if (peers_shown || late != 0) {
      tally::check(
          "rank 0 reports the stall of op #4",
          contains(err, "lockstep: stall: ") && contains(err, "allreduce #4 (float64, 1000, sum)"));
    }
    if (peers_shown) {
      tally::check("names the late rank", contains(err, " for rank " + who + " (entered by "));
      tally::check("and what it last entered",
                   contains(err, "rank " + who + " last entered allreduce #3 (float32, 16, sum)"));
    }
  }
  return tally::finish();
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"op_check: op fingerprints and the stall inspector (see the file's comment)",
               "op_check"};
  std::string which;
  double within = 5, stall = 0;
  int late = 1;
  app.add_option("--case", which, "mismatch: kind, count or dtype")
      ->check(CLI::IsMember({"kind", "count", "dtype"}));
  app.add_option("--within", within, "seconds every rank may take to raise (default 5)");
  app.add_option("--stall", stall, "instead: rank --late sleeps this long before op #4");
  app.add_option("--late", late, "the rank that sleeps (default 1)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  try {
    if (stall > 0) return run_stall(stall, late);
    auto pg = lockstep::init();
    tally::rank = pg->rank();
    if (pg->size() < 2) {
      std::printf("op_check needs 2+ ranks\n");
      return 1;
    }
    return run_mismatch(*pg, which.empty() ? "kind" : which, within);
  } catch (const std::exception& e) {
    std::fprintf(stderr, "op_check: %s\n", e.what());
    return 1;
  }
}
