// The shm backend in real processes: each test forks P children that rendezvous
// through a c10d::FileStore on a temp file, run collectives, and report through
// their exit code (0 = every check passed). Expected values are closed form:
// rank r contributes (r + 1) * (i % 7 + 1), which stays exact in every dtype
// (at most 4 * 7 per rank, 10 * 7 summed over 4 ranks).
//
// The parent process never touches libtorch's thread pools before forking, and
// every child arms alarm() so a hang fails the test instead of stalling it.
#include "comm/backend_factories.h"
#include "comm/backends/shm/shm_backend.h"

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <torch/csrc/distributed/c10d/FileStore.hpp>

#include <dirent.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <iostream>
#include <sstream>
#include <thread>
#include <vector>

namespace lockstep::comm {
namespace {

using Clock = std::chrono::steady_clock;
using Body = std::function<void(struct Rank&)>;

// One child's handle on its group.
struct Rank {
  int rank = 0;
  int size = 1;
  std::unique_ptr<Backend> be;
  uint64_t seq = 1;

  OpContext ctx(OpKind kind, Millis timeout = Millis(20000)) {
    OpContext c;
    c.desc.kind = kind;
    c.desc.seq = seq++;
    c.start = Clock::now();
    c.timeout = timeout;
    c.deadline = c.start + timeout;
    return c;
  }
};

// A failed check inside a child: printed, then the child exits 1.
struct CheckFailed : std::runtime_error {
  using std::runtime_error::runtime_error;
};
#define CHILD_CHECK(cond, ...)                                                           \
  do {                                                                                   \
    if (!(cond)) throw CheckFailed(lockstep::detail::concat(#cond, " ", ##__VA_ARGS__)); \
  } while (0)

std::string unique_prefix(const char* test) {
  static int counter = 0;
  return lockstep::detail::concat("shmtest-", ::getpid(), "-", counter++, "-", test);
}

int child_main(int rank, int P, const std::string& store_path, const std::string& prefix,
               const Body& body) {
  ::alarm(50);  // a hung child dies of SIGALRM and fails the test
  try {
    torch::set_num_threads(1);
    auto store = c10::make_intrusive<c10d::FileStore>(store_path, P);
    LaunchEnv env;
    env.rank = env.local_rank = rank;
    env.world_size = env.local_world_size = P;
    Rank r;
    r.rank = rank;
    r.size = P;
    r.be = make_shm_backend(store, prefix, env, Millis(20000));
    body(r);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "[rank " << rank << "/" << P << "] " << e.what() << std::endl;
    return 1;
  }
}

// Forks P ranks running `body`; returns each child's raw wait status.
// `setup(rank)` runs in each child first (e.g. a per-rank environment).
std::vector<int> run_ranks(int P, const Body& body, const char* test,
                           const std::vector<std::pair<std::string, std::string>>& env = {},
                           const std::function<void(int)>& setup = nullptr) {
  char path[] = "/tmp/lockstep-shm-store-XXXXXX";
  const int fd = ::mkstemp(path);
  ::close(fd);
  ::unlink(path);
  const std::string prefix = unique_prefix(test);
  std::vector<pid_t> kids;
  for (int r = 0; r < P; ++r) {
    const pid_t pid = ::fork();
    if (pid == 0) {
      for (const auto& [k, v] : env) ::setenv(k.c_str(), v.c_str(), 1);
      if (setup) setup(r);
      ::_exit(child_main(r, P, path, prefix, body));
    }
    kids.push_back(pid);
  }
  std::vector<int> status;
  for (pid_t pid : kids) {
    int st = 0;
    ::waitpid(pid, &st, 0);
    status.push_back(st);
  }
  ::unlink(path);
  return status;
}

void expect_all_ok(const std::vector<int>& status) {
  for (size_t r = 0; r < status.size(); ++r)
    EXPECT_TRUE(WIFEXITED(status[r]) && WEXITSTATUS(status[r]) == 0)
        << "rank " << r << " status " << status[r];
}

// ---- closed-form data ---------------------------------------------------------

at::Tensor pattern(int64_t n, int64_t shift = 0) {  // i % 7 + 1, as int64
  return torch::remainder(torch::arange(shift, shift + n, torch::kLong), 7) + 1;
}

void check_equal(const at::Tensor& got, const at::Tensor& want, const std::string& what) {
  if (!torch::equal(got, want.to(got.scalar_type()))) {
    const auto diff = (got.to(torch::kDouble) - want.to(torch::kDouble)).abs();
    const int64_t bad = diff.nonzero().numel() > 0 ? diff.nonzero()[0].item<int64_t>() : -1;
    throw CheckFailed(lockstep::detail::concat(what, ": mismatch, first bad index ", bad, " got ",
                                               bad >= 0 ? got[bad].item<double>() : 0, " want ",
                                               bad >= 0 ? want[bad].item<double>() : 0));
  }
}

const at::ScalarType kDtypes[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                  at::kInt,   at::kLong,   at::kByte};
const int64_t kSizes[] = {0, 1, 1000, 1 << 20};

void all_collectives(Rank& g) {
  const int P = g.size, me = g.rank;
  const int64_t tri = P * (P + 1) / 2;
  for (at::ScalarType dt : kDtypes) {
    for (int64_t n : kSizes) {
      // The big size for one dtype of each width keeps the test fast on 2 cores.
      if (n > 1000 && (dt == at::kDouble || dt == at::kHalf || dt == at::kInt)) continue;
      const std::string where = lockstep::detail::concat(dtype_name(dt), " n=", n, " P=", P);
      const at::Tensor base = pattern(n);
      for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Min}) {
        at::Tensor t = (base * (me + 1)).to(dt);
        g.be->allreduce(t, op, g.ctx(OpKind::Allreduce));
        const int64_t f = op == ReduceOp::Sum ? tri : op == ReduceOp::Max ? P : 1;
        check_equal(t, base * f, "allreduce " + std::string(reduce_op_name(op)) + " " + where);
      }
      for (int root : {0, P - 1}) {
        at::Tensor t = (base * (me + 1)).to(dt);
        g.be->broadcast(t, root, g.ctx(OpKind::Broadcast));
        check_equal(t, base * (root + 1),
                    lockstep::detail::concat("broadcast root ", root, " ", where));
      }
      {
        at::Tensor in = (base * (me + 1)).to(dt);
        at::Tensor out = torch::zeros({P * n}, in.options());
        g.be->allgather(out, in, g.ctx(OpKind::Allgather));
        for (int r = 0; r < P; ++r)
          check_equal(out.narrow(0, r * n, n), base * (r + 1), "allgather " + where);
      }
      {
        at::Tensor in = (pattern(P * n) * (me + 1)).to(dt);
        at::Tensor out = torch::zeros({n}, in.options());
        g.be->reduce_scatter(out, in, ReduceOp::Sum, g.ctx(OpKind::ReduceScatter));
        check_equal(out, pattern(n, me * n) * tri, "reduce_scatter " + where);
      }
      {
        at::Tensor in = torch::empty({P * n}, torch::kLong);
        for (int d = 0; d < P; ++d) in.narrow(0, d * n, n).copy_(base + (me * P + d + 1));
        in = in.to(dt);
        at::Tensor out = torch::zeros({P * n}, in.options());
        g.be->alltoall(out, in, g.ctx(OpKind::Alltoall));
        for (int q = 0; q < P; ++q)
          check_equal(out.narrow(0, q * n, n), base + (q * P + me + 1), "alltoall " + where);
      }
    }
  }
  g.be->barrier(g.ctx(OpKind::Barrier));
}

// Rank 0 exchanges one message with every other rank (a star, so big messages that
// block in send cannot deadlock): it sends base*(r+1), gets back base*(r+1)+r.
void send_recv(Rank& g) {
  for (int64_t n : kSizes) {
    const at::Tensor base = pattern(n);
    if (g.rank == 0) {
      for (int r = 1; r < g.size; ++r) {
        at::Tensor out = (base * (r + 1)).to(torch::kFloat);
        g.be->send(out, r, 5, g.ctx(OpKind::Send));
        at::Tensor back = torch::empty({n}, torch::kFloat);
        g.be->recv(back, r, 6, g.ctx(OpKind::Recv));
        check_equal(back, base * (r + 1) + r,
                    lockstep::detail::concat("send/recv n=", n, " peer ", r));
      }
    } else {
      at::Tensor t = torch::empty({n}, torch::kFloat);
      g.be->recv(t, 0, 5, g.ctx(OpKind::Recv));
      check_equal(t, base * (g.rank + 1), lockstep::detail::concat("recv n=", n));
      t += g.rank;
      g.be->send(t, 0, 6, g.ctx(OpKind::Send));
    }
  }
}

// ---- tests --------------------------------------------------------------------

class ShmBackendP : public ::testing::TestWithParam<int> {};

TEST_P(ShmBackendP, AllCollectives) {
  expect_all_ok(run_ranks(GetParam(), all_collectives, "all"));
}

TEST_P(ShmBackendP, SmallBuffersManyChunks) {
  // 8 KiB staging and a 4 KiB channel: 1<<20 elements stream through hundreds of
  // chunks whose parts are not divisible by P; send/recv wraps the ring many times.
  const std::vector<std::pair<std::string, std::string>> env = {
      {"LOCKSTEP_SHM_BUFFER_BYTES", "8192"}, {"LOCKSTEP_SHM_CHANNEL_BYTES", "4096"}};
  expect_all_ok(run_ranks(
      GetParam(),
      [](Rank& g) {
        const int P = g.size;
        for (int64_t n : {int64_t{5}, int64_t{3000}, int64_t{(1 << 20) + 3}}) {
          at::Tensor t = (pattern(n) * (g.rank + 1)).to(torch::kFloat);
          g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce));
          check_equal(t, pattern(n) * (P * (P + 1) / 2),
                      lockstep::detail::concat("allreduce n=", n));
        }
        send_recv(g);
      },
      "chunks", env));
}

