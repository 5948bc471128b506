// Internal: the hierarchical backend -- shm inside each node, gloo (or mpi) between nodes.
//
// A job of N nodes with L ranks each, ranks numbered node-major (job rank = node * L +
// local rank, as lockstep-run, torchrun and mpirun's default mapping give them), holds two
// inner backends per rank:
//   intra: shm over the L ranks of its node;
//   inter: gloo (or mpi) over the N ranks of the same local rank, one per node.
// So every local rank has its own cross-node group, and the L groups of a node move their
// shares of a collective between nodes at the same time.
//
// Algorithms (docs/algorithms.md, "Hierarchical collectives", with their cost model):
//   allreduce, large: reduce-scatter inside the node (each local rank ends with 1/L of the
//     node's sum), allreduce of that share across nodes, allgather inside the node. The
//     bytes a node puts on the network are those of an N-rank allreduce of the whole
//     buffer -- 2 (N-1)/N S -- split over its L cross-node groups; a flat ring over N L ranks
//     sends 2 (NL-1)/(NL) S out of every node, through one rank.
//   allreduce, small (< kSmallBytes): allreduce inside the node, then every local rank
//     allreduces the node's sum across nodes (the L groups carry identical data and run
//     the same algorithm, so all ranks end bit-identical): two latencies, not three.
//   broadcast: across nodes among the root's local rank, then inside every node.
//   allgather, reduce_scatter, alltoall: one step inside and one across, with a local
//     permutation of blocks between them (a copy at memory speed).
//   barrier: inside, then across (every cross-node group: a node's rank leaves the second
//     step only after every rank of every node has entered the first).
//   send/recv: inside the node, or across between ranks of the same local rank; other
//     pairs are refused with a ConfigError naming the way out (LOCKSTEP_BACKEND=gloo).
//
// Errors from either inner backend are re-raised with the job's ranks: the peer is
// translated and the message says which inner group failed and how its ranks map. A rank
// whose node group was aborted by a local peer sees only that abort; so the first rank
// that finds a culprit also leaves a notice in the rendezvous store, which such a rank
// reads to name the failed rank too.
#pragma once

#include "comm/backend_factories.h"

#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace lockstep::comm {

struct HierLayout {
  int nodes = 1;     // N
  int per_node = 1;  // L
  int node = 0;      // this rank's node
  int local = 0;     // this rank's local rank
  int job_rank(int n, int l) const { return n * per_node + l; }
};

class HierBackend final : public Backend {
 public:
  static constexpr int64_t kSmallBytes = 64 << 10;

  // `store`/`prefix`: where the failure notice goes (and is looked for).
  HierBackend(const HierLayout& layout, std::unique_ptr<Backend> intra,
              std::unique_ptr<Backend> inter, StorePtr store, const std::string& prefix);
  // Job rank 0 hosts the store: after a failure it keeps it up a moment (kLinger at most)
  // until the ranks of the other nodes have read the notice.
  ~HierBackend() override;
  static constexpr Millis kLinger{3000};

  std::string name() const override { return "hier"; }
  int rank() const override { return lay_.job_rank(lay_.node, lay_.local); }
  int size() const override { return lay_.nodes * lay_.per_node; }
  bool bounded_by_deadline() const override {
    return intra_->bounded_by_deadline() && inter_->bounded_by_deadline();
  }

  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override;
  void broadcast(at::Tensor& t, int root, const OpContext& ctx) override;
  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                      const OpContext& ctx) override;
  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override;
  void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) override;
  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override;
  void barrier(const OpContext& ctx) override;
  void abort() noexcept override {
    intra_->abort();
    inter_->abort();
  }

  // The job's failure notice (the first culprit found by any rank, published once): its key
  // under the group's prefix and the reason it gives. The cross-node gloo groups heed it
  // too (ExternalNotice): a rank whose node peer died is not in the cross-node group its
  // counterparts on other nodes wait in, so only this notice tells them at once.
  static std::string notice_key(const std::string& prefix) { return prefix + "hier/failed"; }
  static std::string notice_reason(const std::vector<uint8_t>& value);

  // The inner groups, where there are two levels (several nodes, several ranks each).
  Levels levels() override {
    if (lay_.nodes == 1 || lay_.per_node == 1) return {};
    return {intra_.get(), inter_.get()};
  }

 private:
  enum class Hop { Intra, Inter };
  // Runs one step on an inner backend; its CommErrors come back with the job's ranks.
  template <class F>
  void step(Hop hop, const OpContext& ctx, F&& f);
  [[noreturn]] void rethrow(Hop hop, const OpContext& ctx, const CommError& e);
  struct Notice {
    int peer = -1;
    CommError::Kind kind = CommError::Kind::Failed;
    std::string what;
  };
  // The first culprit found by any rank: published once per job, read within `patience`.
  void publish(const Notice& n) noexcept;
  std::optional<Notice> notice(Millis patience) noexcept;
  static Notice parse(const std::vector<uint8_t>& value);
  std::string describe(Hop hop) const;
  void allreduce_small(at::Tensor& t, ReduceOp op, const OpContext& ctx);
  void allreduce_large(at::Tensor& t, ReduceOp op, const OpContext& ctx);
  // The peer `rank` of a point-to-point op, or a ConfigError if no inner group holds both.
  std::pair<Hop, int> route(int rank, const char* op) const;

  HierLayout lay_;
  std::unique_ptr<Backend> intra_;
  std::unique_ptr<Backend> inter_;
  at::Tensor scratch_[2];  // two buffers kept across calls (kept_buffer)
  StorePtr store_;
  std::string notice_key_;
  bool failed_ = false;  // an inner group failed (comm thread only)
};

// The layout of a job from every rank's (local rank, local world size, host): node-major
// numbering, the same L on every node, one host per node. Empty (with `why`) otherwise.
std::optional<HierLayout> hier_layout(int rank, const std::vector<int>& local_ranks,
                                      const std::vector<int>& local_sizes,
                                      const std::vector<std::string>& hosts, std::string* why);

}  // namespace lockstep::comm
