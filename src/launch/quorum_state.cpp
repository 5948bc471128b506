// The quorum service's rules; see quorum_state.h and docs/fault-tolerance.md.
#include "quorum_state.h"

#include <algorithm>

#include "lockstep/error.h"

namespace lockstep::launch {
namespace {

using lockstep::detail::concat;

double seconds(std::chrono::steady_clock::duration d) {
  return std::chrono::duration<double>(d).count();
}

std::string id_list(const std::vector<int>& ids) {
  std::string s;
  for (int id : ids) s += (s.empty() ? "" : ",") + std::to_string(id);
  return s;
}

}  // namespace

void QuorumState::hello(int conn, int id, const std::string& host, int port, Clock::time_point now,
                        int min_replicas) {
  if (min_replicas > config_.min_replicas) {
    config_.min_replicas = min_replicas;
    min_from_ = id;
  }
  for (auto& [c, r] : replicas_)
    if (r.id == id && c != conn) {
      drop(c, "a new connection of the same replica replaced it");
      break;
    }
  left_[id] = false;
  Replica& r = replicas_[conn];
  r.id = id;
  r.serial = ++serials_;  // a restarted replica is a new incarnation, not its former self
  r.host = host;
  r.port = port;
  r.last_heard = now;
  if (stopped()) send(conn, "STOP " + stop_reason_);
}

// Where the minimum came from, for the STOP line.
std::string QuorumState::min_name() const {
  return min_from_ < 0 ? "--min-replicas" : concat("min_replicas (replica ", min_from_, "'s)");
}

void QuorumState::heard(int conn, Clock::time_point now) {
  auto it = replicas_.find(conn);
  if (it != replicas_.end()) it->second.last_heard = now;
}

void QuorumState::request(int conn, int64_t step, Clock::time_point now) {
  auto it = replicas_.find(conn);
  if (it == replicas_.end()) return;  // no HELLO yet: the server refuses such a line
  if (stopped()) {
    send(conn, "STOP " + stop_reason_);
    return;
  }
  it->second.asking = true;
  it->second.step = step;
  it->second.asked_at = now;
}

void QuorumState::vote(int conn, int64_t quorum_id, int64_t step, bool ok, Clock::time_point) {
  auto it = replicas_.find(conn);
  if (it == replicas_.end()) return;
  const uint64_t me = it->second.serial;
  const std::string no = concat("VOTE ", quorum_id, " ", step, " 0");
  if (quorum_id != quorum_id_ || members_.count(me) == 0) {
    send(conn, no);  // a stale quorum: its step cannot commit
    return;
  }
  if (round_.step != step) round_ = Round{step, {}, false, false};
  if (round_.decided) {
    send(conn, concat("VOTE ", quorum_id, " ", step, " ", round_.outcome ? 1 : 0));
    return;
  }
  round_.votes[me] = ok;
  // A member that is gone (lost, or left) will never vote: the step cannot commit.
  bool all_in = true;
  for (uint64_t m : members_) all_in = all_in && (round_.votes.count(m) || alive(m));
  if (!all_in) {
    decide(false);
    return;
  }
  if (round_.votes.size() < members_.size()) return;
  bool all = true;
  for (const auto& [voter, v] : round_.votes) all = all && v;
  decide(all);
}

bool QuorumState::holder_alive() const {
  for (uint64_t m : holders_)
    if (alive(m)) return true;
  return false;
}

bool QuorumState::alive(uint64_t serial) const {
  for (const auto& [c, r] : replicas_)
    if (r.serial == serial) return true;
  return false;
}

// The round's outcome, to every member that voted (the others get it when they vote).
void QuorumState::decide(bool commit) {
  round_.decided = true;
  round_.outcome = commit;
  if (commit) {
    committed_ = std::max(committed_, round_.step + 1);
    holders_ = members_;
  } else
    renew_ = true;
  for (const auto& [c, r] : replicas_)
    if (round_.votes.count(r.serial))
      send(c, concat("VOTE ", quorum_id_, " ", round_.step, " ", commit ? 1 : 0));
}

void QuorumState::lost(int conn) { drop(conn, "its connection closed (the process ended?)"); }

void QuorumState::bye(int conn, int64_t step) {
  auto it = replicas_.find(conn);
  if (it == replicas_.end()) return;
  const int id = it->second.id;
  const uint64_t serial = it->second.serial;
  log_.push_back(concat("replica ", id, " left (done after ", step, " steps)"));
  left_[id] = true;
  if (step >= committed_ && committed_ > 0) finished_ = true;
  replicas_.erase(it);
  closed_.push_back(conn);
  member_gone(serial);
}

bool QuorumState::all_left() const {
  if (!finished_ || !replicas_.empty()) return false;
  for (const auto& [id, left] : left_)
    if (!left) return false;
  return true;
}

void QuorumState::drop(int conn, const std::string& why) {
  auto it = replicas_.find(conn);
  if (it == replicas_.end()) return;
  const int id = it->second.id;
  const uint64_t serial = it->second.serial;
  replicas_.erase(it);
  closed_.push_back(conn);
  log_.push_back(concat("replica ", id, " lost: ", why));
  member_gone(serial);
}

// A member of the quorum gone mid-vote: the step cannot commit anywhere.
void QuorumState::member_gone(uint64_t serial) {
  if (members_.count(serial) && !round_.decided && round_.step >= 0) decide(false);
}

std::vector<QuorumState::Message> QuorumState::advance(Clock::time_point now) {
  std::vector<int> silent;
  for (const auto& [c, r] : replicas_)
    if (now - r.last_heard > config_.heartbeat_timeout) silent.push_back(c);
  for (int c : silent)
    drop(c, concat("no heartbeat for ", seconds(now - replicas_[c].last_heard),
                   " s (stopped, hung, or cut off)"));
  try_form(now);
  std::vector<Message> out;
  out.swap(out_);
  return out;
}

void QuorumState::try_form(Clock::time_point now) {
  if (stopped()) return;
  std::vector<int> askers;
  Clock::time_point first = now;
  bool waiting_for_member = false;
  for (const auto& [c, r] : replicas_) {
    if (r.asking) {
      askers.push_back(c);
      first = std::min(first, r.asked_at);
    } else if (members_.count(r.serial)) {
      waiting_for_member = true;
    }
  }
  if (askers.empty()) return;
  const auto waited = now - first;
  const bool ready = formed_once_
                         ? !waiting_for_member || waited >= config_.straggler_wait
                         : int(askers.size()) >= config_.expected || waited >= config_.join_wait;
  if (!ready) return;
  int64_t furthest = 0;
  for (int c : askers) furthest = std::max(furthest, replicas_[c].step);
  // Never go back: a quorum must hold someone with the last committed state to heal from.
  // When the replicas that held it finished the job and left, the askers are too late.
  if (furthest < committed_) {
    if (finished_)
      for (int c : askers) {
        replicas_[c].asking = false;
        send(c, concat("DONE ", committed_));
      }
    else if (!holder_alive())
      stop(concat("every replica that held step ", committed_,
                  "'s state is gone (the last "
                  "ones at once, or while the others were down): the job cannot heal; "
                  "restart it from its last checkpoint"));
    return;
  }
  if (int(askers.size()) < config_.min_replicas) {
    std::vector<int> ids;
    ids.reserve(askers.size());
    for (int c : askers) ids.push_back(replicas_[c].id);
    std::sort(ids.begin(), ids.end());
    stop(formed_once_ ? concat("fewer than ", min_name(), " ", config_.min_replicas,
                               " replicas remain (", ids.size(), ": ", id_list(ids), ")")
                      : concat("only ", ids.size(), " replicas (", id_list(ids), ") of the ",
                               min_name(), " ", config_.min_replicas, " needed came within ",
                               seconds(config_.join_wait), " s"));
    return;
  }
  form(askers);
}

void QuorumState::form(const std::vector<int>& conns) {
  quorum_wire::Quorum q;
  std::set<uint64_t> serials;
  for (int c : conns) {
    const Replica& r = replicas_[c];
    serials.insert(r.serial);
    q.members.push_back({r.id, r.step, r.host, r.port});
    q.max_step = std::max(q.max_step, r.step);
  }
  std::sort(q.members.begin(), q.members.end(),
            [](const quorum_wire::Member& a, const quorum_wire::Member& b) { return a.id < b.id; });
  if (!formed_once_ || serials != members_ || renew_) {
    ++quorum_id_;
    renew_ = false;
    members_ = serials;
    round_ = Round{};
    std::vector<int> ids;
    for (const auto& m : q.members) ids.push_back(m.id);
    log_.push_back(concat("quorum ", quorum_id_, ": replicas ", id_list(ids), " (", ids.size(),
                          ") from step ", q.max_step));
  }
  formed_once_ = true;
  for (int c : conns)  // those at the committed step hold its state
    if (replicas_[c].step >= committed_) holders_.insert(replicas_[c].serial);
  q.id = quorum_id_;
  const std::string line = quorum_wire::format_quorum(q);
  for (int c : conns) {
    replicas_[c].asking = false;
    send(c, line);
  }
}

void QuorumState::stop(const std::string& why) {
  stop_reason_ = why;
  log_.push_back("stopping the job: " + why);
  for (const auto& [c, r] : replicas_) send(c, "STOP " + why);
}

std::vector<int> QuorumState::take_closed() {
  std::vector<int> out;
  out.swap(closed_);
  return out;
}

std::vector<std::string> QuorumState::take_log() {
  std::vector<std::string> out;
  out.swap(log_);
  return out;
}

}  // namespace lockstep::launch
