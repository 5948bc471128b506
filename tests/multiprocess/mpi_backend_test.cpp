// MPI backend test, run under MPI (ctest runs its failure modes when built with MPI):
//   scripts/mpirun.sh -np N ./mpi_backend_test MODE        N = 1..4
// MODE: all (every op x dtype x size 0/1/1000/2^20, closed-form values; two groups at once),
// mismatch (recv of the wrong size), timeout (one rank skips a barrier: Timeout after 2 s),
// abort, badenv (env/world mismatch -> ConfigError), bench (64 MiB allreduce),
// chunk (run with LOCKSTEP_MPI_MAX_COUNT=1000 and `-x LOCKSTEP_MPI_MAX_COUNT`).
// Drives the Backend directly from a non-main thread, as a ProcessGroup does.

#include <lockstep/error.h>
#include <lockstep/launch/cli.h>
#include "comm/backend_factories.h"
#define OMPI_SKIP_MPICXX 1
#include <mpi.h>
#include <torch/torch.h>
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <iostream>
#include <thread>

#include "tally_tensor.h"

using namespace lockstep;
using namespace lockstep::comm;

static LaunchEnv env_from_ompi() {
  LaunchEnv e;
  if (auto s = getenv("OMPI_COMM_WORLD_RANK")) e.rank = atoi(s);
  if (auto s = getenv("OMPI_COMM_WORLD_SIZE")) e.world_size = atoi(s);
  e.launcher = "mpirun";
  return e;
}
static uint64_t g_seq = 0;
static OpContext mk(OpKind k, int64_t numel, at::ScalarType dt, double timeout_s = 60,
                    int root = -1) {
  OpContext c;
  c.desc.kind = k;
  c.desc.seq = ++g_seq;
  c.desc.numel = numel;
  c.desc.dtype = dt;
  c.desc.root = root;
  c.start = Clock::now();
  c.timeout = Millis(int64_t(timeout_s * 1000));
  c.deadline = c.start + c.timeout;
  return c;
}

static const at::ScalarType kTypes[] = {at::kFloat, at::kDouble,   at::kInt, at::kLong,
                                        at::kByte,  at::kBFloat16, at::kHalf};

