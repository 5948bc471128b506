#include "comm/stall_inspector.h"

#include "comm/op_fingerprint.h"
#include "comm/store_channel.h"

#include <algorithm>
#include <condition_variable>
#include <cstdio>
#include <mutex>
#include <sstream>
#include <thread>

namespace lockstep::comm {

StallFinding find_stall(const std::vector<RankActivity>& ranks) {
  StallFinding f;
  for (const auto& a : ranks)
    if (a.known && a.last.seq > f.op.seq) f.op = a.last;
  if (f.op.seq == 0) return f;
  for (int r = 0; r < static_cast<int>(ranks.size()); ++r)
    (ranks[r].known && ranks[r].last.seq == f.op.seq ? f.entered : f.missing).push_back(r);
  if (f.missing.empty()) f = StallFinding{};
  return f;
}

double waited_in(const StallFinding& f, const std::vector<RankActivity>& ranks) {
  double w = -1;
  for (int r : f.entered)
    if (ranks[r].in_op_known && ranks[r].in_op) w = std::max(w, ranks[r].since_s);
  return w;
}

namespace {

constexpr size_t kListed = 16;  // ranks named one by one; larger groups are summarized

std::string rank_list(const std::vector<int>& rs) {
  std::ostringstream os;
  for (size_t i = 0; i < rs.size() && i < kListed; ++i) os << (i ? ", " : "") << rs[i];
  if (rs.size() > kListed) os << " and " << rs.size() - kListed << " more";
  return os.str();
}

std::string seconds(double s) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.1f s", s);
  return buf;
}

std::string describe_rank(int r, const RankActivity& a) {
  std::ostringstream os;
  os << "rank " << r;
  if (!a.known) {
    os << " did not answer (stopped, dead, or stuck outside lockstep's calls)";
  } else if (a.last.seq == 0) {
    os << " has entered no collective yet";
  } else {
    os << " last entered " << describe_op(a.last);
    if (a.since_s >= 0) os << ", " << seconds(a.since_s) << " ago";
    if (a.in_op_known && a.in_op) os << ", and is still in it";
  }
  return os.str();
}

}  // namespace

std::string format_stall(const StallFinding& f, const std::vector<RankActivity>& ranks,
                         double waited_s, double warn_s, double timeout_s) {
  const char* head = "lockstep: stall: ";
  std::ostringstream os;
  os << head << describe_op(f.op) << " has waited " << seconds(waited_s) << " for rank"
     << (f.missing.size() > 1 ? "s " : " ") << rank_list(f.missing) << " (entered by rank"
     << (f.entered.size() > 1 ? "s " : " ") << rank_list(f.entered) << "; it times out after "
     << seconds(timeout_s) << ", this warning repeats every " << seconds(warn_s)
     << ", LOCKSTEP_STALL_WARN_S)\n";
  for (size_t i = 0; i < f.missing.size() && i < kListed; ++i)
    os << head << "  " << describe_rank(f.missing[i], ranks[f.missing[i]]) << "\n";
  // Ranks that entered op #N with different fingerprints would meet a mismatch, not a stall.
  for (int r : f.entered)
    if (!same_fingerprint(ranks[r].last, f.op)) {
      os << head << "  and the ranks disagree on it: "
         << describe_mismatch(f.entered[0], f.op, r, ranks[r].last) << "\n";
      break;
    }
  return os.str();
}

std::string activity_to_text(const RankActivity& a, int64_t question) {
  std::ostringstream os;
  os << question << " " << (a.in_op ? 1 : 0) << " "
     << static_cast<int64_t>(a.since_s < 0 ? -1 : a.since_s * 1000) << " " << op_to_text(a.last);
  return os.str();
}

std::optional<RankActivity> activity_from_text(const std::string& s, int64_t& question) {
  std::istringstream is(s);
  int in_op = 0;
  int64_t since_ms = 0;
  if (!(is >> question >> in_op >> since_ms)) return std::nullopt;
  std::string rest;
  std::getline(is, rest);
  const auto op = op_from_text(rest);
  if (!op) return std::nullopt;
  RankActivity a;
  a.known = true;
  a.last = *op;
  a.in_op_known = true;
  a.in_op = in_op != 0;
  a.since_s = since_ms < 0 ? -1 : since_ms / 1000.0;
  return a;
}

// ---- the thread ----------------------------------------------------------------------

struct StallInspector::State {
  Config cfg;
  std::mutex mu;
  std::condition_variable cv;
  bool stop = false;
  bool done = false;  // the thread has left its loop
  // Its bookkeeping (the thread's only).
  Clock::time_point last_report{};
  Clock::time_point last_ask{};
  int64_t seen_question = 0;
  Clock::time_point question_at{};
  uint64_t tracked_seq = 0;  // shm: the stalled op first seen at tracked_since
  Clock::time_point tracked_since{};

  void run();
  bool tick(Clock::time_point now);  // false: nothing more to do
  void tick_segment(const RankActivity& mine, Clock::time_point now);
  void tick_store(const RankActivity& mine, Clock::time_point now);
  void tick_alone(const RankActivity& mine, Clock::time_point now);
  void report(const std::string& text) const {
    if (cfg.print) return cfg.print(text);
    std::fputs(text.c_str(), stderr);
    std::fflush(stderr);
  }
  bool due(Clock::time_point now) const {
    return last_report == Clock::time_point{} ||
           now - last_report >= std::chrono::duration<double>(cfg.warn_s * 0.95);
  }
  double since(Clock::time_point t, Clock::time_point now) const {
    return std::chrono::duration<double>(now - t).count();
  }
};

