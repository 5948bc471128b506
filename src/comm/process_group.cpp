#include <lockstep/comm/process_group.h>

#include "comm/device_staging.h"
#include "comm/op_fingerprint.h"
#include "comm/stall_inspector.h"
#include "comm/store_channel.h"
#include "comm/validate.h"

#include <ATen/ATen.h>
#include <ATen/core/grad_mode.h>  // at::NoGradGuard; libtorch 2.x: not via ATen.h

#include <algorithm>
#include <utility>

namespace lockstep::comm {

ProcessGroup::ProcessGroup(std::unique_ptr<Backend> backend, ProcessGroupOptions options)
    : backend_(std::move(backend)),
      options_(std::move(options)),
      rank_(backend_->rank()),
      size_(backend_->size()) {
  link_->group = this;
  thread_ = std::thread([this] { comm_loop(); });
  start_inspector();
}

namespace {
bool is_collective(OpKind k) { return k != OpKind::Send && k != OpKind::Recv; }

// Small ops on a deadline-bounded backend (shm) are queued without waking the comm
// thread while it polls (within kActiveFor of the last op): the caller's wait() will
// most likely run the op itself (run_here), and a wake would cost a futex syscall and
// a context switch on another core, several times the op itself. An op nobody waits on
// is taken by the comm thread's next poll, after at most ~kDeferFor.
constexpr uint64_t kDeferBytes = 64 << 10;
constexpr Clock::duration kDeferFor = std::chrono::milliseconds(1);
constexpr Clock::duration kActiveFor = std::chrono::milliseconds(100);

uint64_t op_bytes(const OpDesc& d) {
  return static_cast<uint64_t>(std::max<int64_t>(d.numel, 0)) * c10::elementSize(d.dtype);
}
}  // namespace

void ProcessGroup::start_inspector() {
  StallInspector::Config c;
  c.rank = rank_;
  c.size = size_;
  c.warn_s = std::chrono::duration<double>(options_.stall_warn).count();
  c.timeout_s = std::chrono::duration<double>(options_.timeout).count();
  // Through a link of its own (Work handles hold link_ while they run an op): the
  // inspector's thread may outlive the group (stuck in a store call).
  inspector_link_->group = this;
  c.local = [link = inspector_link_]() -> std::optional<RankActivity> {
    std::lock_guard<std::mutex> l(link->mu);
    if (!link->group) return std::nullopt;
    return link->group->activity();
  };
  if (!backend_->last_entered().empty()) {
    c.peers = [b = backend_.get()] { return b->last_entered(); };
  } else {
    c.store = options_.side_store;
  }
  inspector_ = std::make_unique<StallInspector>(std::move(c));
}

void ProcessGroup::entered_locked(const OpDesc& d, Clock::time_point now) {
  if (!is_collective(d.kind)) return;
  last_entered_ = d;
  entered_at_ = now;
  in_collective_ = true;
}

RankActivity ProcessGroup::activity() const {
  std::lock_guard<std::mutex> lock(mu_);
  RankActivity a;
  a.known = true;
  a.last = last_entered_;
  a.in_op_known = true;
  a.in_op = in_collective_;
  if (last_entered_.seq != 0)
    a.since_s = std::chrono::duration<double>(Clock::now() - entered_at_).count();
  return a;
}

ProcessGroup::~ProcessGroup() {
  {
    std::lock_guard<std::mutex> l(inspector_link_->mu);
    inspector_link_->group = nullptr;
  }
  inspector_.reset();
  {
    std::lock_guard<std::mutex> l(link_->mu);
    link_->group = nullptr;
  }
  std::unique_lock<std::mutex> lock(mu_);
  stopping_ = true;
  cv_.notify_all();
  // Finish the queued work, but never hang on a backend that is stuck past its op's
  // deadline (e.g. a Work::wait() already gave up on it) or on a broken group: abort it.
  bool aborted = false;
  while (!exited_) {
    const bool overdue = running_ && Clock::now() > running_deadline_ + Millis(2000);
    if (!aborted && (broken_ || overdue)) {
      backend_->abort();
      aborted = true;
    }
    cv_.wait_for(lock, Millis(50));
  }
  lock.unlock();
  thread_.join();
}

CommContext ProcessGroup::context_for(const OpDesc& d) const { return op_context(*backend_, d); }

WorkPtr ProcessGroup::enqueue(OpDesc desc, Millis timeout, DeviceStaging& staging,
                              std::function<void(const OpContext&)> run) {
  return enqueue(desc, timeout, staging.wrap(std::move(run)), staging.waiter());
}

WorkPtr ProcessGroup::enqueue(OpDesc desc, Millis timeout,
                              std::function<void(const OpContext&)> run,
                              std::function<void()> on_wait) {
  std::unique_lock<std::mutex> lock(mu_);
  const auto me = std::this_thread::get_id();
  if (me == thread_.get_id() || (running_here_ && me == here_thread_))
    throw InvalidArgument(lockstep::detail::concat(
        op_kind_name(desc.kind),
        ": issued from the group's own comm thread (inside a "
        "composite body?); waiting on it there would deadlock: call the Backend directly"));
  const bool collective = desc.kind != OpKind::Send && desc.kind != OpKind::Recv;
  if (collective) desc.seq = next_seq_++;
  auto work = std::make_shared<Work>(
      desc, timeout, context_for(desc),
      [link = link_](std::exception_ptr err) {
        std::lock_guard<std::mutex> l(link->mu);
        if (link->group) link->group->abort(std::move(err));
      },
      [link = link_](Work& w) {
        std::lock_guard<std::mutex> l(link->mu);  // the group outlives the run
        if (link->group) link->group->run_here(w);
      });
  if (on_wait) work->on_wait(std::move(on_wait));
  if (broken_) {
    work->finish(broken_);
    return work;
  }
  const Clock::time_point now = Clock::now();
  active_until_ = now + kActiveFor;
  const bool defer = polling_ && queue_.empty() && backend_->bounded_by_deadline() &&
                     op_bytes(desc) <= kDeferBytes;
  queue_.push_back(Task{work, desc, timeout, std::move(run), defer, now});
  lock.unlock();
  if (!defer) cv_.notify_one();
  return work;
}

bool ProcessGroup::front_ready_locked(Clock::time_point now) const {
  if (running_here_) return false;
  if (stopping_) return true;
  if (queue_.empty()) return false;
  const Task& t = queue_.front();
  return !t.deferred || queue_.size() > 1 || now - t.queued_at >= kDeferFor;
}

void ProcessGroup::comm_loop() {
  for (;;) {
    Task task;
    {
      std::unique_lock<std::mutex> lock(mu_);
      running_ = false;
      // A waiting thread may be running an op itself (run_here), which set the flag and
      // clears it when done: clearing it here would hide that op from the stall inspector.
      if (!running_here_) in_collective_ = false;
      for (;;) {
        const Clock::time_point now = Clock::now();
        if (front_ready_locked(now)) break;
        // Only deadline-bounded backends defer ops (enqueue()); others need no poll.
        if (queue_.empty() && (now >= active_until_ || !backend_->bounded_by_deadline())) {
          cv_.wait(lock);  // idle: enqueue() will wake us
          continue;
        }
        polling_ = true;  // recent ops: poll, so that small ones need no wake
        cv_.wait_for(lock, kDeferFor);
        polling_ = false;
      }
      if (queue_.empty()) {
        exited_ = true;
        cv_.notify_all();
        return;
      }
      task = std::move(queue_.front());
      queue_.pop_front();
      if (broken_) {
        lock.unlock();
        task.work->finish(broken_);
        continue;
      }
      running_ = true;
      const Clock::time_point now = Clock::now();
      running_deadline_ = now + task.timeout;
      entered_locked(task.desc, now);
    }
    run_task(task);
  }
}

void ProcessGroup::run_here(Work& w) {
  Task task;
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!backend_->bounded_by_deadline() || running_ || running_here_ || broken_ ||
        queue_.empty() || queue_.front().work.get() != &w)
      return;
    task = std::move(queue_.front());
    queue_.pop_front();
    running_here_ = true;
    here_thread_ = std::this_thread::get_id();
    entered_locked(task.desc, Clock::now());
  }
  run_task(task);
  bool queued;
  {
    std::lock_guard<std::mutex> lock(mu_);
    running_here_ = false;
    in_collective_ = false;
    here_thread_ = std::thread::id();
    queued = !queue_.empty() || stopping_;
  }
  // The comm thread may take the ops queued behind it; with none, a wake would only
  // cost it (and this core) a context switch.
  if (queued) cv_.notify_all();
}