static void test_all(Backend& b) {
  const int P = b.size(), R = b.rank();
  const int64_t sizes[] = {0, 1, 1000, 1 << 20};
  for (auto dt : kTypes)
    for (int64_t n : sizes) {
      auto i = torch::arange(n, torch::kLong);
      std::string tag = dtype_name(dt) + " n=" + std::to_string(n);
      // allreduce sum/max/min
      {
        auto t = ((R + 1) + i % 7).to(dt);
        auto c = mk(OpKind::Allreduce, n, dt);
        b.allreduce(t, ReduceOp::Sum, c);
        tally::exact("allreduce sum " + tag, t, P * (P + 1) / 2 + P * (i % 7));
      }
      {
        auto t = (R + i % 5).to(dt);
        auto c = mk(OpKind::Allreduce, n, dt);
        b.allreduce(t, ReduceOp::Max, c);
        tally::exact("allreduce max " + tag, t, (P - 1) + i % 5);
      }
      {
        auto t = (R + i % 5).to(dt);
        auto c = mk(OpKind::Allreduce, n, dt);
        b.allreduce(t, ReduceOp::Min, c);
        tally::exact("allreduce min " + tag, t, i % 5);
      }
      // broadcast from the last rank
      {
        int root = P - 1;
        auto t = (R == root ? i % 11 : torch::full({n}, 3, torch::kLong)).to(dt);
        auto c = mk(OpKind::Broadcast, n, dt, 60, root);
        b.broadcast(t, root, c);
        tally::exact("broadcast " + tag, t, i % 11);
      }
      // allgather
      {
        auto in = (R * 10 + i % 3).to(dt);
        auto out = torch::full({P * n}, 77, torch::kLong).to(dt);
        auto c = mk(OpKind::Allgather, n, dt);
        b.allgather(out, in, c);
        auto j = torch::arange(P * n, torch::kLong);
        tally::exact(
            "allgather " + tag, out,
            n ? j.div(std::max<int64_t>(n, 1), "floor") * 10 + (j % std::max<int64_t>(n, 1)) % 3
              : j);
      }
      // reduce_scatter sum and max
      {
        auto j = torch::arange(P * n, torch::kLong);
        auto in = (R + j % 13).to(dt);
        auto out = torch::full({n}, 99, torch::kLong).to(dt);
        auto c = mk(OpKind::ReduceScatter, n, dt);
        b.reduce_scatter(out, in, ReduceOp::Sum, c);
        tally::exact("reduce_scatter sum " + tag, out, P * (P - 1) / 2 + P * ((R * n + i) % 13));
        auto c2 = mk(OpKind::ReduceScatter, n, dt);
        b.reduce_scatter(out, in, ReduceOp::Max, c2);
        tally::exact("reduce_scatter max " + tag, out, (P - 1) + ((R * n + i) % 13));
      }
      // alltoall
      {
        auto j = torch::arange(P * n, torch::kLong);
        auto in = (R * 16 + j % 16).to(dt);
        auto out = torch::full({P * n}, 5, torch::kLong).to(dt);
        auto c = mk(OpKind::Alltoall, n, dt);
        b.alltoall(out, in, c);
        auto src = n ? j.div(n, "floor") : j;
        auto off = n ? j % n : j;
        tally::exact("alltoall " + tag, out, src * 16 + (R * n + off) % 16);
      }
      // send/recv ring (even ranks send first)
      if (P > 1) {
        int dst = (R + 1) % P, src = (R + P - 1) % P;
        auto s = (R * 3 + i % 9).to(dt);
        auto r = torch::full({n}, 1, torch::kLong).to(dt);
        auto cs = mk(OpKind::Send, n, dt, 60, dst);
        auto cr = mk(OpKind::Recv, n, dt, 60, src);
        if (R % 2 == 0) {
          b.send(s, dst, 7, cs);
          b.recv(r, src, 7, cr);
        } else {
          b.recv(r, src, 7, cr);
          b.send(s, dst, 7, cs);
        }
        tally::exact("sendrecv " + tag, r, src * 3 + i % 9);
      }
      auto c = mk(OpKind::Barrier, 0, at::kFloat);
      b.barrier(c);
    }
}

static void test_mismatch(Backend& b) {
  const int R = b.rank();
  if (b.size() < 2) return;
  if (R == 0) {
    auto s = torch::ones({10});
    auto c = mk(OpKind::Send, 10, at::kFloat, 10, 1);
    b.send(s, 1, 3, c);
    auto s2 = torch::ones({20});
    auto c2 = mk(OpKind::Send, 20, at::kFloat, 10, 1);
    b.send(s2, 1, 4, c2);
  } else if (R == 1) {
    for (int k = 0; k < 2; ++k) {
      auto r = torch::zeros({k == 0 ? 20 : 10});
      auto c = mk(OpKind::Recv, r.numel(), at::kFloat, 10, 0);
      const std::string what =
          std::string("recv of a ") + (k == 0 ? "shorter" : "longer") + " message raises Mismatch";
      try {
        b.recv(r, 0, 3 + k, c);
        tally::check(what, false, "it did not raise");
      } catch (const CommError& e) {
        tally::check(what, e.kind() == CommError::Kind::Mismatch,
                     std::string(CommError::kind_name(e.kind())) + ": " + e.what());
      }
    }
  }
  auto c = mk(OpKind::Barrier, 0, at::kFloat);
  b.barrier(c);
}

// Rank 0 runs `op` alone with a 2 s timeout (built by mk); it must raise Timeout on time.
static void expect_timeout_alone(Backend& b, const char* what,
                                 const std::function<void(double timeout_s)>& op) {
  if (b.size() == 1) return;
  if (b.rank() == 0) {
    auto t0 = Clock::now();
    const std::string check = std::string(what) + " alone raises Timeout";
    try {
      op(2.0);
      tally::check(check, false, "it did not raise");
    } catch (const CommError& e) {
      double el = std::chrono::duration<double>(Clock::now() - t0).count();
      tally::check(check, e.kind() == CommError::Kind::Timeout,
                   std::string(CommError::kind_name(e.kind())) + ": " + e.what());
      tally::check(std::string(what) + " raises after its 2 s timeout", el >= 1.99 && el < 2.5,
                   tally::format("after %.3f s (want [1.99, 2.5))", el));
    }
  } else {
    std::this_thread::sleep_for(std::chrono::seconds(3));
  }
}

