// The non-template part of FullyShardedDataParallel: units, and the forward/backward
// schedule of their gathers, frees and reductions (docs/fsdp.md).
#include <lockstep/comm/host_cache.h>
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/parallel/ddp/model_check.h>
#include <lockstep/parallel/ddp/state_broadcaster.h>
#include <lockstep/parallel/fsdp/core.h>
#include <lockstep/parallel/fsdp/wrap.h>

#include <ATen/ATen.h>

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "buffer_pool.h"
#include "flat_unit.h"

namespace lockstep::fsdp {

// Connects a wrapper that became a unit to the core.
class UnitHooksImpl final : public UnitHooks {
 public:
  UnitHooksImpl(FSDPCore& core, int unit, WrapBase* wrapper)
      : core_(core), unit_(unit), wrapper_(wrapper) {
    wrapper_->set_hooks(this);
  }
  ~UnitHooksImpl() override { wrapper_->set_hooks(nullptr); }
  UnitHooksImpl(const UnitHooksImpl&) = delete;
  UnitHooksImpl& operator=(const UnitHooksImpl&) = delete;
  void pre_forward() override { core_.unit_pre_forward(unit_); }
  void post_forward(const std::vector<at::Tensor>& outputs) override {
    core_.unit_post_forward(unit_, outputs);
  }