void ProcessGroup::run_task(Task& task) {
  // The comm thread never records autograd history (e.g. avg's div_ on a tensor that
  // requires grad, or a composite body's arithmetic).
  at::NoGradGuard no_grad;
  OpContext ctx{task.desc, Clock::now(), {}, task.timeout};
  ctx.deadline = ctx.start + task.timeout;
  task.work->mark_started();
  std::exception_ptr err;
  try {
    // Composites are checked here even on shm: their fingerprint is ours to compare.
    const bool backend_checks =
        backend_->checks_descriptors() && task.desc.kind != OpKind::Composite;
    if (is_collective(task.desc.kind) && size_ > 1 && !backend_checks &&
        (options_.check_collectives || options_.detail)) {
      if (options_.detail && options_.side_store) {
        check_through_store(ctx);
      } else {
        check_descriptor(ctx);
      }
    }
    task.run(ctx);
    // What the op captured (its tensors) is released before the waiter wakes: memory the
    // caller frees after wait() is free then, not when the next op replaces this task.
    task.run = nullptr;
    task.work->finish();
    return;
  } catch (const CommError&) {
    err = std::current_exception();
  } catch (const std::exception& e) {
    // Anything else a transport or a composite body throws gets this rank's context.
    err = std::make_exception_ptr(
        CommError(CommError::Kind::Failed, op_context(*backend_, ctx.desc, &ctx), e.what()));
  } catch (...) {
    err = std::make_exception_ptr(CommError(
        CommError::Kind::Failed, op_context(*backend_, ctx.desc, &ctx), "unknown exception"));
  }
  task.run = nullptr;
  {
    std::lock_guard<std::mutex> lock(mu_);
    fail_locked(err);
  }
  task.work->finish(err);
}