static void test_timeout(Backend& b) {
  expect_timeout_alone(b, "barrier", [&](double s) {
    auto c = mk(OpKind::Barrier, 0, at::kFloat, s);
    b.barrier(c);
  });
}

// A large allreduce (the ring over point-to-point messages) times out like the rest.
static void test_ring_timeout(Backend& b) {
  expect_timeout_alone(b, "ring allreduce", [&](double s) {
    const int64_t n = 4 << 20;
    auto t = torch::ones({n});
    auto c = mk(OpKind::Allreduce, n, at::kFloat, s);
    b.allreduce(t, ReduceOp::Sum, c);
  });
}

static void test_abort(Backend& b) {
  if (b.rank() == 0) {
    std::thread killer([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(500));
      b.abort();
    });
    auto c = mk(OpKind::Barrier, 0, at::kFloat, 30);
    auto t0 = Clock::now();
    const std::string what = "abort() ends a waiting barrier with Aborted";
    try {
      b.barrier(c);
      tally::check(what, b.size() == 1, "the barrier returned");  // alone: nothing to wait for
    } catch (const CommError& e) {
      double el = std::chrono::duration<double>(Clock::now() - t0).count();
      tally::check(
          what, e.kind() == CommError::Kind::Aborted,
          tally::format("%s after %.3f s: %s", CommError::kind_name(e.kind()), el, e.what()));
    }
    killer.join();
  } else
    std::this_thread::sleep_for(std::chrono::seconds(1));
}

static void test_chunk(Backend& b) {  // run with LOCKSTEP_MPI_MAX_COUNT=1000
  const int P = b.size(), R = b.rank();
  const int64_t n = (1 << 20) + 17;
  auto i = torch::arange(n, torch::kLong);
  for (auto dt : {at::kFloat, at::kBFloat16}) {
    auto t = ((R + 1) + i % 7).to(dt);
    auto c = mk(OpKind::Allreduce, n, dt);
    b.allreduce(t, ReduceOp::Sum, c);
    tally::exact("chunked allreduce " + dtype_name(dt), t, P * (P + 1) / 2 + P * (i % 7));
    auto bt = (R == 0 ? i % 11 : i * 0).to(dt);
    auto cb = mk(OpKind::Broadcast, n, dt, 60, 0);
    b.broadcast(bt, 0, cb);
    tally::exact("chunked broadcast " + dtype_name(dt), bt, i % 11);
  }
  if (P > 1) {
    auto s = (i % 9).to(at::kFloat);
    auto r = torch::zeros({n});
    if (R == 0) {
      auto c = mk(OpKind::Send, n, at::kFloat, 60, 1);
      b.send(s, 1, 1, c);
    }
    if (R == 1) {
      auto c = mk(OpKind::Recv, n, at::kFloat, 60, 0);
      b.recv(r, 0, 1, c);
      tally::exact("chunked send/recv", r, i % 9);
    }
  }
  auto in = torch::zeros({2000});
  auto out = torch::zeros({int64_t{2000} * P});
  auto c = mk(OpKind::Allgather, 2000, at::kFloat);
  const std::string what = "an allgather over the count limit is refused";
  try {
    b.allgather(out, in, c);
    tally::check(what, false, "it ran");
  } catch (const CommError& e) {
    tally::check(what, true, e.what());
  }
}

