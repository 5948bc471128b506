// The DDP reducer: see include/lockstep/parallel/ddp/reducer.h for the protocol.
#include <lockstep/compat.h>
#include <lockstep/error.h>
#include <lockstep/parallel/ddp/reducer.h>

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>

#include <exception>
#include <numeric>
#include <sstream>

namespace lockstep::ddp {
namespace {
comm::ProcessGroup& checked(const std::shared_ptr<comm::ProcessGroup>& g) {
  if (!g) throw InvalidArgument("DDP needs a process group (lockstep::init()), got null");
  return *g;
}
}  // namespace

namespace {
using Clock = std::chrono::steady_clock;
double seconds_since(Clock::time_point t) {
  return std::chrono::duration<double>(Clock::now() - t).count();
}

// A tensor of `shape` sharing `flat`'s storage at `offset`, made with set_()
// rather than narrow()/view(): autograd then does not treat it as a view, so an
// optimizer may detach_() it when it is param.grad (libtorch 1.13's
// Optimizer::zero_grad() does; detach_() on an autograd view throws).
at::Tensor slot_alias(const at::Tensor& flat, int64_t offset, at::IntArrayRef shape) {
  at::NoGradGuard no_grad;
  std::vector<int64_t> strides(shape.size(), 1);
  for (int64_t d = (int64_t)shape.size() - 2; d >= 0; --d)
    strides[d] = strides[d + 1] * shape[d + 1];
  auto t = at::empty({0}, flat.options());
  t.set_(flat.storage(), flat.storage_offset() + offset, shape, strides);
  return t;
}
}  // namespace

Reducer::Reducer(std::vector<at::Tensor> params, std::vector<std::string> names,
                 std::shared_ptr<comm::ProcessGroup> group, DDPOptions options)
    : params_(std::move(params)),
      names_(std::move(names)),
      group_(std::move(group)),
      options_(options),
      world_size_(checked(group_).size()),
      scale_(1.0 / world_size_),
      scale_t_(at::scalar_tensor(scale_, at::kDouble)) {
  LOCKSTEP_CHECK_EQ(params_.size(), names_.size());
  LOCKSTEP_CHECK(options_.bucket_cap_bytes > 0 && options_.first_bucket_bytes > 0,
                 "bucket sizes must be positive");
  for (size_t i = 0; i < params_.size(); ++i) {
    LOCKSTEP_CHECK(params_[i].requires_grad() && params_[i].is_leaf(), "parameter '", names_[i],
                   "' must be a leaf that requires grad");
    if (params_[i].device() != params_.front().device())
      throw InvalidArgument(lockstep::detail::concat(
          "DDP: parameter '", names_[i], "' is on ", params_[i].device().str(), " but '",
          names_.front(), "' is on ", params_.front().device().str(),
          "; move the whole module to one device (module->to(device)) before wrapping it"));
  }
  // Initial order: reverse registration order, the usual order in which backward
  // produces gradients (last layer first).
  std::vector<int64_t> order(params_.size());
  std::iota(order.rbegin(), order.rend(), 0);
  build_buckets(order);
  ready_.assign(params_.size(), 0);
  if (options_.find_unused_parameters) used_map_ = at::zeros({(int64_t)params_.size()}, at::kInt);
  record_order_ = options_.rebuild_buckets;
  hook_handles_.reserve(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    hook_handles_.push_back(
        compat::add_grad_ready_hook(params_[i], [this, i] { on_grad_ready(i); }));
  }
}

Reducer::~Reducer() {
  for (auto& h : hook_handles_) compat::remove_hook(h);
  std::lock_guard<std::mutex> lk(mu_);
  abandon_step_locked();
}

void Reducer::register_comm_hook(CommHook hook) {
  LOCKSTEP_CHECK(hook != nullptr, "register_comm_hook: empty hook");
  std::lock_guard<std::mutex> lk(mu_);
  LOCKSTEP_CHECK(!step_active_, "register_comm_hook: not allowed during a backward pass");
  hook_ = std::move(hook);
}

void Reducer::build_buckets(const std::vector<int64_t>& order) {
  // Rebuild: grads that are views into the old buckets become their own tensors, and
  // the old buffers go before the new ones are allocated (shared memory is never held
  // twice, and no grad keeps an old buffer alive).
  const bool rebuild = !buckets_.empty();
  if (rebuild) {
    at::NoGradGuard no_grad;
    for (size_t p = 0; p < params_.size(); ++p) {
      auto& g = params_[p].mutable_grad();
      const BucketState& old = buckets_[slots_[p].bucket];
      if (g.defined() && old.as_views && g.data_ptr() == old.views[slots_[p].index].data_ptr())
        g = g.clone();
    }
    infos_.clear();
    buckets_.clear();
  }
  std::vector<int64_t> numels(params_.size());
  std::vector<at::ScalarType> dtypes(params_.size());
  for (size_t i = 0; i < params_.size(); ++i) {
    numels[i] = params_[i].numel();
    dtypes[i] = params_[i].scalar_type();
  }
  auto specs = compute_bucket_assignment(numels, dtypes, order, options_.first_bucket_bytes,
                                         options_.bucket_cap_bytes);
  std::vector<GradBucket> infos(specs.size());
  std::vector<BucketState> states(specs.size());
  std::vector<Slot> slots(params_.size());
  // Shared buckets until the first one cannot be had (every rank sees the same), so a
  // small /dev/shm costs one warning, not one per bucket. alloc_shared on a broken group
  // throws: the layout is finished with private buffers, then the error goes on.
  // CUDA parameters: buckets on their device (the group stages them or, nccl, takes them).
  const at::Device device = params_.empty() ? at::Device(at::kCPU) : params_.front().device();
  bool try_shared = options_.shared_buckets && world_size_ > 1 && device.is_cpu();
  std::exception_ptr failed;
  for (size_t b = 0; b < specs.size(); ++b) {
    auto& info = infos[b];
    info.index = b;
    info.num_buckets = specs.size();
    info.is_last = b + 1 == specs.size();
    info.world_size = world_size_;
    int64_t total = 0;
    for (int64_t p : specs[b].params) total += numels[p];
    // Shared: the allreduce works on the peers' buffers directly, so grads live there.
    // Else untouched until a bucket falls back to the copy path (never, usually): its
    // pages cost no memory until then.
    if (try_shared) {
      try {
        info.buffer = group_->alloc_shared(total, specs[b].dtype);
      } catch (...) {
        failed = std::current_exception();
      }
      try_shared = info.buffer.defined();
    }
    states[b].as_views = options_.gradient_as_bucket_view || info.buffer.defined();
    if (!info.buffer.defined())
      info.buffer = at::empty({total}, at::TensorOptions().dtype(specs[b].dtype).device(device));
    int64_t off = 0;
    for (size_t k = 0; k < specs[b].params.size(); ++k) {
      const int64_t p = specs[b].params[k];
      info.param_indices.push_back(p);
      info.names.push_back(names_[p]);
      info.offsets.push_back(off);
      info.numels.push_back(numels[p]);
      info.shapes.push_back(params_[p].sizes().vec());
      states[b].views.push_back(slot_alias(info.buffer, off, params_[p].sizes()));
      slots[p] = Slot{(int64_t)b, (int64_t)k};
      off += numels[p];
    }
    states[b].pending = specs[b].params.size();
  }
  // Gradients move into the new bucket views where grads are views.
  if (rebuild) {
    at::NoGradGuard no_grad;
    for (size_t p = 0; p < params_.size(); ++p) {
      auto& g = params_[p].mutable_grad();
      if (!g.defined() || !states[slots[p].bucket].as_views) continue;
      auto& v = states[slots[p].bucket].views[slots[p].index];
      v.copy_(g);
      g = v;
    }
  }
  infos_ = std::move(infos);
  buckets_ = std::move(states);
  slots_ = std::move(slots);
  if (failed) std::rethrow_exception(failed);
}

void Reducer::prepare_for_forward() {
  std::unique_lock<std::mutex> lk(mu_);
  // A backward that threw inside autograd never ran its callback. If it did not launch
  // every bucket, this rank's collectives are now out of step with its peers': break
  // the group so nobody sums gradients of different steps (the job must restart).
  if (step_active_) {
    if (world_size_ > 1 && next_launch_ < (int64_t)buckets_.size())
      group_->abort(std::make_exception_ptr(Error(lockstep::detail::concat(
          "DDP (rank ", group_->rank(), "): a backward pass failed after ", next_launch_, " of ",
          buckets_.size(), " gradient buckets were reduced; the group cannot continue in step"))));
    abandon_step_locked();
  }
  if (rebuild_pending_) {
    rebuild_pending_ = false;
    rebuilt_ = true;
    // Every rank adopts rank 0's order so the layouts (and collectives) agree.
    auto order = at::tensor(observed_order_, at::kLong);
    if (world_size_ > 1) group_->broadcast(order, {0})->wait();
    const int64_t* o = order.data_ptr<int64_t>();
    build_buckets(std::vector<int64_t>(o, o + order.numel()));
  }
  armed_ = true;
  armed_sync_ = require_sync_;
}

void Reducer::on_grad_ready(int64_t i) {
  std::lock_guard<std::mutex> lk(mu_);
  if (!step_active_) {
    const bool sync = armed_ ? armed_sync_ : require_sync_;
    if (!sync) return;  // no_sync: AccumulateGrad already summed into param.grad
    begin_step_locked();
  }
  if (ready_[i]) {
    throw InvalidArgument(lockstep::detail::concat(
        "DDP: parameter '", names_[i],
        "' received its gradient twice in one backward pass "
        "(reentrant backward or a parameter shared in a way autograd reports twice); this is "
        "not supported"));
  }
  if (record_order_) observed_order_.push_back(i);
  stage_grad_locked(i);
  mark_ready_locked(i);
  launch_ready_buckets_locked();
}

void Reducer::begin_step_locked() {
  step_active_ = true;
  first_hook_ = Clock::now();
  // The callback is queued from inside this backward, so it is guaranteed to run
  // at its end (on success) whatever subset of parameters gets gradients.
  compat::queue_end_of_backward_callback([this] { finalize(); });
}

bool Reducer::in_place_ok_locked(int64_t i) const {
  const Slot s = slots_[i];
  const at::Tensor& grad = params_[i].grad();
  const at::Tensor& view = buckets_[s.bucket].views[s.index];
  if (!grad.defined() || grad.is_sparse()) return false;
  if (buckets_[s.bucket].as_views) return grad.data_ptr() == view.data_ptr();
  return grad.device() == view.device() && grad.is_contiguous() &&
         grad.scalar_type() == view.scalar_type() && grad.numel() == view.numel();
}

void Reducer::stage_grad_locked(int64_t i) {
  const int64_t bi = slots_[i].bucket;
  auto& b = buckets_[bi];
  if (direct(b) && in_place_ok_locked(i)) return;  // the collective reads it where it is
  if (direct(b)) {
    // This gradient cannot be reduced in place: the whole bucket takes the copy path,
    // including the gradients already passed over.
    b.fell_back = true;
    for (int64_t p : infos_[bi].param_indices)
      if (ready_[p]) copy_grad_to_bucket_locked(p);
  }
  copy_grad_to_bucket_locked(i);
}

// Both forms are "allreduce of the bucket's N elements (avg)" to the group, so ranks
// that chose differently for a bucket (one had an unused parameter) still agree.
HookResult Reducer::builtin_allreduce_locked(int64_t bi) {
  const GradBucket& info = infos_[bi];
  const comm::AllreduceOptions avg{comm::ReduceOp::Avg};
  HookResult r;
  r.bytes = info.buffer.numel() * static_cast<int64_t>(info.buffer.element_size());
  if (!direct(buckets_[bi]) || buckets_[bi].as_views) {
    at::Tensor buf = info.buffer;  // the grads were copied into it, or are its views
    r.work = group_->allreduce(buf, avg);
  } else {
    std::vector<at::Tensor> grads;
    grads.reserve(info.param_indices.size());
    for (int64_t p : info.param_indices) grads.push_back(params_[p].grad());
    r.work = group_->allreduce_coalesced(std::move(grads), avg);
  }
  return r;
}

void Reducer::copy_grad_to_bucket_locked(int64_t i) {
  at::NoGradGuard no_grad;
  const Slot s = slots_[i];
  at::Tensor& view = buckets_[s.bucket].views[s.index];
  at::Tensor& grad = params_[i].mutable_grad();
  if (!grad.defined()) {
    view.zero_();  // unused here: contributes zero (write-back decides on undefined)
    return;
  }
  if (grad.is_sparse())
    throw InvalidArgument(
        lockstep::detail::concat("DDP: parameter '", names_[i],
                                 "' has a sparse gradient "
                                 "(e.g. Embedding with sparse=true); DDP reduces dense "
                                 "gradients only: turn the module's sparse option off"));
  // Comm hooks get the buffer divided by world size; the built-in allreduce averages.
  const bool prescale = !builtin_hook() && world_size_ > 1;
  if (grad.data_ptr() == view.data_ptr()) {
    // gradient_as_bucket_view and autograd accumulated in place into the view.
    if (prescale) view.mul_(scale_t_);
  } else if (prescale) {
    // Copy and divide in one pass. The scale is a 0-dim tensor: libtorch 1.13's
    // mul_out(Scalar) has no CPU kernel and goes through a full-size temporary (6x slower).
    at::mul_out(view, grad, scale_t_);
  } else {
    view.copy_(grad);
  }
  if (buckets_[s.bucket].as_views) grad = view;
}

void Reducer::mark_ready_locked(int64_t i) {
  ready_[i] = 1;
  auto& b = buckets_[slots_[i].bucket];
  --b.pending;
}

void Reducer::launch_ready_buckets_locked() {
  // Strictly in index order: the k-th collective of the pass is bucket k on every rank.
  while (next_launch_ < (int64_t)buckets_.size() && buckets_[next_launch_].pending == 0) {
    auto& b = buckets_[next_launch_];
    b.result = builtin_hook() ? builtin_allreduce_locked(next_launch_)
                              : hook_(*group_, infos_[next_launch_]);
    b.launched = true;
    ++next_launch_;
    LOCKSTEP_CHECK(b.result.work != nullptr, "DDP comm hook returned no work for bucket ",
                   next_launch_ - 1);
  }
}

void Reducer::finalize() {
  const auto t0 = Clock::now();
  std::lock_guard<std::mutex> lk(mu_);
  if (!step_active_) return;
  const double backward_s = std::chrono::duration<double>(t0 - first_hook_).count();
  std::vector<int64_t> missing;
  try {
    for (size_t i = 0; i < params_.size(); ++i)
      if (!ready_[i]) missing.push_back(i);
    // Fill in parameters that got no gradient so every rank launches every bucket,
    // in order: this rank must not leave its peers waiting on a collective.
    for (auto it = missing.rbegin(); it != missing.rend(); ++it) {
      if (record_order_) observed_order_.push_back(*it);
      stage_grad_locked(*it);
      mark_ready_locked(*it);
    }
    launch_ready_buckets_locked();
    comm::WorkPtr used_work;
    if (options_.find_unused_parameters) {
      // "Used" = has a gradient now (from this pass or accumulated under no_sync).
      int32_t* u = used_map_.data_ptr<int32_t>();
      for (size_t i = 0; i < params_.size(); ++i) u[i] = params_[i].grad().defined() ? 1 : 0;
      if (world_size_ > 1) used_work = group_->allreduce(used_map_);
    }
    const auto wait_start = Clock::now();
    int64_t bytes = 0;
    for (auto& b : buckets_) {
      b.result.work->wait();
      if (b.result.finish) b.result.finish();
      bytes += b.result.bytes;
    }
    if (used_work) used_work->wait();
    const double exposed = seconds_since(wait_start);
    if (!missing.empty() && !options_.find_unused_parameters) {
      // The peers may have had every gradient and stepped: break the group so that no
      // replica drifts on silently (they raise at their next collective).
      auto err = std::make_exception_ptr(InvalidArgument(missing_message(missing)));
      if (world_size_ > 1) group_->abort(err);
      std::rethrow_exception(err);
    }
    write_back_locked(used_map_);
    stats_.step += 1;
    stats_.backward_s = backward_s;
    stats_.exposed_comm_s = exposed;
    stats_.bytes_sent = bytes;
    stats_.buckets = buckets_.size();
    stats_.unused_parameters = missing.size();
  } catch (...) {
    abandon_step_locked();
    if (record_order_) observed_order_.clear();  // record again on the next pass
    throw;
  }
  abandon_step_locked();  // resets the per-step state (all work is done by now)
  if (record_order_) {
    record_order_ = false;
    rebuild_pending_ = options_.rebuild_buckets && !rebuilt_;
  }
  stats_.finalize_s = seconds_since(t0);
}

void Reducer::write_back_locked(const at::Tensor& used_global) {
  at::NoGradGuard no_grad;
  const int32_t* used = used_global.defined() ? used_global.data_ptr<int32_t>() : nullptr;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Slot s = slots_[i];
    const at::Tensor& view = buckets_[s.bucket].views[s.index];
    at::Tensor& grad = params_[i].mutable_grad();
    if (grad.defined()) {
      // (a bucket reduced in place already left the averages in param.grad)
      if (!direct(buckets_[s.bucket]) && grad.data_ptr() != view.data_ptr()) grad.copy_(view);
    } else if (used == nullptr || used[i] != 0) {
      // No gradient here but some rank had one: adopt the average.
      grad = buckets_[s.bucket].as_views ? view : view.clone();
    }
    // else: unused on every rank -> stays undefined everywhere.
  }
}