// The first failure breaks the group; the backend is aborted so that peers blocked in
// this collective learn of it (shm publishes it in the segment) instead of timing out.
void ProcessGroup::fail_locked(std::exception_ptr err) {
  if (broken_) return;
  broken_ = std::move(err);
  broken_flag_.store(true, std::memory_order_release);
  backend_->abort();
}

void ProcessGroup::abort(std::exception_ptr why) {
  std::lock_guard<std::mutex> lock(mu_);
  fail_locked(
      why ? std::move(why)
          : std::make_exception_ptr(CommError(CommError::Kind::Aborted, context_for(OpDesc{}),
                                              "aborted by the program")));
}

bool ProcessGroup::broken() const {
  std::lock_guard<std::mutex> lock(mu_);
  return broken_ != nullptr;
}

// One small allgather of every rank's fingerprint, so that ranks that disagree on the
// collective fail with a clear message instead of exchanging garbage.
void ProcessGroup::check_descriptor(const OpContext& ctx) {
  const OpDesc& d = ctx.desc;
  const PackedOp packed = pack_op(d);
  auto mine = at::empty({kFingerprintWords}, at::kLong);
  std::copy(packed.begin(), packed.end(), mine.data_ptr<int64_t>());
  auto all = at::empty({static_cast<int64_t>(kFingerprintWords) * size_}, at::kLong);
  OpContext check = ctx;
  check.desc.kind = OpKind::Allgather;
  check.desc.numel = kFingerprintWords;
  check.desc.dtype = at::kLong;
  try {
    backend_->allgather(all, mine, check);
  } catch (const CommError& e) {
    // Report the collective the user issued, not our check's allgather.
    CommContext c = op_context(*backend_, d, &ctx);
    c.peer = e.context().peer;
    throw CommError(e.kind(), c, e.detail());
  }
  // Every rank compares every rank with rank 0, so all raise the same message.
  const auto* a = all.data_ptr<int64_t>();
  const OpDesc leader = unpack_op(a);
  for (int r = 1; r < size_; ++r) {
    const OpDesc theirs = unpack_op(a + static_cast<ptrdiff_t>(r) * kFingerprintWords);
    if (same_fingerprint(leader, theirs)) continue;
    CommContext c = context_for(d);
    c.peer = rank_ == r ? 0 : r;
    throw CommError(CommError::Kind::Mismatch, c, describe_mismatch(0, leader, r, theirs));
  }
}

