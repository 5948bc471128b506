// The fault-tolerant step: quorum, group rebuild, healing, commit vote. See
// include/lockstep/parallel/ft/manager.h and docs/fault-tolerance.md.
#include <lockstep/comm/make_group.h>
#include <lockstep/env_contract.h>
#include <lockstep/parallel/ft/manager.h>

#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <cstdlib>
#include <exception>
#include <map>
#include <sstream>

namespace lockstep::ft {
namespace {

using lockstep::detail::concat;
using Clock = std::chrono::steady_clock;

double since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

std::string env_or(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? v : fallback;
}

constexpr int kHealTag = 7301;

// HSDP: a collective inside the replica failed, so one of its ranks is lost: the replica's
// end, not the step's.
[[noreturn]] void replica_lost(const std::exception& e) {
  throw Error(concat("fault tolerance: this replica lost one of its ranks (", e.what(),
                     "); lockstep-run restarts the replica's ranks together"));
}

// HSDP: the replica's rank 0 sends `text` to its other ranks.
void share_in_replica(comm::ProcessGroup& g, std::string& text) {
  try {
    at::Tensor size = at::full({1}, int64_t(text.size()), at::kLong);
    g.broadcast(size)->wait();
    text.resize(size_t(size.item<int64_t>()));
    at::Tensor bytes = at::from_blob(text.data(), {int64_t(text.size())}, at::kByte);
    if (!text.empty()) g.broadcast(bytes)->wait();
  } catch (const std::exception& e) {
    replica_lost(e);
  }
}

// The joiner's own StateFns::load failed: not a failure of the step (which a retry would
// cure) but of this replica (the state does not fit it), so it leaves start_step().
struct LoadFailed {
  std::exception_ptr error;
};

}  // namespace

Manager::Manager(ManagerOptions options, StateFns state)
    : options_(std::move(options)), state_(std::move(state)) {
  if (options_.coordinator.empty()) options_.coordinator = env_or(env::kCoordinator, "");
  if (options_.coordinator.empty())
    throw ConfigError(concat("fault tolerance: no quorum service: ", env::kCoordinator,
                             " is not set; start the job with lockstep-run --fault-tolerant "
                             "(or set ManagerOptions::coordinator)"));
  replica_id_ = options_.replica_id;
  if (replica_id_ < 0) replica_id_ = std::atoi(env_or(env::kReplicaId, "-1").c_str());
  if (replica_id_ < 0)
    throw ConfigError(concat("fault tolerance: no replica id: ", env::kReplicaId,
                             " is not set (lockstep-run --fault-tolerant sets it)"));
  LOCKSTEP_CHECK(state_.save && state_.load,
                 "fault tolerance: StateFns needs both save and load (a joiner is healed "
                 "with them)");
  if (options_.replica_group) {
    shard_ = options_.replica_group->rank();
    shards_ = options_.replica_group->size();
  }
  const int launched = std::atoi(env_or(env::kReplicaSize, "1").c_str());
  if (launched > 1 && shards_ != launched)
    throw ConfigError(concat(
        "fault tolerance: this replica was started as ", launched,
        " ranks (lockstep-run --replica-size ", launched, ") but the Manager was given ",
        options_.replica_group ? concat("a group of ", shards_) : std::string("no replica group"),
        ": pass the replica's own group (lockstep::init()) as "
        "ManagerOptions::replica_group"));
  step_ = options_.start_step;
  if (shard_ != 0) return;  // the replica's rank 0 speaks for it
  client_ = std::make_unique<QuorumClient>(options_.coordinator, options_.heartbeat);
  // The others reach this replica's store where the service reached it.
  host_ = client_->local_host();
  c10d::TCPStoreOptions so;
  so.port = 0;
  so.isServer = true;
  so.waitWorkers = false;
  so.timeout = options_.timeout;
  auto store = c10::make_intrusive<c10d::TCPStore>(host_, so);
  const int port = store->getPort();
  own_store_ = store;
  client_->hello(replica_id_, host_, port, options_.min_replicas);
}

Manager::~Manager() {
  // Done (BYE) or failed (an exception unwinds: close without a word, so the service counts
  // the replica lost, and restarts can heal it).
  if (client_ && std::uncaught_exceptions() == 0) client_->bye(step_);
  client_.reset();  // first: the others must not wait for this replica
  group_.reset();
}

comm::ProcessGroup& Manager::group() {
  LOCKSTEP_CHECK(group_ != nullptr, "fault tolerance: group() before the first start_step()");
  return *group_;
}

bool Manager::start_step() {
  step_start_ = Clock::now();
  failed_ = false;
  last_error_.clear();
  const quorum_wire::Quorum q = ask_quorum();
  if (q.done) return false;
  members_.clear();
  rank_ = -1;
  for (const auto& m : q.members) {
    if (m.id == replica_id_) rank_ = int(members_.size());
    members_.push_back(m.id);
  }
  if (rank_ < 0)
    throw QuorumError("fault tolerance: the quorum service left this replica out", false);
  const bool stale = q.id != quorum_id_ || need_rebuild_ || !group_ || group_->broken();
  quorum_id_ = q.id;
  quorum_step_ = q.max_step;
  try {
    if (stale) rebuild(q);
    heal(q);
  } catch (const LoadFailed& f) {
    std::rethrow_exception(f.error);
  } catch (const std::exception& e) {
    fail(e.what());
  }
  // HSDP: a replica is healed whole or not at all (one of its ranks may have received its
  // shard and another not, when a healer died): behind on any rank, behind on all, so the
  // next quorum heals the whole replica again.
  if (shards_ > 1 && q.members[size_t(rank_)].step != q.max_step) {
    try {
      at::Tensor step = at::full({1}, step_, at::kLong);
      options_.replica_group->allreduce(step, {comm::ReduceOp::Min})->wait();
      step_ = step.item<int64_t>();
    } catch (const std::exception& e) {
      replica_lost(e);
    }
  }
  if (step_ != quorum_step_ && !failed_)
    fail("this replica is behind its quorum and was not healed");
  return true;
}

// The step's quorum: from the service, or (HSDP, shard > 0) from the replica's rank 0, which
// passes on the service's answer, DONE or STOP alike.
quorum_wire::Quorum Manager::ask_quorum() {
  if (shards_ == 1) return client_->quorum(step_, options_.quorum_timeout);
  const std::string text = from_leader([&] {
    const quorum_wire::Quorum q = client_->quorum(step_, options_.quorum_timeout);
    return q.done ? concat("DONE ", q.max_step) : quorum_wire::format_quorum(q);
  });
  quorum_wire::Quorum q;
  if (text.rfind("DONE ", 0) == 0) {
    q.done = true;
    q.max_step = std::stoll(text.substr(5));
  } else if (!quorum_wire::parse_quorum(text, &q)) {
    throw Error("fault tolerance: the replica's rank 0 passed on a malformed quorum: " + text);
  }
  return q;
}

void Manager::rebuild(const quorum_wire::Quorum& q) {
  const auto t0 = Clock::now();
  group_.reset();        // a broken group aborts its backend on the way out
  need_rebuild_ = true;  // until this succeeds
  const quorum_wire::Member& leader = q.members.front();
  c10::intrusive_ptr<c10d::Store> store = own_store_;
  if (leader.id != replica_id_ || shard_ != 0) {
    c10d::TCPStoreOptions so;
    so.port = uint16_t(leader.port);
    so.isServer = false;
    so.timeout = options_.timeout;
    store = c10::make_intrusive<c10d::TCPStore>(leader.host, so);
  }
  // Where each member sits on its host (members are in replica id order, which lockstep-run
  // numbers node by node): what hier needs to know.
  std::map<std::string, int> per_host;
  comm::LaunchEnv e;
  e.rank = rank_;
  e.world_size = int(q.members.size());
  for (const auto& m : q.members) {
    if (m.id == replica_id_) e.local_rank = per_host[m.host];
    ++per_host[m.host];
  }
  e.local_world_size = per_host[q.members[size_t(rank_)].host];
  comm::InitOptions io;
  io.timeout = options_.timeout;
  std::string backend = options_.backend;
  if (backend == "auto") backend = env_or(env::kBackend, "auto");
  // Several hosts: hier, which is gloo across all where the hosts hold unequal numbers of
  // members (after a loss, until the heal) or one each.
  if (backend == "auto") backend = per_host.size() == 1 ? "shm" : "hier";
  io.backend = backend;
  io.env = e;
  // One group per shard: rank s of every member replica (all of them when a replica is one
  // rank).
  group_ = comm::make_group(store, io, concat("lockstep-ft/q", q.id, "/s", shard_, "/"));
  need_rebuild_ = false;
  if (stats_.rebuilds++ > 0) stats_.rebuild_s += since(t0);  // the first is not a loss
}

// Replicas behind the quorum's furthest step take the state of one that is there: the
// k-th of them (by replica id) from the (k mod H)-th of the H up to date, by id.
void Manager::heal(const quorum_wire::Quorum& q) {
  std::vector<int> healers, behind;
  for (size_t i = 0; i < q.members.size(); ++i)
    (q.members[i].step == q.max_step ? healers : behind).push_back(int(i));
  if (behind.empty()) return;
  std::string bytes;
  for (size_t k = 0; k < behind.size(); ++k) {
    const int from = healers[k % healers.size()], to = behind[k];
    if (from == rank_) {
      if (bytes.empty()) {
        torch::serialize::OutputArchive ar;
        state_.save(ar);
        std::ostringstream os;
        ar.save_to(os);
        bytes = os.str();
      }
      at::Tensor size = at::full({1}, int64_t(bytes.size()), at::kLong);
      at::Tensor data = at::from_blob(bytes.data(), {int64_t(bytes.size())}, at::kByte);
      group_->send(size, to, {kHealTag})->wait();
      group_->send(data, to, {kHealTag})->wait();
      ++stats_.healed_others;
    } else if (to == rank_) {
      const auto t0 = Clock::now();
      at::Tensor size = at::zeros({1}, at::kLong);
      group_->recv(size, from, {kHealTag})->wait();
      at::Tensor data = at::empty({size.item<int64_t>()}, at::kByte);
      group_->recv(data, from, {kHealTag})->wait();
      std::istringstream is(std::string(static_cast<const char*>(data.data_ptr()), data.numel()));
      torch::serialize::InputArchive ar;
      try {
        ar.load_from(is);
        state_.load(ar);
      } catch (...) {
        throw LoadFailed{std::current_exception()};
      }
      step_ = q.max_step;
      ++stats_.heals;
      stats_.heal_s += since(t0);
      stats_.heal_bytes += data.numel();
    }
  }
}

void Manager::allreduce(const std::vector<at::Tensor>& tensors) {
  if (failed_) return;
  try {
    std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;
    for (const auto& t : tensors) by_dtype[t.scalar_type()].push_back(t);
    for (auto& [dtype, ts] : by_dtype)
      group_->allreduce_coalesced(ts, {comm::ReduceOp::Avg})->wait();
  } catch (const std::exception& e) {
    fail(e.what());
  }
}

void Manager::report_error(const std::exception_ptr& error) {
  try {
    std::rethrow_exception(error);
  } catch (const std::exception& e) {
    fail(e.what());
  } catch (...) {
    fail("an unknown error");
  }
}

void Manager::fail(const std::string& why) {
  if (failed_) return;
  failed_ = true;
  need_rebuild_ = true;
  last_error_ = why;
  // The others may wait in a collective this replica will not finish: wake them.
  if (group_ && !group_->broken())
    group_->abort(std::make_exception_ptr(Error(
        "fault tolerance: replica " + std::to_string(replica_id_) + " failed its step: " + why)));
}

bool Manager::should_commit() {
  // Every member votes on the quorum's step (a replica that could not be healed is behind
  // it and votes no), so the service counts one round.
  const bool commit = vote(!failed_);
  if (commit) {
    history_.push_back({step_, quorum_id_, members_});
    ++step_;
    ++stats_.committed;
  } else {
    if (last_error_.empty())
      last_error_ = "the quorum service said no: another member failed or left during the step";
    ++stats_.discarded;
    stats_.discarded_s += since(step_start_);
  }
  return commit;
}

// The service's decision on this replica's vote. HSDP: the replica votes ok only when each
// of its ranks does, and its rank 0 passes the decision on.
bool Manager::vote(bool ok) {
  if (shards_ == 1) return client_->vote(quorum_id_, quorum_step_, ok, options_.quorum_timeout);
  try {
    at::Tensor all_ok = at::full({1}, ok ? 1 : 0, at::kInt);
    options_.replica_group->allreduce(all_ok, {comm::ReduceOp::Min})->wait();
    ok = all_ok.item<int>() == 1;
  } catch (const std::exception& e) {
    replica_lost(e);
  }
  return from_leader([&] {
           return client_->vote(quorum_id_, quorum_step_, ok, options_.quorum_timeout) ? "1" : "0";
         }) == "1";
}

// HSDP: `ask` runs on the replica's rank 0, which talks to the service; its answer, or the
// service's STOP, reaches the replica's other ranks.
std::string Manager::from_leader(const std::function<std::string()>& ask) {
  std::string text;
  std::exception_ptr error;
  if (shard_ == 0) {
    try {
      text = ask();
    } catch (const QuorumError& e) {
      error = std::current_exception();
      text = concat("STOP ", e.stopped() ? 1 : 0, " ", e.what());
    }
  }
  share_in_replica(*options_.replica_group, text);
  if (error) std::rethrow_exception(error);
  if (text.rfind("STOP ", 0) == 0) throw QuorumError(text.substr(7), text[5] == '1');
  return text;
}

}  // namespace lockstep::ft
