// The NCCL backend at world size 1 on one GPU (skips without a GPU), and the stream
// contract on a real CUDA stream: a kernel queued after StreamWork::wait() sees the
// result without the host synchronising. More ranks: docs/gpu.md (needs 2 GPUs).
#include "comm/backend_factories.h"

#include <lockstep/comm/cuda_stream_work.h>
#include <lockstep/comm/init.h>
#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>

using namespace lockstep::comm;

namespace {

#define NEED_GPU()                                    \
  if (!torch::cuda::is_available()) {                 \
    GTEST_SKIP() << "needs a CUDA GPU: none visible"; \
  }

OpContext context(OpKind kind, int64_t numel) {
  OpContext c;
  c.desc.kind = kind;
  c.desc.numel = numel;
  c.start = Clock::now();
  c.timeout = Millis(30000);
  c.deadline = c.start + c.timeout;
  return c;
}

std::unique_ptr<Backend> one_rank() {
  LaunchEnv env;  // rank 0 of 1, local rank 0
  auto store = c10::make_intrusive<c10d::HashStore>();
  return make_nccl_backend(store, "test/", env, Millis(30000));
}

TEST(CudaNccl, EveryCollectiveAtWorldSizeOne) {
  NEED_GPU();
  auto b = one_rank();
  EXPECT_EQ(b->name(), "nccl");
  const auto cuda = at::TensorOptions().device(at::kCUDA);
  for (bool on_gpu : {true, false}) {  // CUDA tensors in place; CPU tensors staged
    const auto opts = on_gpu ? cuda : at::TensorOptions();
    auto t = at::arange(10, opts.dtype(at::kFloat));
    const auto want = t.cpu().clone();
    b->allreduce(t, ReduceOp::Sum, context(OpKind::Allreduce, 10));
    EXPECT_TRUE(at::equal(t.cpu(), want));
    b->broadcast(t, 0, context(OpKind::Broadcast, 10));
    EXPECT_TRUE(at::equal(t.cpu(), want));
    auto out = at::zeros({10}, opts);
    b->allgather(out, t, context(OpKind::Allgather, 10));
    EXPECT_TRUE(at::equal(out.cpu(), want));
    out.zero_();
    b->reduce_scatter(out, t, ReduceOp::Max, context(OpKind::ReduceScatter, 10));
    EXPECT_TRUE(at::equal(out.cpu(), want));
    out.zero_();
    b->alltoall(out, t, context(OpKind::Alltoall, 10));
    EXPECT_TRUE(at::equal(out.cpu(), want));
    b->barrier(context(OpKind::Barrier, 0));
  }
}

TEST(CudaNccl, WaitOrdersTheCallersStreamWithoutHostSync) {
  NEED_GPU();
  auto b = one_rank();
  auto ops = lockstep::comm::cuda::cuda_stream_ops();
  auto caller = c10::cuda::getStreamFromPool();
  auto comm = c10::cuda::getStreamFromPool(true);
  c10::cuda::CUDAStreamGuard guard(caller);
  auto t = at::ones({1 << 20}, at::TensorOptions().device(at::kCUDA));
  t.mul_(3);  // queued on `caller`: the op must see it
  lockstep::comm::cuda::StreamWork w(ops, caller.stream(), comm.stream(), {t});
  w.enqueue([&] {
    c10::cuda::CUDAStreamGuard g(comm);
    t.add_(1);  // stands for the collective on the comm stream
  });
  w.wait();                  // the caller's stream waits; the host does not
  const auto sum = t.sum();  // queued on `caller` after wait(): sees 4 everywhere
  EXPECT_EQ(sum.item<float>(), 4.0f * (1 << 20));
  w.synchronize();
  EXPECT_EQ(w.tensors_held(), 0u);
}

TEST(CudaNccl, SelectableByName) {
  // In a CUDA build "nccl" is a known backend: without a GPU it fails naming the GPU.
  if (torch::cuda::is_available()) GTEST_SKIP() << "checks the no-GPU error";
  try {
    one_rank();
    ADD_FAILURE() << "nccl without a GPU must fail";
  } catch (const lockstep::ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("needs a CUDA GPU"), std::string::npos) << e.what();
  }
}

}  // namespace