 private:
  FSDPCore& core_;
  const int unit_;
  WrapBase* const wrapper_;
};

struct FSDPCore::Candidate {
  std::string name;
  WrapBase* wrapper;
};

namespace {

using ImplPtr = const c10::TensorImpl*;

// Every parameter once (registration order) with its first name; `shared` collects
// those registered under more than one name.
void distinct_parameters(torch::nn::Module& root, std::vector<std::string>& names,
                         std::vector<at::Tensor>& params, std::unordered_set<ImplPtr>& shared) {
  std::unordered_set<ImplPtr> seen;
  for (const auto& item : root.named_parameters(/*recurse=*/true)) {
    if (seen.insert(item.value().unsafeGetTensorImpl()).second) {
      names.push_back(item.key());
      params.push_back(item.value());
    } else {
      shared.insert(item.value().unsafeGetTensorImpl());
    }
  }
}

// Rank 0's values of `state`, in flat chunks of about 64 MB: the model being sharded may not
// fit twice on a rank, which one flat copy of all of it would need.
void broadcast_in_chunks(const std::vector<at::Tensor>& state,
                         const std::shared_ptr<comm::ProcessGroup>& group) {
  constexpr int64_t kChunkBytes = int64_t{64} << 20;
  std::vector<at::Tensor> chunk;
  int64_t bytes = 0;
  for (size_t i = 0; i <= state.size(); ++i) {
    if (i == state.size() ||
        (bytes > 0 && bytes + static_cast<int64_t>(state[i].nbytes()) > kChunkBytes)) {
      ddp::StateBroadcaster(chunk, group).broadcast();
      chunk.clear();
      bytes = 0;
    }
    if (i == state.size()) break;
    chunk.push_back(state[i]);
    bytes += static_cast<int64_t>(state[i].nbytes());
  }
}

}  // namespace

FSDPCore::FSDPCore(std::shared_ptr<torch::nn::Module> root,
                   std::shared_ptr<comm::ProcessGroup> group, FSDPOptions options)
    : root_(std::move(root)),
      group_(std::move(group)),
      options_(std::move(options)),
      pool_(std::make_unique<BufferPool>()) {
  LOCKSTEP_CHECK(root_ != nullptr, "FullyShardedDataParallel: null module");
  LOCKSTEP_CHECK(group_ != nullptr, "FullyShardedDataParallel: null process group");
  if (!options_.wrap_policy) options_.wrap_policy = wrap_all();

  std::vector<std::string> names;
  std::vector<at::Tensor> params;
  std::unordered_set<ImplPtr> shared;
  distinct_parameters(*root_, names, params, shared);
  const bool hybrid = options_.strategy == ShardingStrategy::HybridShard;
  if (hybrid && !options_.replicate_group)
    throw InvalidArgument(
        "FSDP hybrid_shard needs FSDPOptions::replicate_group: the group FSDP gets shards "
        "(e.g. lockstep::init_split(node)), the replicate group holds the other copies of "
        "this rank's shard (e.g. lockstep::init_split(local_rank))");
  if (!hybrid) options_.replicate_group.reset();
  check_secondary_group();
  ddp::verify_same_model(*group_, names, params);
  if (hybrid) ddp::verify_same_model(*options_.replicate_group, names, params);
  std::unordered_set<ImplPtr> seen;
  for (const auto& b : root_->buffers(/*recurse=*/true))
    if (seen.insert(b.unsafeGetTensorImpl()).second) buffers_.push_back(b);
  std::vector<at::Tensor> state = params;
  state.insert(state.end(), buffers_.begin(), buffers_.end());
  if (hybrid) broadcast_in_chunks(state, options_.replicate_group);
  broadcast_in_chunks(state, group_);  // rank 0's values everywhere
  if (const auto dt = options_.mixed_precision.buffer_dtype) {
    at::NoGradGuard no_grad;
    for (auto& b : buffers_)
      if (at::isFloatingType(b.scalar_type())) b.set_data(b.to(*dt));
  }
  num_params_ = static_cast<int64_t>(root_->named_parameters(true).size());

  std::vector<Candidate> candidates;
  for (const auto& item : root_->named_modules("", /*include_self=*/false))
    if (auto* w = dynamic_cast<WrapBase*>(item.value().get()))
      candidates.push_back({item.key(), w});
  build_units(std::move(candidates), names, params, shared);
  // The model's full parameters are freed now: their blocks back to the system, not kept.
  comm::empty_host_cache();
}

FSDPCore::~FSDPCore() {
  for (auto& h : grad_hooks_) compat::remove_hook(h);
}

void FSDPCore::build_units(std::vector<Candidate> candidates, const std::vector<std::string>& names,
                           const std::vector<at::Tensor>& params,
                           const std::unordered_set<const c10::TensorImpl*>& shared) {
  std::unordered_map<ImplPtr, std::string> name_of;
  for (size_t i = 0; i < params.size(); ++i)
    name_of.emplace(params[i].unsafeGetTensorImpl(), names[i]);
  // Innermost candidates first, so that a selected unit's parameters are not counted again
  // for the candidates that enclose it. Shared parameters stay with the root.
  std::unordered_set<ImplPtr> claimed = shared;
  struct Selected {
    Candidate c;
    std::vector<std::string> names;
    std::vector<at::Tensor> params;
  };
  std::vector<Selected> selected;
  for (auto it = candidates.rbegin(); it != candidates.rend(); ++it) {
    Selected s{*it, {}, {}};
    int64_t numel = 0;
    std::unordered_set<ImplPtr> mine;
    for (const auto& p : it->wrapper->parameters(/*recurse=*/true)) {
      const ImplPtr key = p.unsafeGetTensorImpl();
      if (claimed.count(key) != 0 || !mine.insert(key).second) continue;
      s.names.push_back(name_of.at(key));
      s.params.push_back(p);
      numel += p.numel();
    }
    if (s.params.empty() || !options_.wrap_policy(it->name, *it->wrapper->inner(), numel)) continue;
    claimed.insert(mine.begin(), mine.end());
    selected.push_back(std::move(s));
  }
  std::reverse(selected.begin(), selected.end());  // model order: outer units first
  for (auto& s : selected) {
    const int u = static_cast<int>(units_.size());
    units_.push_back(std::make_unique<FlatUnit>(
        s.c.name, std::move(s.names), std::move(s.params), *group_, options_.strategy,
        options_.mixed_precision, *pool_, options_.replicate_group.get(), options_.compression,
        options_.secondary_group.get()));
    hooks_.push_back(std::make_unique<UnitHooksImpl>(*this, u, s.c.wrapper));
  }
  std::vector<std::string> root_names;
  std::vector<at::Tensor> root_params;
  for (size_t i = 0; i < params.size(); ++i)
    if (claimed.count(params[i].unsafeGetTensorImpl()) == 0 ||
        shared.count(params[i].unsafeGetTensorImpl()) != 0) {
      root_names.push_back(names[i]);
      root_params.push_back(params[i]);
    }
  if (!root_params.empty()) {
    root_unit_ = static_cast<int>(units_.size());
    units_.push_back(std::make_unique<FlatUnit>(
        "", std::move(root_names), std::move(root_params), *group_, options_.strategy,
        options_.mixed_precision, *pool_, options_.replicate_group.get(), options_.compression,
        options_.secondary_group.get()));
  }
  install_grad_hooks();
  ready_.assign(units_.size(), false);
}

// hpZ's group must be this rank's node inside the FSDP group: ranks node * L + local. The
// check is agreed on (one allreduce), so every rank raises, not only those that see it.
void FSDPCore::check_secondary_group() {
  const auto& sec = options_.secondary_group;
  if (!sec) return;
  if (options_.strategy != ShardingStrategy::FullShard)
    throw InvalidArgument(lockstep::detail::concat(
        "FSDPOptions::secondary_group (hpZ) needs ShardingStrategy::FullShard, not ",
        strategy_name(options_.strategy), ": only full_shard gathers again for backward"));
  const int L = sec->size(), P = group_->size();
  at::Tensor bad = at::full({1}, P % L != 0 || group_->rank() % L != sec->rank() ? 1 : 0, at::kInt);
  group_->allreduce(bad, {comm::ReduceOp::Max, comm::Millis(0)})->wait();
  if (bad.item<int>() != 0)
    throw InvalidArgument(lockstep::detail::concat(
        "FSDPOptions::secondary_group (hpZ): rank ", group_->rank(), " of the FSDP group (", P,
        " ranks) is rank ", sec->rank(), " of ", L,
        " in the secondary group, and some rank's is not its node; it must hold the ranks "
        "node * L + 0..L-1 of the FSDP group (lockstep::init_split(rank / L))"));
  if (L == 1 || L == P) options_.secondary_group.reset();  // nothing to save
}

void FSDPCore::install_grad_hooks() {
  for (auto& h : grad_hooks_) compat::remove_hook(h);
  grad_hooks_.clear();
  for (int u = 0; u < num_units(); ++u) {
    const auto& ps = units_[static_cast<size_t>(u)]->params();
    for (size_t i = 0; i < ps.size(); ++i)
      if (ps[i].requires_grad())
        grad_hooks_.push_back(
            compat::add_grad_ready_hook(ps[i], [this, u, i] { param_grad_ready(u, i); }));
  }
}

FlatUnit& FSDPCore::unit(int u) { return *units_.at(static_cast<size_t>(u)); }

std::vector<at::Tensor> FSDPCore::parameters() const {
  std::vector<at::Tensor> out;
  for (const auto& u : units_) out.push_back(u->shard());
  return out;
}

at::Tensor FSDPCore::cast_input(const at::Tensor& t) const {
  const auto& dt = options_.mixed_precision.param_dtype;
  if (!dt || !t.defined() || !at::isFloatingType(t.scalar_type())) return t;
  return t.to(*dt);
}

// --- forward ---------------------------------------------------------------------------

void FSDPCore::check_parameters_unchanged() {
  const auto now = root_->named_parameters(true);
  if (static_cast<int64_t>(now.size()) == num_params_) return;
  std::unordered_set<std::string> known;
  for (const auto& u : units_)
    for (const auto& n : u->param_names()) known.insert(n);
  std::string added;
  for (const auto& item : now)
    if (known.count(item.key()) == 0) added += (added.empty() ? "" : ", ") + item.key();
  throw InvalidArgument(lockstep::detail::concat(
      "FullyShardedDataParallel: the module had ", num_params_, " parameters when wrapped and has ",
      now.size(), " now", added.empty() ? "" : " (new: " + added + ")",
      "; parameters cannot be added or removed after wrapping: build the whole model first"));
}

void FSDPCore::before_root_forward() {
  if (summoned_) return;  // evaluation on the summoned parameters: a plain forward
  check_parameters_unchanged();
  if (!backward_started_ && !forward_order_.empty()) {
    // The previous forward had no backward (evaluation): start over.
    last_forward_order_ = forward_order_;
    forward_order_.clear();
  }
  in_forward_ = true;
  for (auto& u : units_) u->drop_secondary();
  if (root_unit_ >= 0) unit(root_unit_).wait_gathered();
}

void FSDPCore::after_root_forward(const std::vector<at::Tensor>& outputs) {
  if (summoned_) return;
  in_forward_ = false;
  attach_pre_backward(root_unit_, outputs);
}

void FSDPCore::unit_pre_forward(int u) {
  if (summoned_) return;
  if (!in_forward_)
    throw InvalidArgument(lockstep::detail::concat(
        "FSDP unit '", unit(u).name(),
        "' was called outside FullyShardedDataParallel's "
        "forward; call the FSDP object, not the module, so that its parameters are gathered"));
  if (std::find(forward_order_.begin(), forward_order_.end(), u) != forward_order_.end())
    throw InvalidArgument(lockstep::detail::concat(
        "FSDP unit '", unit(u).name(),
        "' ran twice in one forward; a unit's parameters are "
        "freed after its forward: wrap the layers called twice in one unit with their caller"));
  forward_order_.push_back(u);
  unit(u).wait_gathered();
  if (options_.forward_prefetch) {
    auto it = std::find(last_forward_order_.begin(), last_forward_order_.end(), u);
    if (it != last_forward_order_.end() && it + 1 != last_forward_order_.end())
      unit(*(it + 1)).begin_gather();
  }
}

bool FSDPCore::keep_after_forward() const {
  return options_.strategy == ShardingStrategy::ShardGradOp && at::GradMode::is_enabled();
}

void FSDPCore::unit_post_forward(int u, const std::vector<at::Tensor>& outputs) {
  if (summoned_) return;
  // ShardGradOp keeps the parameters until the backward is done; under FullShard a
  // backward to come may keep hpZ's secondary shard.
  if (!keep_after_forward()) {
    if (at::GradMode::is_enabled())
      unit(u).free_after_forward();
    else
      unit(u).free_full();
  }
  attach_pre_backward(u, outputs);
}

void FSDPCore::attach_pre_backward(int u, const std::vector<at::Tensor>& outputs) {
  for (const auto& t : outputs)
    if (t.defined() && t.requires_grad())
      t.register_hook([this, u](const at::Tensor&) { unit_pre_backward(u); });
}

// --- backward --------------------------------------------------------------------------

void FSDPCore::ensure_backward_started() {
  if (backward_started_) return;
  backward_started_ = true;
  backward_order_.assign(forward_order_.rbegin(), forward_order_.rend());
  for (int u = 0; u < num_units(); ++u)
    if (u != root_unit_ &&
        std::find(forward_order_.begin(), forward_order_.end(), u) == forward_order_.end())
      backward_order_.push_back(u);
  if (root_unit_ >= 0) backward_order_.push_back(root_unit_);
  next_reduce_ = 0;
  compat::queue_end_of_backward_callback([this] { finish_backward(); });
}

void FSDPCore::unit_pre_backward(int u) {
  ensure_backward_started();
  if (u < 0) return;  // the root's outputs when the root holds no parameters
  unit(u).wait_gathered();
  if (!options_.backward_prefetch) return;
  auto it = std::find(backward_order_.begin(), backward_order_.end(), u);
  for (++it; it != backward_order_.end(); ++it)
    if (*it != root_unit_ && !ready_[static_cast<size_t>(*it)]) {
      unit(*it).begin_gather();
      break;
    }
}

void FSDPCore::param_grad_ready(int u, size_t i) {
  ensure_backward_started();
  if (!unit(u).param_grad_ready(i)) return;
  // Every gradient of the unit is in: its parameters are no longer needed this backward.
  if (u != root_unit_) unit(u).free_full();
  ready_[static_cast<size_t>(u)] = true;
  launch_ready_reductions();
}

// Reductions start in backward_order_ on every rank (the same sequence of collectives
// whatever order autograd delivered the gradients in); at most two are in flight, so the
// flat gradient buffers of at most two units exist at once.
void FSDPCore::launch_ready_reductions() {
  while (next_reduce_ < backward_order_.size()) {
    const int u = backward_order_[next_reduce_];
    if (unit(u).expects_grads()) {
      if (!ready_[static_cast<size_t>(u)]) return;
      unit(u).begin_reduce();
      if (last_reduce_ >= 0) unit(last_reduce_).finish_reduce();
      last_reduce_ = u;
    }
    ++next_reduce_;
  }
}

void FSDPCore::finish_backward() {
  for (size_t k = 0; k < ready_.size(); ++k) ready_[k] = true;  // unused: zero gradients
  launch_ready_reductions();
  if (last_reduce_ >= 0) unit(last_reduce_).finish_reduce();
  last_reduce_ = -1;
  for (auto& u : units_) {
    u->free_full();
    u->drop_secondary();
  }
  ready_.assign(units_.size(), false);
  last_forward_order_ = forward_order_;
  forward_order_.clear();
  backward_started_ = false;
}

// --- gradients, full parameters, memory ----------------------------------------------------

double FSDPCore::clip_grad_norm(double max_norm) {
  const at::Device device = units_.empty() ? at::Device(at::kCPU) : units_[0]->shard().device();
  at::Tensor sq = at::zeros({1}, at::TensorOptions().dtype(at::kDouble).device(device));
  for (const auto& u : units_)
    if (u->shard().grad().defined()) sq += u->shard().grad().to(at::kDouble).pow(2).sum();
  if (units_.empty() || units_[0]->sharded()) group_->allreduce(sq)->wait();
  const double norm = std::sqrt(sq.item<double>());
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) {
    at::NoGradGuard no_grad;
    for (const auto& u : units_)
      if (u->shard().grad().defined()) u->shard().mutable_grad().mul_(coef);
  }
  return norm;
}

