// Heartbeats and failure notices through the rendezvous store (see store_heartbeat.h).
#include "comm/backends/gloo/store_heartbeat.h"

#include <lockstep/error.h>

#include <unistd.h>

#include <cstdio>
#include <map>
#include <sstream>

namespace lockstep::comm {
namespace {

// A counter at or above this marks a rank that left cleanly (destroyed its group).
constexpr int64_t kLeft = int64_t{1} << 40;

std::string hb_key(int r) { return "hb/" + std::to_string(r); }

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::vector<uint8_t> bytes(const std::string& s) { return {s.begin(), s.end()}; }

// Publishes f as the group's failure unless another rank did first: the first notice
// names the culprit, later ones (often consequences of it) are dropped.
void publish(c10d::Store& store, const PeerFailure& f, int by) {
  if (store.add("nfailed", 1) != 1) return;
  store.set("failed", bytes(lockstep::detail::concat(f.peer, "\n", by, "\n", f.what)));
}

PeerFailure parse_notice(const std::vector<uint8_t>& v, int me) {
  std::istringstream in(std::string(v.begin(), v.end()));
  PeerFailure f;
  int by = -1;
  in >> f.peer >> by;
  in.ignore(1);
  std::getline(in, f.what);
  if (by != me) f.what += lockstep::detail::concat(" (noticed by rank ", by, ")");
  return f;
}

}  // namespace

StoreHeartbeat::StoreHeartbeat(const StorePtr& store, int rank, int size, ExternalNotice notice)
    : st_(std::make_shared<State>()), store_(store), rank_(rank), size_(size) {
  if (size <= 1) return;
  // The job's rank 0 hosts the store; in a subgroup it may have another rank, or none.
  int world_rank = -1;
  try {
    world_rank = LaunchEnv::from_environment().rank;
  } catch (const std::exception&) {
  }
  store->set("pid/" + std::to_string(rank),
             bytes(lockstep::detail::concat(::getpid(), " ", machine_id(), " ", world_rank)));
  std::vector<std::string> ids(size);
  std::vector<pid_t> pids(size, 0);
  for (int r = 0; r < size; ++r) {
    const auto v = store->get("pid/" + std::to_string(r));
    std::istringstream in(std::string(v.begin(), v.end()));
    int w = -1;
    in >> pids[r] >> ids[r] >> w;
    if (w == 0) store_host_ = r;
  }
  st_->local = PeerWatch(rank, ids, pids, kStale);
  thread_ = std::thread(run, st_, store, rank, size, store_host_, std::move(notice));
}

StoreHeartbeat::~StoreHeartbeat() {
  if (!thread_.joinable()) return;
  if (rank_ == store_host_) linger_for_acks();
  std::unique_lock<std::mutex> l(st_->mu);
  st_->stop = true;
  st_->cv.notify_all();
  // The goodbye is one store request; a store that does not answer (rank 0 stopped)
  // must not hold the program's exit: the thread then owns what it uses and ends later.
  if (st_->cv.wait_for(l, std::chrono::seconds(1), [&] { return st_->done; })) {
    l.unlock();
    thread_.join();
  } else {
    l.unlock();
    thread_.detach();
  }
}

void StoreHeartbeat::record(State& st, PeerFailure f) {
  if (!st.failure) st.failure = std::move(f);
}

std::optional<PeerFailure> StoreHeartbeat::failure() {
  std::lock_guard<std::mutex> l(st_->mu);
  if (!st_->failure) {
    std::string what;
    const int r = st_->local.check(&what);
    if (r >= 0) record(*st_, PeerFailure{r, what, false});
  }
  // The heartbeat thread stuck in a store call: the store (the job's rank 0) does not answer.
  if (!st_->failure && rank_ != store_host_ && thread_.joinable() && !st_->done &&
      st_->calling_since != Clock::time_point{} && Clock::now() - st_->calling_since > kStale) {
    const double s = std::chrono::duration<double>(Clock::now() - st_->calling_since).count();
    char buf[32];
    std::snprintf(buf, sizeof buf, "%.1f", s);
    record(*st_, PeerFailure{store_host_,
                             lockstep::detail::concat(
                                 "the rendezvous store, hosted by the job's rank 0, has "
                                 "not answered for ",
                                 buf, " s: rank 0 is stopped or its node is unreachable"),
                             false});  // no closed connection: no clean exit to wait for
  }
  return st_->failure;
}

std::optional<PeerFailure> StoreHeartbeat::failure_within(Millis patience) {
  // Only the heartbeat thread talks to the store: a call from here could wait forever on
  // the store's lock behind a request that a stopped rank 0 never answers. Ask it for a
  // round now (a remote death reaches the store's notice a moment after the socket broke).
  {
    std::lock_guard<std::mutex> l(st_->mu);
    st_->poll_now = true;
  }
  st_->cv.notify_all();
  const auto until = Clock::now() + patience;
  for (;;) {
    if (auto f = failure()) return f;
    if (Clock::now() >= until) return std::nullopt;
    std::this_thread::sleep_for(Millis(20));
  }
}

void StoreHeartbeat::linger_for_acks() {
  {
    std::lock_guard<std::mutex> l(st_->mu);
    if (!st_->failure || size_ <= 2) return;
  }
  // All but rank 0 and the failed rank; bounded, since more ranks may be gone.
  const auto until = Clock::now() + Millis(2000);
  try {
    while (Clock::now() < until && store_->add("acked", 0) < size_ - 2)
      std::this_thread::sleep_for(Millis(20));
  } catch (const std::exception&) {
  }
}

// The heartbeat thread: bump our counter, read the group's notice, check same-machine
// peers and (rank 0) everyone's counters, every kPeriod until stopped.
void StoreHeartbeat::run(std::shared_ptr<State> st, const StorePtr& store, int rank, int size,
                         int store_host, const ExternalNotice& notice) {
  std::map<int, std::pair<int64_t, Clock::time_point>> seen;  // rank 0: last count, when
  bool published = false;
  try {
    for (;;) {
      {
        std::unique_lock<std::mutex> l(st->mu);
        st->calling_since = {};  // not waiting on the store (a starved thread is no sign)
        if (st->cv.wait_for(l, kPeriod, [&] { return st->stop || st->poll_now; }) && st->stop)
          break;
        st->poll_now = false;
        st->calling_since = Clock::now();
      }
      store->add(hb_key(rank), 1);
      std::optional<PeerFailure> found;
      if (store->check({"failed"})) found = parse_notice(store->get("failed"), rank);
      if (!found && notice.store && notice.store->check({notice.key}))
        found = PeerFailure{-1, notice.describe(notice.store->get(notice.key)), false};
      {
        std::lock_guard<std::mutex> l(st->mu);
        std::string what;
        const int r = st->local.check(&what);
        if (!found && r >= 0) found = PeerFailure{r, what, false};
      }
      if (rank == 0 && !found) {
        const auto now = Clock::now();
        for (int r = 1; r < size && !found; ++r) {
          const int64_t c = store->add(hb_key(r), 0);
          auto it = seen.find(r);
          if (it == seen.end() || it->second.first != c) {
            seen[r] = {c, now};
          } else if (c < kLeft && now - it->second.second > kStale) {
            const double s = std::chrono::duration<double>(now - it->second.second).count();
            char buf[32];
            std::snprintf(buf, sizeof buf, "%.1f", s);
            found = PeerFailure{r,
                                lockstep::detail::concat("rank ", r, " sent no heartbeat for ", buf,
                                                         " s: it died, is stopped, or its node is "
                                                         "unreachable"),
                                false};
          }
        }
      }
      if (found) {
        if (!published) publish(*store, *found, rank);
        published = true;
        bool ack = false;
        {
          std::lock_guard<std::mutex> l(st->mu);
          record(*st, *found);
          ack = rank != store_host && !st->acked;
          st->acked = true;
        }
        if (ack) store->add("acked", 1);
      }
    }
    store->add(hb_key(rank), kLeft);  // goodbye: a clean leave is no failure
    bool ack = false;
    {
      std::lock_guard<std::mutex> l(st->mu);
      ack = rank != store_host && st->failure &&
            !st->acked;  // found by failure(), not by this thread
      st->acked = true;
    }
    if (ack) store->add("acked", 1);  // rank 0 may now close the store
  } catch (const std::exception& e) {
    // The job's rank 0 hosts the store: a broken connection means it is gone.
    std::lock_guard<std::mutex> l(st->mu);
    if (rank != store_host && !st->stop)
      record(*st,
             PeerFailure{store_host,
                         lockstep::detail::concat(
                             "lost the connection to the rendezvous store (", first_line(e.what()),
                             "): the job's rank 0, which hosts it, exited or its "
                             "node is unreachable"),
                         true});
  }
  std::lock_guard<std::mutex> l(st->mu);
  st->done = true;
  st->cv.notify_all();
}

}  // namespace lockstep::comm
