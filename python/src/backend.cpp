// python/src/backend.cpp: see backend.h.
#include "backend.h"

#include <Python.h>

#include <lockstep/comm/launch_env.h>
#include <lockstep/comm/make_group.h>
#include <lockstep/error.h>

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace lockstep::python {
namespace {

comm::ReduceOp to_lockstep(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM:
      return comm::ReduceOp::Sum;
    case c10d::ReduceOp::AVG:
      return comm::ReduceOp::Avg;
    case c10d::ReduceOp::MIN:
      return comm::ReduceOp::Min;
    case c10d::ReduceOp::MAX:
      return comm::ReduceOp::Max;
    default:
      throw InvalidArgument(
          "lockstep backend: reduce op not supported (SUM, AVG, MIN and MAX are); "
          "use the gloo backend for PRODUCT, bitwise ops and PREMUL_SUM");
  }
}

comm::Millis op_timeout(std::chrono::milliseconds t) {
  // c10d's kUnsetTimeout (-1) means "the group's default", as lockstep's 0 does.
  return t.count() > 0 ? comm::Millis(t.count()) : comm::Millis(0);
}

at::Tensor single(std::vector<at::Tensor>& ts, const char* op) {
  LOCKSTEP_CHECK(ts.size() == 1, op, ": the lockstep backend takes one tensor per call (got ",
                 ts.size(), ")");
  return ts[0];
}

// A contiguous tensor to hand lockstep, and the copy back into `t` when it is a staging one.
struct Staged {
  at::Tensor buf;
  std::function<void()> post;
};

Staged stage(const at::Tensor& t) {
  if (t.is_contiguous()) return {t, {}};
  at::Tensor buf = t.contiguous();
  at::Tensor dst = t;
  return {buf, [dst, buf]() mutable { dst.copy_(buf); }};
}

}  // namespace

LockstepWork::LockstepWork(int rank, c10d::OpType type, std::vector<comm::WorkPtr> works,
                           std::vector<at::Tensor> outputs, std::function<void()> post)
    : c10d::Work(rank, type),
      works_(std::move(works)),
      outputs_(std::move(outputs)),
      post_(std::move(post)),
      future_(
          c10::make_intrusive<at::ivalue::Future>(c10::ListType::create(c10::TensorType::get()))) {}

void LockstepWork::complete() {
  std::exception_ptr err;
  try {
    for (const auto& w : works_) w->wait();
    if (post_) post_();
  } catch (...) {
    err = std::current_exception();
  }
  works_.clear();
  post_ = nullptr;
  finish(err);
  if (err)
    future_->setError(err);
  else
    future_->markCompleted(c10::IValue(outputs_));
}

LockstepBackend::LockstepBackend(const c10::intrusive_ptr<c10d::Store>& store, int rank, int size,
                                 std::chrono::milliseconds timeout, const std::string& transport)
    : c10d::Backend(rank, size), store_(store) {
  comm::LaunchEnv env;
  env.rank = rank;
  env.world_size = size;
  env.local_rank = rank;  // the transport says whether they share a node (Python checks)
  env.local_world_size = transport == "shm" ? size : 1;
  env.launcher = "torchrun";
  if (transport != "shm" && transport != "gloo")
    throw ConfigError(detail::concat("unknown lockstep transport '", transport,
                                     "'; choose shm or gloo (LOCKSTEP_BACKEND)"));
  // make_group reads LOCKSTEP_TIMEOUT_S (when torch passes no timeout of its own),
  // LOCKSTEP_CHECK_COLLECTIVES, LOCKSTEP_DEBUG and LOCKSTEP_STALL_WARN_S as init() does.
  comm::InitOptions o;
  o.backend = transport;
  if (timeout.count() > 0) o.timeout = comm::Millis(timeout.count());
  o.env = env;
  group_ = comm::make_group(store_, o, "lockstep/");
  completer_ = std::thread([this] { completion_loop(); });
}

LockstepBackend::~LockstepBackend() {
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  stop_completer();
  group_.reset();  // finishes lockstep's queued work, stops its comm thread
  if (saved) PyEval_RestoreThread(saved);
}

void LockstepBackend::shutdown() {
  // Python drops or shuts down the backend with the GIL held, and the completion thread may
  // need it to release the last reference to a tensor that Python owns: join without it.
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  stop_completer();
  // lockstep's comm thread drops the tensors of each op after completing it; during
  // interpreter finalization that would need the GIL too: stop it as well.
  std::shared_ptr<comm::ProcessGroup> group;
  {
    std::lock_guard<std::mutex> lock(mu_);
    group.swap(group_);
  }
  group.reset();
  if (saved) PyEval_RestoreThread(saved);
}

