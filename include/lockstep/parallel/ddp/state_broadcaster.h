// lockstep/parallel/ddp/state_broadcaster.h: copying a set of tensors from one rank to all.
#pragma once

#include <lockstep/comm/process_group.h>

#include <ATen/core/Tensor.h>

#include <memory>
#include <vector>

namespace lockstep::ddp {

// Broadcasts a fixed list of tensors (parameters, buffers) from `root`,
// coalesced: one flat buffer and one broadcast per dtype instead of one per
// tensor. The flat buffers are allocated once, at construction, so a per-forward
// buffer broadcast allocates nothing. Writes into the tensors in place under
// NoGradGuard (so leaves that require grad can be targets). Collective: all ranks
// must construct it over matching lists and call broadcast() together.
// Not thread-safe.
class StateBroadcaster {
 public:
  StateBroadcaster(const std::vector<at::Tensor>& tensors,
                   std::shared_ptr<comm::ProcessGroup> group, int root = 0);
  void broadcast();
  bool empty() const { return groups_.empty(); }

 private:
  struct Group {
    at::Tensor flat;
    std::vector<at::Tensor> members;
    std::vector<at::Tensor> views;  // into flat, shaped like the members
  };
  std::vector<Group> groups_;
  std::shared_ptr<comm::ProcessGroup> group_;
  int root_;
};

}  // namespace lockstep::ddp
