// python/src/backend.cpp: see backend.h.
#include "backend.h"

#include <Python.h>

#include <lockstep/comm/launch_env.h>
#include <lockstep/error.h>

#include "comm/backends/factories.h"  // internal: the shm/gloo factories take any c10d::Store

#include <ATen/core/ivalue.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>

namespace lockstep::python {
namespace {

comm::ReduceOp to_lockstep(const c10d::ReduceOp& op) {
  switch (op.op_) {
    case c10d::ReduceOp::SUM: return comm::ReduceOp::Sum;
    case c10d::ReduceOp::AVG: return comm::ReduceOp::Avg;
    case c10d::ReduceOp::MIN: return comm::ReduceOp::Min;
    case c10d::ReduceOp::MAX: return comm::ReduceOp::Max;
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
  LOCKSTEP_CHECK(ts.size() == 1,
                 op, ": the lockstep backend takes one tensor per call (got ", ts.size(), ")");
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

LockstepWork::LockstepWork(int rank, c10d::OpType type, comm::WorkPtr work,
                           std::vector<at::Tensor> outputs, std::function<void()> post)
    : c10d::Work(rank, type),
      work_(std::move(work)),
      outputs_(std::move(outputs)),
      post_(std::move(post)),
      future_(c10::make_intrusive<at::ivalue::Future>(
          c10::ListType::create(c10::TensorType::get()))) {}

void LockstepWork::complete() {
  std::exception_ptr err;
  try {
    if (work_) work_->wait();
    if (post_) post_();
  } catch (...) {
    err = std::current_exception();
  }
  work_.reset();
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
  comm::ProcessGroupOptions o;
  o.timeout = comm::Millis(timeout.count() > 0 ? timeout.count() : 300000);
  std::unique_ptr<comm::Backend> b;
  if (transport == "shm")
    b = comm::make_shm_backend(store_, "lockstep/", env, o.timeout);
  else if (transport == "gloo")
    b = comm::make_gloo_backend(store_, "lockstep/", env, o.timeout);
  else
    throw ConfigError(detail::concat("unknown lockstep transport '", transport,
                                     "'; choose shm or gloo (LOCKSTEP_BACKEND)"));
  group_ = std::make_shared<comm::ProcessGroup>(std::move(b), o);
  completer_ = std::thread([this] { completion_loop(); });
}

LockstepBackend::~LockstepBackend() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  // Python drops the backend with the GIL held, and the completion thread may need it to
  // release the last reference to a tensor that Python owns: join without it.
  PyThreadState* saved = nullptr;
  if (Py_IsInitialized() && PyGILState_Check()) saved = PyEval_SaveThread();
  if (completer_.joinable()) completer_.join();
  group_.reset();  // finishes lockstep's queued work, stops its comm thread
  if (saved) PyEval_RestoreThread(saved);
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

c10::intrusive_ptr<c10d::Work> LockstepBackend::track(c10d::OpType type, comm::WorkPtr work,
                                                      std::vector<at::Tensor> outputs,
                                                      std::function<void()> post) {
  auto w = c10::make_intrusive<LockstepWork>(getRank(), type, std::move(work),
                                             std::move(outputs), std::move(post));
  {
    std::lock_guard<std::mutex> lock(mu_);
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
  return track(c10d::OpType::BROADCAST, group_->broadcast(s.buf, o), tensors, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                          const c10d::AllreduceOptions& opts) {
  Staged s = stage(single(tensors, "allreduce"));
  comm::AllreduceOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::ALLREDUCE, group_->allreduce(s.buf, o), tensors, s.post);
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
  return track(c10d::OpType::ALLREDUCE_COALESCED, group_->allreduce_coalesced(bufs, o), tensors,
               post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::allgather(
    std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
    const c10d::AllgatherOptions& opts) {
  at::Tensor in = single(inputs, "allgather").contiguous();
  LOCKSTEP_CHECK(outputs.size() == 1 && outputs[0].size() == static_cast<size_t>(getSize()),
                 "allgather: expected one list of ", getSize(),
                 " output tensors");
  at::Tensor flat = at::empty({getSize() * in.numel()}, in.options());
  comm::AllgatherOptions o;
  o.timeout = op_timeout(opts.timeout);
  std::vector<at::Tensor> outs = outputs[0];
  const int64_t n = in.numel();
  auto post = [outs, flat, n]() mutable {
    for (size_t r = 0; r < outs.size(); ++r)
      outs[r].copy_(flat.narrow(0, static_cast<int64_t>(r) * n, n).view(outs[r].sizes()));
  };
  return track(c10d::OpType::ALLGATHER, group_->allgather(flat, in, o), outs, post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_allgather_base(
    at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts) {
  Staged s = stage(output);
  comm::AllgatherOptions o;
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::_ALLGATHER_BASE, group_->allgather(s.buf, input.contiguous(), o),
               {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::reduce_scatter(
    std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
    const c10d::ReduceScatterOptions& opts) {
  at::Tensor out = single(outputs, "reduce_scatter");
  LOCKSTEP_CHECK(inputs.size() == 1 && inputs[0].size() == static_cast<size_t>(getSize()),
                 "reduce_scatter: expected one list of ", getSize(),
                 " input tensors");
  std::vector<at::Tensor> flat_in;
  for (const auto& t : inputs[0]) flat_in.push_back(t.reshape({-1}));
  at::Tensor in = at::cat(flat_in);
  Staged s = stage(out);
  comm::ReduceScatterOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::REDUCE_SCATTER, group_->reduce_scatter(s.buf, in, o), outputs,
               s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::_reduce_scatter_base(
    at::Tensor& output, at::Tensor& input, const c10d::ReduceScatterOptions& opts) {
  Staged s = stage(output);
  comm::ReduceScatterOptions o;
  o.op = to_lockstep(opts.reduceOp);
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::_REDUCE_SCATTER_BASE,
               group_->reduce_scatter(s.buf, input.contiguous(), o), {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::alltoall_base(
    at::Tensor& output, at::Tensor& input, std::vector<int64_t>& output_splits,
    std::vector<int64_t>& input_splits, const c10d::AllToAllOptions& opts) {
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
  return track(c10d::OpType::ALLTOALL_BASE, group_->alltoall(s.buf, input.contiguous(), o),
               {output}, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::send(std::vector<at::Tensor>& tensors, int dst,
                                                     int tag) {
  comm::SendOptions o;
  o.tag = tag;
  return track(c10d::OpType::SEND, group_->send(single(tensors, "send").contiguous(), dst, o),
               tensors);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::recv(std::vector<at::Tensor>& tensors, int src,
                                                     int tag) {
  Staged s = stage(single(tensors, "recv"));
  comm::RecvOptions o;
  o.tag = tag;
  return track(c10d::OpType::RECV, group_->recv(s.buf, src, o), tensors, s.post);
}

c10::intrusive_ptr<c10d::Work> LockstepBackend::barrier(const c10d::BarrierOptions& opts) {
  comm::BarrierOptions o;
  o.timeout = op_timeout(opts.timeout);
  return track(c10d::OpType::BARRIER, group_->barrier(o), {});
}

}  // namespace lockstep::python