TEST_P(ShmBackendP, StreamingPathFollowsRankZero) {
  // Rank 0 asks for the streaming path, every other rank for the cached one: all must
  // take rank 0's (it rides in the descriptor) and get the same exact results, over
  // many chunks (8 KiB staging) with parts that do not divide evenly, Avg included.
  const int P = GetParam();
  expect_all_ok(run_ranks(
      P,
      [](Rank& g) {
        const int P = g.size;
        const int64_t tri = P * (P + 1) / 2;
        auto& be = static_cast<shm::ShmBackend&>(*g.be);
        for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
          for (int64_t n : {int64_t{5}, int64_t{40000}, int64_t{(1 << 18) + 3}}) {
            for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
              if (op == ReduceOp::Avg && dt != at::kFloat) continue;
              const std::string where = lockstep::detail::concat(
                  reduce_op_name(op), " ", dtype_name(dt), " n=", n, " P=", P);
              at::Tensor t = (pattern(n) * (g.rank + 1)).to(dt);
              g.be->allreduce(t, op, g.ctx(OpKind::Allreduce));
              const at::Tensor want = op == ReduceOp::Sum   ? pattern(n) * tri
                                      : op == ReduceOp::Max ? pattern(n) * P
                                                            : pattern(n).to(at::kFloat) * tri / P;
              check_equal(t, want, "streaming allreduce " + where);
              const bool staged = P > 1 && n * t.element_size() > (64 << 10);
              CHILD_CHECK(!staged || be.leader_variant() == int32_t(shm::ShmPath::Streaming),
                          "took the cached path: ", where);
            }
          }
        }
      },
      "streaming", {{"LOCKSTEP_SHM_BUFFER_BYTES", "8192"}},
      [](int r) { ::setenv("LOCKSTEP_SHM_PATH", r == 0 ? "streaming" : "cached", 1); }));
}

