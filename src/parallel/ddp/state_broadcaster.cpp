// Coalesced broadcast of parameters/buffers; see include/lockstep/parallel/ddp/state_broadcaster.h.
#include <lockstep/parallel/ddp/state_broadcaster.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <map>

namespace lockstep::ddp {

StateBroadcaster::StateBroadcaster(const std::vector<at::Tensor>& tensors,
                                   std::shared_ptr<comm::ProcessGroup> group, int root)
    : group_(std::move(group)), root_(root) {
  std::map<at::ScalarType, std::vector<at::Tensor>> by_dtype;  // ordered: same on every rank
  for (const auto& t : tensors)
    if (t.defined() && t.numel() > 0) by_dtype[t.scalar_type()].push_back(t);
  for (auto& [dtype, members] : by_dtype) {
    Group g;
    int64_t total = 0;
    for (auto& t : members) total += t.numel();
    g.flat = at::empty({total}, at::TensorOptions().dtype(dtype));
    int64_t off = 0;
    for (auto& t : members) {
      g.views.push_back(g.flat.narrow(0, off, t.numel()).view(t.sizes()));
      off += t.numel();
    }
    g.members = std::move(members);
    groups_.push_back(std::move(g));
  }
}

void StateBroadcaster::broadcast() {
  if (group_->size() == 1) return;
  at::NoGradGuard no_grad;
  const bool is_root = group_->rank() == root_;
  std::vector<comm::WorkPtr> works;
  for (auto& g : groups_) {
    if (is_root)
      for (size_t i = 0; i < g.members.size(); ++i) g.views[i].copy_(g.members[i]);
    works.push_back(group_->broadcast(g.flat, {root_}));
  }
  for (size_t k = 0; k < groups_.size(); ++k) {
    works[k]->wait();
    if (is_root) continue;
    auto& g = groups_[k];
    for (size_t i = 0; i < g.members.size(); ++i) g.members[i].copy_(g.views[i]);
  }
}

}  // namespace lockstep::ddp
