// Departure notices: see mpi_departure.h.
#include "comm/backends/mpi/mpi_departure.h"

#include "comm/backends/mpi/mpi_runtime.h"

#include <lockstep/error.h>

#include <array>
#include <atomic>
#include <map>

namespace lockstep::comm::mpi {
namespace {

constexpr int kTag = 7;
// [exit status, number of groups n, last collective entered in group 0 .. n-1]
using Notice = std::array<int64_t, kMaxGroups + 2>;

struct Left {
  Notice notice{};
  Clock::time_point seen;
};

// All but g_last guarded by call_lock().
bool g_on = false;
MPI_Comm g_comm = MPI_COMM_NULL;
MPI_Request g_req = MPI_REQUEST_NULL;
Notice g_incoming{};
int g_groups = 0;
std::map<int, Left> g_left;  // by world rank
std::array<std::atomic<uint64_t>, kMaxGroups> g_last{};

void post_receive_locked() {
  MPI_Irecv(g_incoming.data(), static_cast<int>(g_incoming.size()), MPI_INT64_T, MPI_ANY_SOURCE,
            kTag, g_comm, &g_req);
}

void poll_locked() {
  if (!g_on || g_req == MPI_REQUEST_NULL) return;
  for (;;) {
    int done = 0;
    MPI_Status st;
    if (MPI_Test(&g_req, &done, &st) != MPI_SUCCESS || !done) return;
    g_left[st.MPI_SOURCE] = Left{g_incoming, Clock::now()};
    post_receive_locked();
  }
}

std::string describe(int group_rank, int world_rank, bool subgroup, const Left& l) {
  std::string who = lockstep::detail::concat("rank ", group_rank);
  if (subgroup) who += lockstep::detail::concat(" [world rank ", world_rank, "]");
  const int64_t status = l.notice[0];
  return lockstep::detail::concat(who, " left the job: it reached MPI_Finalize (exit status ",
                                  status, status != 0 ? ", after an error of its own" : "",
                                  ") without taking part in this op");
}

}  // namespace

void start_departures_locked() {
  if (MPI_Comm_dup(MPI_COMM_WORLD, &g_comm) != MPI_SUCCESS) return;  // no notices, no harm
  MPI_Comm_set_errhandler(g_comm, MPI_ERRORS_RETURN);
  g_on = true;
  post_receive_locked();
}

int register_group_locked() {
  if (!g_on || g_groups >= kMaxGroups) return -1;
  return g_groups++;
}

void entered(int group, uint64_t seq) noexcept {
  if (group >= 0 && group < kMaxGroups) g_last[group].store(seq, std::memory_order_relaxed);
}

int departed_member(int group, uint64_t seq, Clock::time_point op_start,
                    const std::vector<int>& world_ranks, std::string* what) {
  std::lock_guard<std::mutex> g(call_lock());
  if (!g_on) return -1;
  poll_locked();
  const auto now = Clock::now();
  for (const auto& [world_rank, l] : g_left) {
    int member = world_rank;
    if (!world_ranks.empty()) {
      member = -1;
      for (size_t i = 0; i < world_ranks.size(); ++i)
        if (world_ranks[i] == world_rank) member = static_cast<int>(i);
      if (member < 0) continue;
    }
    const bool numbered = group >= 0 && seq > 0 && group < l.notice[1];
    const bool never_came = numbered ? static_cast<uint64_t>(l.notice[2 + group]) < seq
                                     : now - std::max(op_start, l.seen) >= kUnnumberedGrace;
    if (!never_came) continue;
    *what = describe(member, world_rank, !world_ranks.empty(), l);
    return member;
  }
  return -1;
}

void announce_departure_locked(int status) noexcept {
  if (!g_on) return;
  poll_locked();
  Notice n{};
  n[0] = status;
  n[1] = g_groups;
  for (int i = 0; i < g_groups; ++i) n[2 + i] = static_cast<int64_t>(g_last[i].load());
  int me = 0, size = 1;
  MPI_Comm_rank(g_comm, &me);
  MPI_Comm_size(g_comm, &size);
  std::vector<MPI_Request> sends;
  for (int r = 0; r < size; ++r) {
    if (r == me || g_left.count(r)) continue;  // a rank that left already is in MPI_Finalize
    MPI_Request req = MPI_REQUEST_NULL;
    if (MPI_Isend(n.data(), static_cast<int>(n.size()), MPI_INT64_T, r, kTag, g_comm, &req) ==
        MPI_SUCCESS)
      sends.push_back(req);
  }
  // Small messages go out eagerly; give them a moment, then let MPI_Finalize finish them.
  const auto until = Clock::now() + std::chrono::milliseconds(200);
  for (MPI_Request& req : sends) {
    int done = 0;
    while (req != MPI_REQUEST_NULL && MPI_Test(&req, &done, MPI_STATUS_IGNORE) == MPI_SUCCESS &&
           !done && Clock::now() < until) {
    }
    if (req != MPI_REQUEST_NULL) MPI_Request_free(&req);
  }
  if (g_req != MPI_REQUEST_NULL) {
    MPI_Cancel(&g_req);
    MPI_Wait(&g_req, MPI_STATUS_IGNORE);
  }
  g_on = false;
}

}  // namespace lockstep::comm::mpi