static void test_bench(Backend& b) {
  const int P = b.size();
  const int64_t n = 16 << 20;  // 64 MiB float32
  auto t = torch::ones({n});
  MPI_Comm comm;
  MPI_Comm_dup(MPI_COMM_WORLD, &comm);
  for (int mode = 0; mode < 2; ++mode) {
    std::vector<double> ts;
    for (int it = 0; it < 12; ++it) {
      MPI_Barrier(comm);
      auto t0 = Clock::now();
      if (mode == 0)
        MPI_Allreduce(MPI_IN_PLACE, t.data_ptr(), n, MPI_FLOAT, MPI_SUM, comm);
      else {
        auto c = mk(OpKind::Allreduce, n, at::kFloat);
        b.allreduce(t, ReduceOp::Sum, c);
      }
      double s = std::chrono::duration<double>(Clock::now() - t0).count();
      if (it >= 2) ts.push_back(s);
    }
    std::sort(ts.begin(), ts.end());
    double med = ts[ts.size() / 2];
    double bus = 2.0 * (P - 1) / P * n * 4 / med / 1e9;
    if (b.rank() == 0)
      std::printf("%s 64MiB f32 P=%d: median %.2f ms, bus bw %.2f GB/s, algbw %.2f GB/s\n",
                  mode == 0 ? "MPI_Allreduce (blocking)" : "lockstep mpi backend (ring+poll)", P,
                  med * 1e3, bus, n * 4 / med / 1e9);
  }
  MPI_Comm_free(&comm);
}

static void test_two_groups(Backend& a, Backend& b2) {
  const int P = a.size();
  // Each thread notes its first wrong result (-1: none) and the largest difference; the
  // checks are counted after both joined.
  int first_wrong[2] = {-1, -1};
  double diff[2] = {0, 0};
  auto body = [&](Backend& b, int salt, int which) {
    for (int k = 0; k < 50; ++k) {
      auto t = torch::full({1000}, b.rank() + salt, torch::kFloat);
      OpContext c;
      c.desc.kind = OpKind::Allreduce;
      c.desc.numel = 1000;
      c.start = Clock::now();
      c.timeout = Millis(30000);
      c.deadline = c.start + c.timeout;
      b.allreduce(t, ReduceOp::Sum, c);
      const double d =
          (t.to(at::kDouble) - (P * (P - 1) / 2 + P * salt)).abs().max().item<double>();
      diff[which] = std::max(diff[which], d);
      if (!(d == 0) && first_wrong[which] < 0) first_wrong[which] = k;
    }
  };
  std::thread t1(body, std::ref(a), 1, 0), t2(body, std::ref(b2), 100, 1);
  t1.join();
  t2.join();
  for (int which : {0, 1})
    tally::check(tally::format("two groups at once: group %d's 50 allreduces exact", which + 1),
                 first_wrong[which] < 0,
                 tally::format("max diff %g, first wrong #%d", diff[which], first_wrong[which]));
}

int main(int argc, char** argv) {
  CLI::App app{"mpi_backend_test: the MPI backend driven directly (scripts/mpirun.sh -np N)",
               "mpi_backend_test"};
  std::string mode = "all";
  app.add_option("mode", mode, "what to test (see the top of mpi_backend_test.cpp)")
      ->check(CLI::IsMember(
          {"all", "mismatch", "timeout", "ring_timeout", "abort", "chunk", "badenv", "bench"}))
      ->capture_default_str();
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  auto env = env_from_ompi();
  tally::rank = env.rank;
  std::thread comm([&] {
    try {
      if (mode == "badenv") {
        LaunchEnv e = env;
        e.world_size += 1;
        const std::string what = "a world size the environment contradicts: ConfigError";
        try {
          make_mpi_backend(e, Millis(5000));
          tally::check(what, false, "accepted");
        } catch (const ConfigError& x) {
          tally::check(what, true, x.what());
        }
        std::printf("mpi_available=%d\n", (int)mpi_available());
        return;
      }
      auto b = make_mpi_backend(env, Millis(20000));
      if (mode == "all") {
        test_all(*b);
        auto b2 = make_mpi_backend(env, Millis(20000));
        test_two_groups(*b, *b2);
      } else if (mode == "mismatch")
        test_mismatch(*b);
      else if (mode == "timeout")
        test_timeout(*b);
      else if (mode == "ring_timeout")
        test_ring_timeout(*b);
      else if (mode == "abort")
        test_abort(*b);
      else if (mode == "chunk")
        test_chunk(*b);
      else if (mode == "bench")
        test_bench(*b);
    } catch (const std::exception& e) {
      tally::check("mode " + mode + " ran without an unexpected exception", false, e.what());
    }
  });
  comm.join();
  return tally::finish(tally::format("/%d mode %s", env.world_size, mode.c_str()));
}