void FSDPCore::summon_full_params() {
  LOCKSTEP_CHECK(!in_forward_ && !backward_started_,
                 "summon_full_params: not allowed during forward or backward");
  if (summoned_) return;
  for (auto& u : units_)
    if (u->gathers_master()) u->begin_gather();  // every gather under way before the first wait
  for (auto& u : units_) u->summon();
  summoned_ = true;
}

void FSDPCore::release_full_params() {
  if (!summoned_) return;
  for (auto& u : units_) u->release_summoned();
  // Under mixed precision the parameters changed dtype twice, which gave them new
  // AccumulateGrad nodes: hook the new ones.
  if (options_.mixed_precision.param_dtype) install_grad_hooks();
  summoned_ = false;
}

void FSDPCore::set_reduce_calls(uint64_t calls) {
  for (auto& u : units_) u->set_reduce_calls(calls);
}

FSDPCore::TrafficStats FSDPCore::traffic() const {
  TrafficStats t;
  for (const auto& u : units_) {
    t.bytes_sent += u->bytes_sent();
    t.bytes_uncompressed += u->bytes_uncompressed();
  }
  return t;
}

MemoryStats FSDPCore::memory_stats() const {
  MemoryStats m;
  for (const auto& u : units_) {
    const auto& s = u->shard();
    m.shard_bytes += s.numel() * static_cast<int64_t>(s.element_size());
    if (u->sharded()) m.gathered_bytes += u->gathered_bytes();
    m.secondary_bytes += u->secondary_bytes();
    if (s.grad().defined())
      m.grad_bytes += s.grad().numel() * static_cast<int64_t>(s.grad().element_size());
  }
  m.pool_bytes = pool_->held_bytes();
  return m;
}

}  // namespace lockstep::fsdp
