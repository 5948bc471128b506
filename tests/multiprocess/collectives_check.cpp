// Runs every collective on every dtype and size on the group that lockstep::init()
// builds from the launch environment, against closed-form expected values.
// Launched by ctest through lockstep-run (shm, gloo) or mpirun (mpi), world sizes 1-4.
//
// Rank r contributes (r+1) * f(i) with f(i) = i % 7 + 1: small integers, so every
// sum, max, min and average below is exact in every dtype, uint8 and bfloat16 included.
#include <lockstep/launch/cli.h>
#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <numeric>
#include <string>
#include <vector>

#include "tally_tensor.h"

namespace {

using namespace lockstep;
using comm::ReduceOp;

at::Tensor f_times(double scale, int64_t n, int64_t offset, at::ScalarType t) {
  auto i = at::arange(offset, offset + n, at::kLong);
  return ((i.remainder(7) + 1).to(at::kDouble) * scale).to(t);
}

// Point to point around `ring` (job ranks, this rank among them): each sends to the next
// and receives from the previous; even positions send first so blocking sends pair up.
void ring_exchange(ProcessGroup& pg, const std::vector<int>& ring, at::ScalarType t, int64_t n,
                   const std::string& tag) {
  const int m = static_cast<int>(ring.size());
  if (m < 2) return;
  const int i = static_cast<int>(std::find(ring.begin(), ring.end(), pg.rank()) - ring.begin());
  const int next = ring[(i + 1) % m], prev = ring[(i + m - 1) % m];
  auto out = f_times(pg.rank() + 1, n, 0, t);
  auto got = at::zeros({n}, t);
  if (i % 2 == 0) {
    pg.send(out, next, {7});
    pg.recv(got, prev, {7})->wait();
  } else {
    pg.recv(got, prev, {7})->wait();
    pg.send(out, next, {7})->wait();
  }
  tally::exact(tag + "send/recv", got, f_times(prev + 1, n, 0, t));
}

// The rings send/recv is tested on: every rank, except on hier, which carries pairs inside
// a node or between ranks of the same local rank: a ring of this node's ranks, then one of
// this local rank's counterparts on the other nodes.
std::vector<std::vector<int>> p2p_rings(const ProcessGroup& pg) {
  const int p = pg.size(), r = pg.rank();
  std::vector<int> all(p);
  std::iota(all.begin(), all.end(), 0);
  if (pg.backend_name() != "hier") return {all};
  // Ranks per node as init() read them, from whichever launcher started the job
  // (LOCAL_WORLD_SIZE under lockstep-run, OMPI_COMM_WORLD_LOCAL_SIZE under mpirun, ...).
  const int L = comm::LaunchEnv::from_environment().local_world_size;
  std::vector<int> node, across;
  for (int q = 0; q < p; ++q) {
    if (q / L == r / L) node.push_back(q);
    if (q % L == r % L) across.push_back(q);
  }
  return {node, across};
}

void run_case(ProcessGroup& pg, at::ScalarType t, int64_t n) {
  const int r = pg.rank();
  const int p = pg.size();
  const double tri = p * (p + 1) / 2.0;
  const std::string tag = comm::dtype_name(t) + " n=" + std::to_string(n) + " ";

  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max, ReduceOp::Min}) {
    if (op == ReduceOp::Avg && !at::isFloatingType(t)) continue;
    auto x = f_times(r + 1, n, 0, t);
    pg.allreduce(x, {op})->wait();
    const double scale = op == ReduceOp::Sum   ? tri
                         : op == ReduceOp::Avg ? tri / p
                         : op == ReduceOp::Max ? p
                                               : 1;
    tally::exact(tag + "allreduce " + comm::reduce_op_name(op), x, f_times(scale, n, 0, t));
  }

  // Coalesced: pieces of uneven sizes (one empty) whose boundaries fall inside the
  // backends' chunks and parts; each piece holds its slice of the flat pattern.
  for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max}) {
    if (op == ReduceOp::Avg && !at::isFloatingType(t)) continue;
    const int64_t cuts[] = {0, n / 7, n / 7, n / 2 + 3 > n ? n : n / 2 + 3, n};
    std::vector<at::Tensor> pieces;
    for (int k = 0; k + 1 < 5; ++k)
      pieces.push_back(f_times(r + 1, cuts[k + 1] - cuts[k], cuts[k], t));
    pg.allreduce_coalesced(pieces, {op})->wait();
    const double scale = op == ReduceOp::Sum ? tri : op == ReduceOp::Avg ? tri / p : p;
    for (int k = 0; k + 1 < 5; ++k)
      tally::exact(
          tag + "allreduce_coalesced " + comm::reduce_op_name(op) + " piece " + std::to_string(k),
          pieces[k], f_times(scale, cuts[k + 1] - cuts[k], cuts[k], t));
  }

  const int root = p - 1;
  auto b = r == root ? f_times(root + 1, n, 0, t) : at::zeros({n}, t);
  pg.broadcast(b, {root})->wait();
  tally::exact(tag + "broadcast", b, f_times(root + 1, n, 0, t));

  auto in = f_times(r + 1, n, 0, t);
  auto gathered = at::empty({n * p}, t);
  pg.allgather(gathered, in)->wait();
  std::vector<at::Tensor> parts;
  parts.reserve(p);
  for (int q = 0; q < p; ++q) parts.push_back(f_times(q + 1, n, 0, t));
  tally::exact(tag + "allgather", gathered, at::cat(parts));

  auto big = f_times(r + 1, n * p, 0, t);
  auto mine = at::empty({n}, t);
  pg.reduce_scatter(mine, big)->wait();
  tally::exact(tag + "reduce_scatter", mine, f_times(tri, n, int64_t(r) * n, t));

  auto a2a = at::empty({n * p}, t);
  pg.alltoall(a2a, big)->wait();
  parts.clear();
  for (int q = 0; q < p; ++q) parts.push_back(f_times(q + 1, n, int64_t(r) * n, t));
  tally::exact(tag + "alltoall", a2a, at::cat(parts));

  for (const auto& ring : p2p_rings(pg)) ring_exchange(pg, ring, t, n, tag);
  pg.barrier()->wait();
}