// LOCKSTEP_DEBUG=DETAIL on a group with a side store: the same check, through the store
// (exchange_fingerprints), so the backend carries nothing but the op itself.
void ProcessGroup::check_through_store(const OpContext& ctx) {
  const OpDesc& d = ctx.desc;
  const auto stop = [this] { return broken_flag_.load(std::memory_order_acquire); };
  FingerprintVerdict v;
  try {
    v = exchange_fingerprints(*options_.side_store, rank_, size_, d, ctx.deadline, stop);
  } catch (const std::exception& e) {
    throw CommError(
        CommError::Kind::Failed, op_context(*backend_, d, &ctx),
        lockstep::detail::concat("the fingerprint check through the rendezvous store failed "
                                 "(LOCKSTEP_DEBUG=DETAIL): ",
                                 e.what()));
  }
  CommContext c = op_context(*backend_, d, &ctx);
  using S = FingerprintVerdict::Status;
  switch (v.status) {
    case S::Agree:
      return;
    case S::Mismatch:
      c.peer = rank_ == v.rank ? 0 : v.rank;
      throw CommError(CommError::Kind::Mismatch, c,
                      describe_mismatch(0, v.leader, v.rank, v.other));
    case S::Stopped:
      throw CommError(CommError::Kind::Aborted, c, "the group was aborted");
    case S::Missing:
      break;
  }
  std::string list;
  for (int r : v.missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
  c.peer = v.missing.empty() ? 0 : v.missing[0];
  throw CommError(
      CommError::Kind::Timeout, c,
      v.missing.empty()
          ? lockstep::detail::concat("every rank entered ", describe_op(d),
                                     " but rank 0 published no verdict on their fingerprints "
                                     "(LOCKSTEP_DEBUG=DETAIL)")
          : lockstep::detail::concat("rank(s) ", list, " never entered ", describe_op(d),
                                     " (LOCKSTEP_DEBUG=DETAIL's fingerprint check)"));
}

WorkPtr ProcessGroup::allreduce(at::Tensor& t, const AllreduceOptions& o) {
  validate_tensor(t, "allreduce");
  validate_reduce(t, o.op, "allreduce");
  OpDesc d{OpKind::Allreduce, 0, t.numel(), t.scalar_type(), o.op, -1, 0};
  const int p = size_;
  const bool sum = o.op == ReduceOp::Avg && !backend_->averages();  // then divide (p > 1)
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor h = st.add(t, true, true);
  return enqueue(d, resolve(o.timeout), st,
                 [this, h, op = o.op, p, sum](const OpContext& ctx) mutable {
                   backend_->allreduce(h, sum ? ReduceOp::Sum : op, ctx);
                   if (sum && p > 1) h.div_(p);
                 });
}

WorkPtr ProcessGroup::allreduce_coalesced(std::vector<at::Tensor> ts, const AllreduceOptions& o) {
  LOCKSTEP_CHECK(!ts.empty(), "allreduce_coalesced: the tensor list is empty");
  int64_t numel = 0;
  for (const auto& t : ts) {
    validate_tensor(t, "allreduce_coalesced");
    if (t.device() != ts[0].device())
      throw InvalidArgument(lockstep::detail::concat("allreduce_coalesced: tensors on ",
                                                     ts[0].device().str(), " and ",
                                                     t.device().str(), "; pass one device"));
    if (t.scalar_type() != ts[0].scalar_type())
      throw InvalidArgument(lockstep::detail::concat(
          "allreduce_coalesced: tensors mix ", dtype_name(ts[0].scalar_type()), " and ",
          dtype_name(t.scalar_type()), "; use one call per dtype"));
    numel += t.numel();
  }
  validate_reduce(ts[0], o.op, "allreduce_coalesced");
  OpDesc d{OpKind::Allreduce, 0, numel, ts[0].scalar_type(), o.op, -1, 0};
  DeviceStaging st(backend_->takes_device_tensors());
  for (auto& t : ts) t = st.add(t, true, true);
  return enqueue(d, resolve(o.timeout), st,
                 [this, ts = std::move(ts), op = o.op](const OpContext& ctx) mutable {
                   backend_->allreduce_coalesced(ts, op, ctx);
                 });
}

WorkPtr ProcessGroup::broadcast(at::Tensor& t, const BroadcastOptions& o) {
  validate_tensor(t, "broadcast");
  validate_rank(o.root, size_, "broadcast root");
  OpDesc d{OpKind::Broadcast, 0, t.numel(), t.scalar_type(), ReduceOp::Sum, o.root, 0};
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor h = st.add(t, rank_ == o.root, true);
  return enqueue(d, resolve(o.timeout), st, [this, h, root = o.root](const OpContext& ctx) mutable {
    backend_->broadcast(h, root, ctx);
  });
}

WorkPtr ProcessGroup::allgather(at::Tensor& out, const at::Tensor& in, const AllgatherOptions& o) {
  validate_pair(out, in, "allgather");
  validate_multiple(out, in.numel() * size_, "allgather", "output", "size() * input.numel()");
  OpDesc d{OpKind::Allgather, 0, in.numel(), in.scalar_type(), ReduceOp::Sum, -1, 0};
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor ho = st.add(out, false, true), hi = st.add(in, true, false);
  return enqueue(d, resolve(o.timeout), st, [this, ho, hi](const OpContext& ctx) mutable {
    backend_->allgather(ho, hi, ctx);
  });
}

WorkPtr ProcessGroup::reduce_scatter(at::Tensor& out, const at::Tensor& in,
                                     const ReduceScatterOptions& o) {
  validate_pair(out, in, "reduce_scatter");
  validate_reduce(out, o.op, "reduce_scatter");
  validate_multiple(in, out.numel() * size_, "reduce_scatter", "input", "size() * output.numel()");
  OpDesc d{OpKind::ReduceScatter, 0, in.numel(), in.scalar_type(), o.op, -1, 0};
  const int p = size_;
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor ho = st.add(out, false, true), hi = st.add(in, true, false);
  return enqueue(d, resolve(o.timeout), st,
                 [this, ho, hi, op = o.op, p](const OpContext& ctx) mutable {
                   backend_->reduce_scatter(ho, hi, op == ReduceOp::Avg ? ReduceOp::Sum : op, ctx);
                   if (op == ReduceOp::Avg) ho.div_(p);
                 });
}

WorkPtr ProcessGroup::alltoall(at::Tensor& out, const at::Tensor& in, const AlltoallOptions& o) {
  validate_pair(out, in, "alltoall");
  validate_multiple(out, in.numel(), "alltoall", "output", "input.numel()");
  LOCKSTEP_CHECK(in.numel() % size_ == 0, "alltoall: input.numel() (", in.numel(),
                 ") must be a multiple of the world size (", size_, ")");
  OpDesc d{OpKind::Alltoall, 0, in.numel(), in.scalar_type(), ReduceOp::Sum, -1, 0};
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor ho = st.add(out, false, true), hi = st.add(in, true, false);
  return enqueue(d, resolve(o.timeout), st,
                 [this, ho, hi](const OpContext& ctx) mutable { backend_->alltoall(ho, hi, ctx); });
}

WorkPtr ProcessGroup::send(const at::Tensor& t, int dst, const SendOptions& o) {
  validate_tensor(t, "send");
  validate_rank(dst, size_, "send destination");
  LOCKSTEP_CHECK(dst != rank_, "send: rank ", rank_, " cannot send to itself");
  OpDesc d{OpKind::Send, 0, t.numel(), t.scalar_type(), ReduceOp::Sum, dst, o.tag};
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor h = st.add(t, true, false);
  return enqueue(d, resolve(o.timeout), st, [this, h, dst, tag = o.tag](const OpContext& ctx) {
    backend_->send(h, dst, tag, ctx);
  });
}

WorkPtr ProcessGroup::recv(at::Tensor& t, int src, const RecvOptions& o) {
  validate_tensor(t, "recv");
  validate_rank(src, size_, "recv source");
  LOCKSTEP_CHECK(src != rank_, "recv: rank ", rank_, " cannot receive from itself");
  OpDesc d{OpKind::Recv, 0, t.numel(), t.scalar_type(), ReduceOp::Sum, src, o.tag};
  DeviceStaging st(backend_->takes_device_tensors());
  at::Tensor h = st.add(t, false, true);
  return enqueue(d, resolve(o.timeout), st,
                 [this, h, src, tag = o.tag](const OpContext& ctx) mutable {
                   backend_->recv(h, src, tag, ctx);
                 });
}

WorkPtr ProcessGroup::barrier(const BarrierOptions& o) {
  OpDesc d{OpKind::Barrier, 0, 0, at::kByte, ReduceOp::Sum, -1, 0};
  return enqueue(d, resolve(o.timeout), [this](const OpContext& ctx) { backend_->barrier(ctx); });
}

at::Tensor ProcessGroup::alloc_shared(int64_t numel, at::ScalarType dtype) {
  LOCKSTEP_CHECK(numel >= 0, "alloc_shared: negative element count ", numel);
  LOCKSTEP_CHECK(is_supported_dtype(dtype), "alloc_shared: unsupported dtype ", dtype_name(dtype));
  LOCKSTEP_CHECK(numel <= (int64_t{1} << 40), "alloc_shared: ", numel, " elements is too many");
  if (size_ == 1 || !backend_->shares_memory()) return {};
  OpDesc d{OpKind::AllocShared, 0, numel, dtype, ReduceOp::Sum, -1, 0};
  auto out = std::make_shared<at::Tensor>();
  enqueue(d, options_.timeout, [this, out, numel, dtype](const OpContext& ctx) {
    *out = backend_->alloc_shared(numel, dtype, ctx);
  })->wait();
  return *out;
}

WorkPtr ProcessGroup::run_composite(int64_t numel, at::ScalarType dtype,
                                    std::function<void(Backend&, const OpContext&)> body,
                                    Millis timeout, int64_t fingerprint) {
  OpDesc d{OpKind::Composite, 0, numel, dtype, ReduceOp::Sum, -1, 0};
  d.fingerprint = fingerprint;
  return enqueue(d, resolve(timeout),
                 [this, body = std::move(body)](const OpContext& ctx) { body(*backend_, ctx); });
}

WorkPtr ProcessGroup::run_composite_on(
    at::Tensor& t, std::function<void(Backend&, const OpContext&, at::Tensor&)> body,
    Millis timeout, int64_t fingerprint) {
  validate_tensor(t, "run_composite_on");
  OpDesc d{OpKind::Composite, 0, t.numel(), t.scalar_type(), ReduceOp::Sum, -1, 0};
  d.fingerprint = fingerprint;
  DeviceStaging st(/*backend_takes_device_tensors=*/false);
  at::Tensor h = st.add(t, true, true);
  return enqueue(
      d, resolve(timeout), st,
      [this, h, body = std::move(body)](const OpContext& ctx) mutable { body(*backend_, ctx, h); });
}

}  // namespace lockstep::comm