void StallInspector::State::run() {
  const auto period = std::chrono::duration_cast<Clock::duration>(
      std::chrono::duration<double>(std::clamp(cfg.warn_s / 4, 0.01, 15.0)));
  std::unique_lock<std::mutex> lock(mu);
  while (!stop) {
    cv.wait_for(lock, period, [&] { return stop; });
    if (stop) break;
    lock.unlock();
    bool more = false;
    try {
      more = tick(Clock::now());
    } catch (const std::exception&) {
      // The store went away (rank 0 exited) or broke: diagnostics end, the job does not.
      more = false;
    }
    lock.lock();
    if (!more) break;
  }
  done = true;
  cv.notify_all();
}

bool StallInspector::State::tick(Clock::time_point now) {
  const std::optional<RankActivity> mine = cfg.local();
  if (!mine) return false;
  if (cfg.peers) {
    tick_segment(*mine, now);
  } else if (cfg.store) {
    tick_store(*mine, now);
  } else {
    tick_alone(*mine, now);
  }
  return true;
}

void StallInspector::State::tick_segment(const RankActivity& mine, Clock::time_point now) {
  const std::vector<OpDesc> seen = cfg.peers();
  std::vector<RankActivity> ranks(cfg.size);
  for (int r = 0; r < cfg.size && r < static_cast<int>(seen.size()); ++r) {
    ranks[r].known = true;
    ranks[r].last = seen[r];
  }
  ranks[cfg.rank] = mine;
  const StallFinding f = find_stall(ranks);
  if (f.op.seq != tracked_seq) {
    tracked_seq = f.op.seq;
    tracked_since = now;
  }
  if (f.op.seq == 0) return;
  // We see the stall from the moment we first noticed it, or from our own entry.
  const double waited = std::max(since(tracked_since, now), waited_in(f, ranks));
  if (waited >= cfg.warn_s && due(now)) {
    report(format_stall(f, ranks, waited, cfg.warn_s, cfg.timeout_s));
    last_report = now;
  }
}

void StallInspector::State::tick_store(const RankActivity& mine, Clock::time_point now) {
  StoreChannel& ch = *cfg.store;
  const bool waiting = mine.in_op && mine.since_s >= cfg.warn_s / 2;
  int64_t q;
  if (waiting && since(last_ask, now) >= cfg.warn_s / 2) {
    q = ch.add("stall/ask", 1);  // a question: every rank posts its state
    last_ask = now;
  } else {
    q = ch.add("stall/ask", 0);
  }
  if (q != seen_question) {
    seen_question = q;
    question_at = now;
    ch.set("stall/state/" + std::to_string(cfg.rank), activity_to_text(mine, q));
  }
  if (cfg.rank != 0 || q == 0 || since(question_at, now) > cfg.warn_s * 1.5 || !due(now)) return;
  std::vector<RankActivity> ranks(cfg.size);
  ranks[0] = mine;
  for (int r = 1; r < cfg.size; ++r) {
    int64_t answered = 0;
    const auto text = ch.get_if("stall/state/" + std::to_string(r));
    const auto a = text ? activity_from_text(*text, answered) : std::nullopt;
    // An answer to a question older than the last two is stale: the rank stopped answering.
    if (a && answered >= q - 1) ranks[r] = *a;
  }
  const StallFinding f = find_stall(ranks);
  const double waited = waited_in(f, ranks);
  if (f.op.seq != 0 && waited >= cfg.warn_s * 0.9) {
    report(format_stall(f, ranks, waited, cfg.warn_s, cfg.timeout_s));
    last_report = now;
  }
}

void StallInspector::State::tick_alone(const RankActivity& mine, Clock::time_point now) {
  if (!(mine.in_op && mine.since_s >= cfg.warn_s && due(now))) return;
  std::ostringstream os;
  os << "lockstep: stall: rank " << cfg.rank << " has waited " << seconds(mine.since_s) << " in "
     << describe_op(mine.last) << " (it times out after " << seconds(cfg.timeout_s)
     << "); this backend cannot show the peers' state: the ranks that print no such line are "
        "the ones it waits for (LOCKSTEP_STALL_WARN_S)\n";
  report(os.str());
  last_report = now;
}

StallInspector::StallInspector(Config c) : state_(std::make_shared<State>()) {
  state_->cfg = std::move(c);
  const Config& cfg = state_->cfg;
  const bool active = cfg.size > 1 && cfg.warn_s > 0 && (!cfg.peers || cfg.rank == 0);
  if (!active) {
    state_->done = true;
    return;
  }
  std::thread([s = state_] { s->run(); }).detach();
}

StallInspector::~StallInspector() {
  std::unique_lock<std::mutex> lock(state_->mu);
  state_->stop = true;
  state_->cv.notify_all();
  // The segment view reads the backend: wait for that thread whatever it takes (it never
  // blocks). A store call may block on a stopped rank 0: leave that thread behind.
  if (state_->cfg.peers) {
    state_->cv.wait(lock, [&] { return state_->done; });
  } else {
    state_->cv.wait_for(lock, std::chrono::milliseconds(200), [&] { return state_->done; });
  }
}

}  // namespace lockstep::comm