// Ranks disagree on the size of one allreduce: every rank must raise Mismatch.
int run_mismatch(ProcessGroup& pg) {
  auto x = at::ones({1000 + pg.rank()}, at::kFloat);
  const std::string what = "mismatched allreduce raises CommError(Mismatch)";
  try {
    pg.allreduce(x)->wait();
    tally::check(what, false, "it did not raise");
  } catch (const CommError& e) {
    tally::check(what, e.kind() == CommError::Kind::Mismatch,
                 std::string(CommError::kind_name(e.kind())) + ": " + e.what());
  }
  return tally::finish();
}

}  // namespace

// Subgroups (init_split): even and odd ranks, in rank order; collectives stay inside
// each, and run while the world group is used too.
void split_groups(ProcessGroup& world) {
  const int r = world.rank(), p = world.size();
  auto sub = lockstep::init_split(r % 2);
  const int members = (p - r % 2 + 1) / 2;
  tally::exact("split: size", at::scalar_tensor(sub->size()), at::scalar_tensor(members));
  tally::exact("split: rank", at::scalar_tensor(sub->rank()), at::scalar_tensor(r / 2));
  at::Tensor x = at::full({1000}, double(r + 1), at::kDouble);
  at::Tensor w = at::ones({3}, at::kDouble);
  auto ws = world.allreduce(w);
  sub->allreduce(x)->wait();
  ws->wait();
  double want = 0;  // the sum of (q + 1) over the ranks q of my parity
  for (int q = r % 2; q < p; q += 2) want += q + 1;
  tally::exact("split: allreduce inside the subgroup", x, at::full({1000}, want, at::kDouble));
  tally::exact("split: world alongside", w, at::full({3}, double(p), at::kDouble));
  at::Tensor g = at::empty({members}, at::kDouble);
  at::Tensor mine = at::full({1}, double(r), at::kDouble);
  sub->allgather(g, mine)->wait();
  tally::exact("split: allgather in world rank order", g, at::arange(r % 2, p, 2, at::kDouble));
}

// --die-in-split V: the world splits into even and odd ranks; rank V SIGKILLs itself before
// its subgroup's 4th allreduce. Its subgroup's other members must raise a CommError that
// names it (tests/multiprocess/CMakeLists.txt checks the text); the launcher ends the job.
int die_in_split(ProcessGroup& world, int victim) {
  auto sub = lockstep::init_split(world.rank() % 2);
  for (int i = 0; i < 40; ++i) {
    if (world.rank() == victim && i == 3) std::raise(SIGKILL);
    at::Tensor x = at::ones({1000});
    try {
      sub->allreduce(x)->wait();
    } catch (const lockstep::CommError& e) {
      std::printf("rank %d caught CommError in its subgroup: %s\n", world.rank(), e.what());
      std::fflush(stdout);
      return 3;
    }
  }
  return 0;
}

