// lockstep/parallel/ft/manager.h: training that survives lost replicas without stopping.
//
// A fault-tolerant job is R replicas of the model state (under DDP one rank each, under
// HSDP one shard group each: ManagerOptions::replica_group). At
// every step boundary each replica asks the quorum service who takes part in the step;
// the replicas of the step average their gradients over a cross-replica process group
// that is rebuilt, without restarting any process, whenever the members change; and the
// step commits only where the service says every member's reduction succeeded. When a
// member fails mid-step, the survivors discard the step (no optimizer step: the caller
// skips it when should_commit() says false), rebuild their group without it and go on,
// averaging over the new replica count. A replica that starts late or restarts joins at a
// step boundary and is healed by a live member: the member's saved state travels over the
// new group (no checkpoint file), after which every replica holds the same bits.
//
//   lockstep::ft::Manager ft({}, {[&](auto& ar) { model->save(ar); opt.save(ar); },
//                                 [&](auto& ar) { model->load(ar); opt.load(ar); }});
//   while (ft.step() < steps) {
//     if (!ft.start_step()) break;             // quorum; rebuild; heal if behind
//     opt.zero_grad();
//     loss(model->forward(batch(ft.step(), ft.replica_rank(), ft.replicas()))).backward();
//     ft.allreduce(grads_of(model));           // never throws: a failure fails the step
//     if (ft.should_commit()) opt.step();      // step() advances only here
//   }
//
// Run under lockstep-run --fault-tolerant (docs/fault-tolerance.md: the model, what is and
// is not survived, the bounds per backend, the single point of failure).
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/parallel/ft/quorum_client.h>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>
#include <torch/csrc/distributed/c10d/Store.hpp>

#include <exception>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::ft {

struct ManagerOptions {
  std::string coordinator;  // "HOST:PORT"; empty: LOCKSTEP_COORDINATOR
  int replica_id = -1;      // -1: LOCKSTEP_REPLICA_ID
  // The cross-replica group: "auto" = LOCKSTEP_BACKEND if set, else shm when every member
  // runs on one host, else gloo.
  std::string backend = "auto";
  // Each cross-replica op's timeout: the bound on a failure that no backend detects
  // sooner (shm and gloo see a dead or stopped peer within about 3 s, docs/errors.md).
  comm::Millis timeout{std::chrono::seconds(60)};
  // How long a replica waits for a quorum (a joiner waits for the members' next step
  // boundary, and the first quorum for every replica to start).
  comm::Millis quorum_timeout{std::chrono::seconds(300)};
  comm::Millis heartbeat{std::chrono::milliseconds(250)};
  // The step this replica's state is at when it starts (it resumed from a checkpoint);
  // a replica behind the others is healed at its first quorum.
  int64_t start_step = 0;
  // > 0: the job stops (QuorumError, stopped()) once fewer replicas remain; the service
  // keeps the largest of its --min-replicas and every replica's.
  int min_replicas = 0;
  // HSDP: the group of this replica's own ranks (its shard group, e.g. lockstep::init()
  // under lockstep-run --fault-tolerant --replica-size S), when a replica is more than one
  // rank. Its rank 0 talks to the quorum service for the replica and shares what it learns;
  // rank s of every member forms the cross-replica group of shard s. A failure of this
  // group (a rank of the replica lost) is the replica's end: start_step() and
  // should_commit() throw, and lockstep-run restarts the replica's ranks together.
  std::shared_ptr<comm::ProcessGroup> replica_group;
};

// What a live replica hands a joiner (save) and the joiner takes (load): the parameters,
// the optimizer state, a gradient scaler, the RNG state that matters, the data position.
struct StateFns {
  std::function<void(torch::serialize::OutputArchive&)> save;
  std::function<void(torch::serialize::InputArchive&)> load;
};

// One committed step: its number and who took part (replica ids, in group rank order).
struct StepRecord {
  int64_t step = 0;
  int64_t quorum_id = 0;
  std::vector<int> members;
};

struct ManagerStats {
  int64_t committed = 0;  // steps this replica committed
  int64_t discarded = 0;  // steps it attempted and threw away
  int64_t heals = 0;      // times it was healed (received state)
  int64_t healed_others = 0;
  int64_t rebuilds = 0;    // cross-replica groups built
  double heal_s = 0;       // time receiving state
  double rebuild_s = 0;    // time building groups after the first
  double discarded_s = 0;  // time spent in discarded steps
  int64_t heal_bytes = 0;  // state received, in total
};

class Manager {
 public:
  Manager(ManagerOptions options, StateFns state);
  // Leaves the quorum cleanly (BYE), then the group.
  ~Manager();
  Manager(const Manager&) = delete;
  Manager& operator=(const Manager&) = delete;

  // The step boundary: learns the step's quorum (waits for it), rebuilds the group when
  // the members changed or the last step failed, and heals this replica when it is behind
  // the others (or heals the replicas behind it). Throws QuorumError when the service
  // stopped the job or is gone, and what StateFns::load throws (the received state does
  // not fit this replica: retrying would not help); anything else that fails here fails
  // the step instead.
  // False when the job is over: the others finished it and left (a replica restarted or
  // started too late); the caller ends its loop.
  [[nodiscard]] bool start_step();
  // Averages the tensors over the step's members, in place (one coalesced allreduce per
  // dtype). Never throws: a failure aborts the group and fails the step.
  void allreduce(const std::vector<at::Tensor>& tensors);
  // Records a failure of the caller's own cross-replica work: the step will not commit.
  void report_error(const std::exception_ptr& error);
  // Asks the service whether every member of the step succeeded. True: the step commits
  // (step() advances; apply the optimizer step); false: discard it.
  bool should_commit();

  int64_t step() const { return step_; }  // committed steps (the step being made)
  int replica_id() const { return replica_id_; }
  int replica_rank() const { return rank_; }  // index among the step's members
  int shard() const { return shard_; }        // this rank's index in its replica (HSDP)
  int replicas() const { return int(members_.size()); }
  const std::vector<int>& members() const { return members_; }
  int64_t quorum_id() const { return quorum_id_; }
  comm::ProcessGroup& group();  // the step's cross-replica group (of this shard)
  const ManagerStats& stats() const { return stats_; }
  const std::vector<StepRecord>& history() const { return history_; }
  // Why the last discarded step failed on this replica (empty when it did not).
  const std::string& last_error() const { return last_error_; }

 private:
  quorum_wire::Quorum ask_quorum();
  bool vote(bool ok);
  std::string from_leader(const std::function<std::string()>& ask);
  void rebuild(const quorum_wire::Quorum& q);
  void heal(const quorum_wire::Quorum& q);
  void fail(const std::string& why);

  ManagerOptions options_;
  StateFns state_;
  int replica_id_ = -1;
  int shard_ = 0;   // rank in replica_group; 0 talks to the service
  int shards_ = 1;  // replica_group's size
  std::string host_;
  c10::intrusive_ptr<c10d::Store> own_store_;  // this replica's rendezvous store (server)
  std::unique_ptr<QuorumClient> client_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int64_t quorum_id_ = -1;
  int64_t quorum_step_ = 0;    // the step the quorum makes (its furthest member's)
  bool need_rebuild_ = false;  // the group failed: build a new one at the next quorum
  std::vector<int> members_;
  int rank_ = 0;
  int64_t step_ = 0;
  bool failed_ = false;
  std::string last_error_;
  std::chrono::steady_clock::time_point step_start_;
  ManagerStats stats_;
  std::vector<StepRecord> history_;
};

}  // namespace lockstep::ft