TEST_P(ShmBackendP, StreamedOutputsAreExact) {
  // Allgather outputs from 4 KiB on written with non-temporal stores (LOCKSTEP_SHM_STREAM_BYTES),
  // through 8 KiB staging: every collective, dtype and size of all_collectives, then
  // outputs that start off a 16-byte boundary and an Avg allreduce, all exact.
  const std::vector<std::pair<std::string, std::string>> env = {
      {"LOCKSTEP_SHM_STREAM_BYTES", "4096"}, {"LOCKSTEP_SHM_BUFFER_BYTES", "8192"}};
  expect_all_ok(run_ranks(
      GetParam(),
      [](Rank& g) {
        all_collectives(g);
        const int P = g.size, me = g.rank;
        const int64_t tri = P * (P + 1) / 2, n = 50001;
        const std::string where =
            lockstep::detail::concat("n=", n, " P=", P, " output at +4 bytes");
        at::Tensor in = (pattern(n) * (me + 1)).to(torch::kFloat);
        at::Tensor out = torch::zeros({P * n + 1}, torch::kFloat).narrow(0, 1, P * n);
        g.be->allgather(out, in, g.ctx(OpKind::Allgather));
        for (int r = 0; r < P; ++r)
          check_equal(out.narrow(0, r * n, n), pattern(n) * (r + 1), "allgather " + where);
        at::Tensor rin = (pattern(P * n) * (me + 1)).to(torch::kFloat);
        at::Tensor rout = torch::zeros({n + 1}, torch::kFloat).narrow(0, 1, n);
        g.be->reduce_scatter(rout, rin, ReduceOp::Sum, g.ctx(OpKind::ReduceScatter));
        check_equal(rout, pattern(n, me * n) * tri, "reduce_scatter " + where);
        at::Tensor t = torch::zeros({n + 1}, torch::kFloat).narrow(0, 1, n);
        t.copy_(pattern(n) * (me + 1));
        g.be->allreduce(t, ReduceOp::Avg, g.ctx(OpKind::Allreduce));
        check_equal(t, pattern(n).to(at::kFloat) * tri / P, "allreduce avg " + where);
      },
      "streamed", env));
}

