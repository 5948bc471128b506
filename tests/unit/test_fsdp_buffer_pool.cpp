// FSDP's BufferPool (src/parallel/fsdp/buffer_pool.h): a block comes back for the next
// buffer of its size, two in flight are two blocks, a storage can be pointed at a block
// and emptied again with its views keeping their shapes, and blocks outlive the pool.
#include "parallel/fsdp/buffer_pool.h"

#include <ATen/ATen.h>
#include <gtest/gtest.h>

using lockstep::fsdp::BufferPool;

namespace {

TEST(FsdpBufferPool, ABlockComesBackForTheNextBufferOfItsSize) {
  BufferPool pool;
  const void* first = nullptr;
  {
    at::Tensor t = pool.empty(1000, at::kFloat);
    EXPECT_EQ(t.numel(), 1000);
    EXPECT_EQ(t.dim(), 1);
    t.fill_(2);
    EXPECT_EQ(t.sum().item<float>(), 2000);
    first = t.data_ptr();
  }
  EXPECT_EQ(pool.held_bytes(), 4032);  // 4000 bytes, rounded up to 64
  for (int step = 0; step < 5; ++step) {
    at::Tensor t = pool.empty(1000, at::kFloat);
    EXPECT_EQ(t.data_ptr(), first);
  }
  EXPECT_EQ(pool.held_bytes(), 4032);
  at::Tensor other = pool.empty(10, at::kDouble);  // another size: a block of its own
  EXPECT_EQ(pool.held_bytes(), 4032 + 128);
}

TEST(FsdpBufferPool, BuffersInFlightTogetherAreDistinctBlocks) {
  BufferPool pool;
  for (int step = 0; step < 3; ++step) {
    at::Tensor a = pool.empty(256, at::kFloat);
    at::Tensor b = pool.empty(256, at::kFloat);
    EXPECT_NE(a.data_ptr(), b.data_ptr());
    a.fill_(1);
    b.fill_(2);
    EXPECT_EQ(a.sum().item<float>(), 256);
  }
  EXPECT_EQ(pool.held_bytes(), 2 * 1024);  // the two made in step 0, nothing since
}

TEST(FsdpBufferPool, AStorageTakesABlockAndGivesItBack) {
  BufferPool pool;
  at::Tensor full = at::zeros({100}, at::kFloat);
  at::Tensor view = full.narrow(0, 10, 5).view({5});
  pool.set_storage(full, 0);  // as FSDP frees a gathered unit: the views keep their shapes
  EXPECT_EQ(full.storage().nbytes(), 0u);
  EXPECT_EQ(full.storage().data(), nullptr);
  EXPECT_EQ(view.sizes(), at::IntArrayRef({5}));
  pool.set_storage(full, 400);
  full.fill_(3);
  EXPECT_EQ(view.sum().item<float>(), 15);
  const void* block = full.data_ptr();
  pool.set_storage(full, 0);
  pool.set_storage(full, 400);  // the next gather: the same block
  EXPECT_EQ(full.data_ptr(), block);
  EXPECT_EQ(pool.held_bytes(), 448);
}

TEST(FsdpBufferPool, ABlockOutlivesThePool) {
  at::Tensor t;
  {
    BufferPool pool;
    t = pool.empty(64, at::kDouble);
  }
  t.fill_(1.5);  // still its memory; given back to no one when t goes (ASan checks)
  EXPECT_EQ(t.sum().item<double>(), 96);
}

}  // namespace
