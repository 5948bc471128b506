// LOCKSTEP_BACKEND=nccl through init(), in every build: without CUDA a ConfigError that
// names the fix, in a CUDA build without a GPU one that names the missing GPU, and on a
// GPU a working group (world size 1; CPU tensors staged through the GPU).
#include <lockstep/comm/init.h>
#include <lockstep/comm/process_group.h>
#include <lockstep/error.h>
#include <lockstep/launch/launcher.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>

#include <chrono>
#include <cstdio>
#include <string>

TEST(CudaBackendChoice, NcclIsAKnownBackend) {
  lockstep::comm::LaunchEnv e;  // rank 0 of 1
  e.master_port = lockstep::launch::pick_free_port();
  lockstep::comm::InitOptions o;
  o.env = e;
  o.backend = "nccl";
  o.timeout = std::chrono::milliseconds(20000);
  try {
    auto pg = lockstep::comm::init(o);
    auto t = at::arange(8, at::kFloat);
    pg->allreduce(t)->wait();
    EXPECT_TRUE(at::equal(t, at::arange(8, at::kFloat)));
    std::printf("nccl: a GPU is visible; allreduce at world size 1 ran\n");
  } catch (const lockstep::ConfigError& err) {
    const std::string m = err.what();
    std::printf("nccl: %s\n", m.c_str());
    EXPECT_EQ(m.find("unknown backend"), std::string::npos) << m;
    EXPECT_TRUE(m.find("built without CUDA") != std::string::npos ||
                m.find("needs a CUDA GPU") != std::string::npos)
        << m;
  }
}