// Lines of /proc/self/maps that map a shared allocation ("<segment>-a<id>-r<rank>";
// the segment's own name has no "-r").
int shared_mappings() {
  std::ifstream maps("/proc/self/maps");
  int n = 0;
  for (std::string line; std::getline(maps, line);)
    n += line.find("/dev/shm/lockstep-") != std::string::npos &&
         line.find("-r") != std::string::npos;
  return n;
}

TEST_P(ShmBackendP, SharedMemoryAllreduceInPlace) {
  // Slices at the same place of an alloc_shared allocation on every rank take the
  // zero-copy path (each rank writes its part into every rank's memory); slices at
  // different places (rank 0 shifted) the staged one. Both exact, and nothing outside
  // the slice is written on any rank. Freeing the tensor unmaps every mapping.
  const int P = GetParam();
  expect_all_ok(run_ranks(
      P,
      [](Rank& g) {
        const int P = g.size;
        const int64_t tri = P * (P + 1) / 2;
        auto& be = static_cast<shm::ShmBackend&>(*g.be);
        const int64_t n = (1 << 18) + 37, pad = 64;
        for (at::ScalarType dt : {at::kFloat, at::kBFloat16}) {
          {
            at::Tensor buf = be.alloc_shared(n + 2 * pad, dt, g.ctx(OpKind::AllocShared));
            CHILD_CHECK(buf.defined() && buf.numel() == n + 2 * pad && buf.scalar_type() == dt);
            CHILD_CHECK(shared_mappings() == P, shared_mappings(), " mappings for P=", P);
            for (int64_t shift : {int64_t{0}, int64_t{7}}) {
              for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max, ReduceOp::Avg}) {
                if (op == ReduceOp::Avg && dt != at::kFloat) continue;
                const std::string where = lockstep::detail::concat(
                    reduce_op_name(op), " ", dtype_name(dt), " shift=", shift, " P=", P);
                buf.fill_(-1);
                g.be->barrier(g.ctx(OpKind::Barrier));  // no peer still writes into buf
                at::Tensor t = buf.narrow(0, pad + (g.rank == 0 ? shift : 0), n);
                t.copy_(pattern(n) * (g.rank + 1));
                g.be->allreduce(t, op, g.ctx(OpKind::Allreduce));
                const at::Tensor want = op == ReduceOp::Sum   ? pattern(n) * tri
                                        : op == ReduceOp::Max ? pattern(n) * P
                                                              : pattern(n).to(at::kFloat) * tri / P;
                check_equal(t, want, "shared allreduce " + where);
                const int64_t lo = pad + (g.rank == 0 ? shift : 0);
                const at::Tensor outside =
                    at::cat({buf.narrow(0, 0, lo), buf.narrow(0, lo + n, buf.numel() - lo - n)});
                CHILD_CHECK((outside == -1).all().item<bool>(), "wrote outside the slice: ", where);
                CHILD_CHECK(P == 1 || be.last_zero_copy() == (shift == 0), "zero copy ",
                            be.last_zero_copy(), ": ", where);
              }
            }
          }
          CHILD_CHECK(be.regions().live() == 0 && shared_mappings() == 0,
                      "not unmapped: ", be.regions().live(), " live, ", shared_mappings(),
                      " mapped");
        }
      },
      "shared"));
}