comm::ProcessGroup& LockstepBackend::group() {
  std::lock_guard<std::mutex> lock(mu_);
  if (!group_)
    throw CommError(CommError::Kind::Aborted, CommContext{},
                    "the lockstep backend was shut down (interpreter exit or "
                    "destroy_process_group); no further collectives");
  return *group_;
}

void LockstepBackend::stop_completer() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  std::lock_guard<std::mutex> lock(join_mu_);
  if (completer_.joinable()) completer_.join();
}

void LockstepBackend::completion_loop() {
  for (;;) {
    c10::intrusive_ptr<LockstepWork> w;
    {
      std::unique_lock<std::mutex> lock(mu_);
      cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
      if (pending_.empty()) return;  // stopping, nothing left
      w = pending_.front();
      pending_.pop_front();
    }
    w->complete();
  }
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::track(c10d::OpType type,
                                                      std::vector<comm::WorkPtr> works,
                                                      std::vector<at::Tensor> outputs,
                                                      std::function<void()> post) {
  auto w = c10::make_intrusive<LockstepWork>(getRank(), type, std::move(works), std::move(outputs),
                                             std::move(post));
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (stopping_) {
      // Too late to complete it: the op is queued in lockstep's group (whose peers expect
      // it) but nothing would mark this Work. Only reachable after shutdown().
      throw CommError(CommError::Kind::Aborted, CommContext{},
                      "the lockstep backend was shut down (interpreter exit or "
                      "destroy_process_group); no further collectives");
    }
    pending_.push_back(w);
  }
  cv_.notify_one();
  return w;
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::broadcast(std::vector<at::Tensor>& tensors,
                                                          const c10d::BroadcastOptions& opts) {
  Staged s = stage(single(tensors, "broadcast"));
  comm::BroadcastOptions o;
  o.root = static_cast<int>(opts.rootRank);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::BROADCAST, group().broadcast(s.buf, o), tensors, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  comm::AllreduceOptions o;
  o.op = to_lockstep(opts.reduceOp);
  if (auto w = maybe_compressed(tensors[0], o.op)) return w;
  Staged s = stage(single(tensors, "allreduce"));
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::ALLREDUCE, group().allreduce(s.buf, o), tensors, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::maybe_compressed(at::Tensor& t, comm::ReduceOp op) {
  auto options = compression();
  if (!options || !options->enabled()) return {};
  const auto dt = t.scalar_type();
  if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf) return {};
  if (op != comm::ReduceOp::Sum && op != comm::ReduceOp::Avg) return {};
  if (t.numel() < options->min_layer || getSize() == 1) return {};
  std::shared_ptr<compress::CompressedAllreduce> plan;
  {
    std::lock_guard<std::mutex> lock(plans_mu_);
    if (plans_for_ != options) {
      plans_.clear();
      plans_for_ = options;
    }
    auto& p = plans_[t.numel()];
    if (!p)
      p = std::make_shared<compress::CompressedAllreduce>(
          *options, std::vector<compress::LayerSpan>{{"", 0, t.numel()}}, t.numel(), getSize());
    plan = p;
  }
  Staged s = stage(t);
  comm::WorkPtr w = plan->run_async(group(), s.buf, op == comm::ReduceOp::Avg);
  auto post = [plan, s] {
    plan->finish();  // NonFiniteGradient on every rank alike
    if (s.post) s.post();
  };
  return track(c10d::OpType::ALLREDUCE, w, {t}, post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allreduce_coalesced(
    std::vector<at::Tensor>& tensors, const c10d::AllreduceCoalescedOptions& opts) {
  std::vector<at::Tensor> bufs;
  std::vector<std::function<void()>> posts;
  for (const auto& t : tensors) {
    Staged s = stage(t);
    bufs.push_back(s.buf);
    if (s.post) posts.push_back(s.post);
  }
  comm::AllreduceOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  auto post = [posts] {
    for (const auto& p : posts) p();
  };
  return track(c10d::OpType::ALLREDUCE_COALESCED, group().allreduce_coalesced(bufs, o), tensors,
               post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "allgather").contiguous();
  LOCKSTEP_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                 "allgather: expected one list of ", getSize(), " output tensors");
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  comm::AllgatherOptions o;
  o.timeout = op_timeout(opts.timeout);
  std::vector<at::Tensor> outs = outputs[0];
  const int64_t n = in.numel();
  auto post = [outs, flat, n]() mutable {
    for (size_t r = 0; r < outs.size(); ++r)
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  };
  return track(c10d::OpType::ALLGATHER, group().allgather(flat, in, o), outs, post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  Staged s = stage(output);
  comm::AllgatherOptions o;
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::_ALLGATHER_BASE, group().allgather(s.buf, input.contiguous(), o),
               {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  LOCKSTEP_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                 "reduce_scatter: expected one list of ", getSize(), " input tensors");
  std::vector<at::Tensor> flat_in;
  for (const auto& t : inputs[0]) flat_in.push_back(t.reshape({-1}));
  at::Tensor in = at::cat(flat_in);
  Staged s = stage(out);
  comm::ReduceScatterOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::REDUCE_SCATTER, group().reduce_scatter(s.buf, in, o), outputs, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Staged s = stage(output);
  comm::ReduceScatterOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::_REDUCE_SCATTER_BASE,
               group().reduce_scatter(s.buf, input.contiguous(), o), {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                              std::vector<int64_t>& output_splits,
                                                              std::vector<int64_t>& input_splits,
                                                              const c10d::AllToAllOptions& opts) {
  auto even = [&](const std::vector<int64_t>& splits, const at::Tensor& t) {
    if (splits.empty()) return true;
    for (int64_t s : splits)
      if (s * getSize() != t.size(0)) return false;
    return true;
  };
  LOCKSTEP_CHECK(even(output_splits, output) && even(input_splits, input),
                 "alltoall_base: the lockstep backend exchanges equal splits only (lockstep's "
                 "alltoall); use the gloo backend for uneven split sizes");
  Staged s = stage(output);
  comm::AlltoallOptions o;
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::ALLTOALL_BASE, group().alltoall(s.buf, input.contiguous(), o),
               {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather_into_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  LOCKSTEP_CHECK(outputs.size() == inputs.size(),
                 "allgather_into_tensor_coalesced: ", outputs.size(), " outputs for ",
                 inputs.size(), " inputs");
  comm::AllgatherOptions o;
  o.timeout = op_timeout(opts.timeout);
  std::vector<comm::WorkPtr> works;
  std::vector<std::function<void()>> posts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Staged s = stage(outputs[i]);
    works.push_back(group().allgather(s.buf, inputs[i].contiguous(), o));
    if (s.post) posts.push_back(s.post);
  }
  return track(c10d::OpType::COALESCED, std::move(works), outputs, [posts] {
    for (const auto& p : posts) p();
  });
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce_scatter_tensor_coalesced(
    std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  LOCKSTEP_CHECK(outputs.size() == inputs.size(),
                 "reduce_scatter_tensor_coalesced: ", outputs.size(), " outputs for ",
                 inputs.size(), " inputs");
  comm::ReduceScatterOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  std::vector<comm::WorkPtr> works;
  std::vector<std::function<void()>> posts;
  for (size_t i = 0; i < inputs.size(); ++i) {
    Staged s = stage(outputs[i]);
    works.push_back(group().reduce_scatter(s.buf, inputs[i].contiguous(), o));
    if (s.post) posts.push_back(s.post);
  }
  return track(c10d::OpType::COALESCED, std::move(works), outputs, [posts] {
    for (const auto& p : posts) p();
  });
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  comm::SendOptions o;
  o.tag = tag;
  return track(c10d::OpType::SEND, group().send(single(tensors, "send").contiguous(), dst, o),
               tensors);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  Staged s = stage(single(tensors, "recv"));
  comm::RecvOptions o;
  o.tag = tag;
  return track(c10d::OpType::RECV, group().recv(s.buf, src, o), tensors, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::barrier(const c10d::BarrierOptions& opts) {
  comm::BarrierOptions o;
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::BARRIER, group().barrier(o), {});
}

}  // namespace lockstep::python

namespace lockstep::python {
namespace {
std::mutex compression_mu;
std::shared_ptr<const compress::QsgdOptions> compression_options;
}  // namespace

void set_compression(std::shared_ptr<const compress::QsgdOptions> options) {
  if (options) compress::validate(*options);
  std::lock_guard<std::mutex> lock(compression_mu);
  compression_options = std::move(options);
}

std::shared_ptr<const compress::QsgdOptions> compression() {
  std::lock_guard<std::mutex> lock(compression_mu);
  return compression_options;
}
}  // namespace lockstep::python
