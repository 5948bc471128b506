// The implementations lockstep-bench collectives measures: lockstep's backends and the peers.
#pragma once

#include <lockstep/comm/process_group.h>

#include <memory>
#include <string>
#include <vector>

namespace lockstep::bench {

class CollectiveImpl {
 public:
  virtual ~CollectiveImpl() = default;
  virtual std::string name() const = 0;
  virtual bool supports(const std::string& op) const = 0;
  // Median seconds per op of `op` over float32 buffers of n elements (allreduce: the
  // tensor; allgather: the output; reduce_scatter: the input); small buffers are timed in
  // batches of ops back to back. Verifies the result; throws if wrong.
  virtual double time(const std::string& op, int64_t n) = 0;
  // The fastest sample of the last time() call (slowest rank's), seconds per op: what the
  // implementation does when the machine lets it, the figure STREAM itself reports.
  double best() const { return best_; }

 protected:
  double best_ = 0;
};

// impls: comma list of shm, gloo, hier, mpi (lockstep's backends), BACKEND-qsgdB (its
// allreduce compressed to B bits, e.g. hier-qsgd4), c10d-gloo, mpi-raw (peers).
// `control` is the coordinating group (rendezvous of the peers, barriers).
std::vector<std::unique_ptr<CollectiveImpl>> make_impls(const std::string& impls,
                                                        comm::ProcessGroup& control);

}  // namespace lockstep::bench