TEST_P(ShmBackendP, SharedMemoryReduceScatter) {
  // Inputs at the same place of an alloc_shared allocation on every rank take the
  // zero-copy path (each rank reduces its slice straight from every rank's input), at
  // different places (rank 0 shifted) the staged one; both exact, into a separate output
  // or in place (the output is the rank's own slice of its input).
  const int P = GetParam();
  expect_all_ok(run_ranks(
      P,
      [](Rank& g) {
        const int P = g.size;
        const int64_t tri = P * (P + 1) / 2;
        auto& be = static_cast<shm::ShmBackend&>(*g.be);
        const int64_t n = (1 << 16) + 37, pad = 64;
        at::Tensor buf = be.alloc_shared(P * n + 2 * pad, at::kFloat, g.ctx(OpKind::AllocShared));
        CHILD_CHECK(buf.defined());
        for (int64_t shift : {int64_t{0}, int64_t{7}}) {
          for (bool in_place : {false, true}) {
            const std::string where =
                lockstep::detail::concat("shift=", shift, " in_place=", in_place, " P=", P);
            g.be->barrier(g.ctx(OpKind::Barrier));  // no peer still reads buf
            at::Tensor in = buf.narrow(0, pad + (g.rank == 0 ? shift : 0), P * n);
            in.copy_(pattern(P * n) * (g.rank + 1));
            g.be->barrier(g.ctx(OpKind::Barrier));
            at::Tensor out = in_place ? in.narrow(0, g.rank * n, n) : at::empty({n});
            g.be->reduce_scatter(out, in, ReduceOp::Sum, g.ctx(OpKind::ReduceScatter));
            check_equal(out, pattern(P * n).narrow(0, g.rank * n, n) * tri,
                        "shared reduce_scatter " + where);
            CHILD_CHECK(P == 1 || be.last_zero_copy() == (shift == 0), "zero copy ",
                        be.last_zero_copy(), ": ", where);
          }
        }
      },
      "shared_rs"));
}

TEST_P(ShmBackendP, SendRecv) { expect_all_ok(run_ranks(GetParam(), send_recv, "p2p")); }

INSTANTIATE_TEST_SUITE_P(WorldSizes, ShmBackendP, ::testing::Values(1, 2, 3, 4));

// Expects `fn` to throw CommError of `kind`; returns it for further checks.
CommError expect_comm_error(const std::function<void()>& fn, CommError::Kind kind) {
  try {
    fn();
  } catch (const CommError& e) {
    CHILD_CHECK(e.kind() == kind, "got ", CommError::kind_name(e.kind()), ": ", e.what());
    return e;
  }
  throw CheckFailed(lockstep::detail::concat("expected CommError ", CommError::kind_name(kind)));
}