int main(int argc, char** argv) {
  CLI::App app{
      "collectives_check: every collective on every dtype and size against closed-form "
      "values, on the group lockstep::init() builds (run under lockstep-run or mpirun)",
      "collectives_check"};
  bool mismatch = false;
  std::string expect_backend;
  int die_victim = -1;
  app.add_flag("--mismatch", mismatch,
               "instead: ranks issue mismatched collectives, which must raise CommError(Mismatch)");
  app.add_option("--die-in-split", die_victim,
                 "instead: this rank dies during a subgroup's allreduce (see die_in_split)");
  app.add_option("--expect-backend", expect_backend,
                 "also check that init() picked this backend (e.g. shm under mpirun on one node)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  try {
    auto pg = lockstep::init();
    tally::rank = pg->rank();
    if (mismatch) return run_mismatch(*pg);
    if (die_victim >= 0) return die_in_split(*pg, die_victim);
    if (!expect_backend.empty())
      tally::check("backend is " + expect_backend, pg->backend_name() == expect_backend,
                   "init() picked " + pg->backend_name());
    const at::ScalarType types[] = {at::kFloat, at::kDouble, at::kBFloat16, at::kHalf,
                                    at::kInt,   at::kLong,   at::kByte};
    for (int64_t n : {0L, 1L, 1000L, 1L << 20})
      for (auto t : types) run_case(*pg, t, n);
    // Large and uneven: several of the backends' chunks, segments and ring blocks.
    const int64_t big = (5L << 20) + 3;
    for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Max}) {
      auto x = f_times(pg->rank() + 1, big, 0, at::kFloat);
      pg->allreduce(x, {op})->wait();
      const int p = pg->size();
      tally::exact(std::string("large allreduce ") + comm::reduce_op_name(op), x,
                   f_times(op == ReduceOp::Sum ? p * (p + 1) / 2.0 : p, big, 0, at::kFloat));
    }
    // Shared memory: defined exactly on shm with several ranks; an allreduce of a
    // slice of it (the zero-copy path on shm) is exact, and the memory stays usable.
    {
      const int p = pg->size();
      at::Tensor sh = pg->alloc_shared(big + 64, at::kFloat);
      const bool want = p > 1 && pg->backend_name() == "shm";
      tally::exact(std::string("alloc_shared defined: ") + (want ? "yes" : "no"),
                   at::scalar_tensor(sh.defined() ? 1 : 0), at::scalar_tensor(want ? 1 : 0));
      if (sh.defined()) {
        for (ReduceOp op : {ReduceOp::Sum, ReduceOp::Avg}) {
          at::Tensor x = sh.narrow(0, 32, big);
          x.copy_(f_times(pg->rank() + 1, big, 0, at::kFloat));
          pg->allreduce(x, {op})->wait();
          tally::exact(
              std::string("shared allreduce ") + comm::reduce_op_name(op), x,
              f_times(op == ReduceOp::Sum ? p * (p + 1) / 2.0 : (p + 1) / 2.0, big, 0, at::kFloat));
        }
      }
    }
    // A second group beside the first (same launch environment, same store): ops on
    // both interleave without crosstalk.
    auto pg2 = lockstep::init();
    auto a = f_times(pg->rank() + 1, 4096, 0, at::kFloat);
    auto b = f_times(2 * (pg->rank() + 1), 4096, 0, at::kFloat);
    auto wa = pg->allreduce(a);
    auto wb = pg2->allreduce(b);
    wb->wait();
    wa->wait();
    const double tri = pg->size() * (pg->size() + 1) / 2.0;
    tally::exact("two groups: first", a, f_times(tri, 4096, 0, at::kFloat));
    tally::exact("two groups: second", b, f_times(2 * tri, 4096, 0, at::kFloat));
    split_groups(*pg);
    return tally::finish("/" + std::to_string(pg->size()) + " [" + pg->backend_name() + "]");
  } catch (const std::exception& e) {
    std::fprintf(stderr, "collectives_check: %s\n", e.what());
    return 1;
  }
}