void Reducer::abandon_step_locked() noexcept {
  for (auto& b : buckets_) {
    if (b.launched && b.result.work) {
      try {
        b.result.work->wait();
      } catch (...) {
        // Already reported (or being reported) by finalize; here we only make sure
        // no collective still writes into a buffer we are about to reuse.
      }
    }
    b.result = HookResult{};
    b.launched = false;
    b.fell_back = false;
    b.pending = static_cast<int64_t>(infos_[&b - buckets_.data()].param_indices.size());
  }
  std::fill(ready_.begin(), ready_.end(), 0);
  next_launch_ = 0;
  step_active_ = false;
  armed_ = false;
}

std::string Reducer::missing_message(const std::vector<int64_t>& missing) const {
  std::ostringstream os;
  os << "DDP (rank " << group_->rank() << "): " << missing.size()
     << " parameter(s) received no gradient in this backward pass: ";
  for (size_t k = 0; k < missing.size() && k < 20; ++k)
    os << (k ? ", " : "") << "'" << names_[missing[k]] << "'";
  if (missing.size() > 20) os << ", ...";
  os << ". They did not take part in computing the loss. If that is intended, construct "
        "DistributedDataParallel with DDPOptions::find_unused_parameters = true.";
  return os.str();
}

}  // namespace lockstep::ddp