TEST(ShmBackendFaults, MismatchRaisesOnAllRanks) {
  expect_all_ok(run_ranks(
      3,
      [](Rank& g) {
        at::Tensor t = torch::ones({g.rank == 0 ? 1000 : 999}, torch::kFloat);
        const CommError e =
            expect_comm_error([&] { g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce)); },
                              CommError::Kind::Mismatch);
        const std::string msg = e.what();
        CHILD_CHECK(
            msg.find("(float32, 1000, sum) but rank 1 entered allreduce #") != std::string::npos &&
                msg.find(" (float32, 999, sum)") != std::string::npos,
            msg);
      },
      "mismatch"));
}

TEST(ShmBackendFaults, RecvTagMismatch) {
  expect_all_ok(run_ranks(
      2,
      [](Rank& g) {
        at::Tensor t = torch::ones({10}, torch::kFloat);
        if (g.rank == 0) {
          g.be->send(t, 1, 1, g.ctx(OpKind::Send));
        } else {
          expect_comm_error([&] { g.be->recv(t, 0, 2, g.ctx(OpKind::Recv)); },
                            CommError::Kind::Mismatch);
        }
      },
      "tag"));
}

TEST(ShmBackendFaults, KilledPeerRaisesPeerGone) {
  const auto status = run_ranks(
      3,
      [](Rank& g) {
        at::Tensor t = torch::ones({1 << 16}, torch::kFloat);
        g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce));
        if (g.rank == 2) ::raise(SIGKILL);
        const Clock::time_point start = Clock::now();
        const CommError e =
            expect_comm_error([&] { g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce)); },
                              CommError::Kind::PeerGone);
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        CHILD_CHECK(e.context().peer == 2, "peer ", e.context().peer, ": ", e.what());
        CHILD_CHECK(s < 5.0, "took ", s, " s of a 20 s timeout");
      },
      "kill");
  ASSERT_EQ(status.size(), 3u);
  EXPECT_TRUE(WIFSIGNALED(status[2]) && WTERMSIG(status[2]) == SIGKILL);
  expect_all_ok({status[0], status[1]});
}

TEST(ShmBackendFaults, TimeoutIsPublishedToPeers) {
  expect_all_ok(run_ranks(
      2,
      [](Rank& g) {
        at::Tensor t = torch::ones({100}, torch::kFloat);
        if (g.rank == 1) std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        const Clock::time_point start = Clock::now();
        const CommError e = expect_comm_error(
            [&] { g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce, Millis(300))); },
            CommError::Kind::Timeout);
        const double s = std::chrono::duration<double>(Clock::now() - start).count();
        CHILD_CHECK(s < 1.0, "took ", s, " s");
        CHILD_CHECK(e.context().peer == 1 - g.rank, "peer ", e.context().peer, ": ", e.what());
      },
      "timeout"));
}

TEST(ShmBackendFaults, AbortWakesWaiters) {
  expect_all_ok(run_ranks(
      2,
      [](Rank& g) {
        at::Tensor t = torch::ones({100}, torch::kFloat);
        if (g.rank == 0) {
          std::thread killer([&] {
            std::this_thread::sleep_for(std::chrono::milliseconds(200));
            g.be->abort();
          });
          expect_comm_error([&] { g.be->allreduce(t, ReduceOp::Sum, g.ctx(OpKind::Allreduce)); },
                            CommError::Kind::Aborted);
          killer.join();
        } else {
          std::this_thread::sleep_for(std::chrono::milliseconds(500));
          expect_comm_error([&] { g.be->barrier(g.ctx(OpKind::Barrier)); },
                            CommError::Kind::Aborted);
        }
      },
      "abort"));
}

TEST(ShmBackendFaults, SharedAllocationSizeMismatch) {
  expect_all_ok(run_ranks(
      2,
      [](Rank& g) {
        const CommError e = expect_comm_error(
            [&] {
              g.be->alloc_shared(g.rank == 0 ? 100 : 101, at::kFloat, g.ctx(OpKind::AllocShared));
            },
            CommError::Kind::Mismatch);
        const std::string msg = e.what();
        CHILD_CHECK(
            msg.find("entered alloc_shared #") != std::string::npos &&
                msg.find(" (float32, 100) but rank 1 entered alloc_shared #") != std::string::npos,
            msg);
      },
      "shared-mismatch"));
}

TEST(ShmBackendFaults, SharedAllocationTooLargeFallsBack) {
  // More than /dev/shm holds: every rank gets an undefined tensor (callers fall back to
  // private memory), nothing stays mapped, and the group goes on working.
  expect_all_ok(run_ranks(
      2,
      [](Rank& g) {
        auto& be = static_cast<shm::ShmBackend&>(*g.be);
        at::Tensor t = be.alloc_shared(int64_t{1} << 40, at::kFloat, g.ctx(OpKind::AllocShared));
        CHILD_CHECK(!t.defined(), "got ", t.numel(), " elements");
        CHILD_CHECK(be.regions().live() == 0 && shared_mappings() == 0, "left mapped");
        at::Tensor x = torch::ones({1000}, torch::kFloat);
        g.be->allreduce(x, ReduceOp::Sum, g.ctx(OpKind::Allreduce));
        CHILD_CHECK(x[0].item<float>() == 2.0f, "allreduce after: ", x[0].item<float>());
      },
      "shared-too-large"));
}

TEST(ShmBackendFaults, SharedAllocationPeerDiesMidway) {
  // Rank 1 joins the size round, then dies: rank 0, which has created its object by
  // then, raises PeerGone from the vote and must not leave the object's name behind.
  const auto status = run_ranks(
      2,
      [](Rank& g) {
        auto& be = static_cast<shm::ShmBackend&>(*g.be);
        if (g.rank == 1) {
          be.begin(OpKind::AllocShared, 1 << 20, at::kFloat, ReduceOp::Sum, -1,
                   g.ctx(OpKind::AllocShared));
          ::raise(SIGKILL);
        }
        const CommError e = expect_comm_error(
            [&] { be.alloc_shared(1 << 20, at::kFloat, g.ctx(OpKind::AllocShared)); },
            CommError::Kind::PeerGone);
        const std::string name = "/dev/shm" + be.shm_name() + "-a0-r0";
        CHILD_CHECK(::access(name.c_str(), F_OK) != 0, "left behind: ", name);
        CHILD_CHECK(be.regions().live() == 0 && shared_mappings() == 0, "left mapped");
      },
      "shared-peer-dies");
  ASSERT_EQ(status.size(), 2u);
  EXPECT_TRUE(WIFSIGNALED(status[1]) && WTERMSIG(status[1]) == SIGKILL);
  expect_all_ok({status[0]});
}

// No segment may survive a finished group, nor the killed group of KilledPeer.
TEST(ShmBackendZ, NoSegmentLeftBehind) {
  expect_all_ok(run_ranks(
      2, [](Rank& g) { g.be->barrier(g.ctx(OpKind::Barrier)); }, "leak"));
  const std::string mine = lockstep::detail::concat("lockstep-", ::getuid(), "-");
  std::vector<std::string> left;
  if (DIR* d = ::opendir("/dev/shm")) {
    while (dirent* e = ::readdir(d)) {
      const std::string name = e->d_name;
      if (name.rfind(mine, 0) == 0) left.push_back(name);
    }
    ::closedir(d);
  }
  // Other jobs of this user may be mid-rendezvous; ours are all finished by now, so
  // anything left must be gone after a moment if it is not ours.
  if (!left.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  for (const std::string& name : left)
    EXPECT_NE(::access(("/dev/shm/" + name).c_str(), F_OK), 0) << "left behind: " << name;
}

}  // namespace
}  // namespace lockstep::comm
