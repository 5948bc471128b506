// The host memory cache (include/lockstep/comm/host_cache.h): large blocks mapped, kept
// when freed and handed to the next request of about their size; kept bytes bounded by
// kHostCacheKeepFactor x the live peak; emptied and retried when a mapping fails under a
// memory limit.
#include <lockstep/comm/host_cache.h>

#include <c10/core/CPUAllocator.h>
#include <gtest/gtest.h>
#include <torch/torch.h>

#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <string>
#include <thread>
#include <vector>

namespace lockstep::comm {
namespace {

constexpr int64_t kMiB = 1 << 20;

at::Tensor floats_of(int64_t bytes) { return torch::empty({bytes / 4}, torch::kFloat32); }

class HostCacheTest : public ::testing::Test {
 protected:
  void SetUp() override {
    ASSERT_TRUE(install_host_cache()) << "another CPU allocator was installed first";
    empty_host_cache();
  }
};

TEST_F(HostCacheTest, IsLibtorchsCpuAllocator) {
  EXPECT_TRUE(host_cache_installed());
  EXPECT_TRUE(install_host_cache());  // a second call keeps it
  EXPECT_EQ(c10::GetCPUAllocator()->raw_deleter() != nullptr, true);
}

TEST_F(HostCacheTest, AFreedBlockServesTheNextOfItsSize) {
  const auto before = host_cache_stats();
  void* first = nullptr;
  {
    auto t = floats_of(4 * kMiB);
    first = t.data_ptr();
    EXPECT_EQ(host_cache_stats().live_bytes - before.live_bytes, 4 * kMiB);
    EXPECT_EQ(host_cache_stats().maps, before.maps + 1);
  }
  EXPECT_EQ(host_cache_stats().cached_bytes, 4 * kMiB);
  auto again = floats_of(4 * kMiB - 4096);  // within 1/16 smaller: the same block
  EXPECT_EQ(again.data_ptr(), first);
  EXPECT_EQ(host_cache_stats().hits, before.hits + 1);
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
  auto half = floats_of(2 * kMiB);  // nothing kept fits: a new mapping
  EXPECT_EQ(host_cache_stats().maps, before.maps + 2);
  // Values survive the round trip through the cache like any tensor's.
  again.fill_(3.0f);
  EXPECT_EQ(again.sum().item<double>(), 3.0 * double(again.numel()));
}

TEST_F(HostCacheTest, SmallBlocksGoToMalloc) {
  const auto before = host_cache_stats();
  auto t = floats_of(64 * int64_t{1024});
  EXPECT_EQ(host_cache_stats().live_bytes, before.live_bytes);
  EXPECT_EQ(host_cache_stats().maps, before.maps);
  // raw_allocate/raw_deallocate of both kinds go through the one deleter.
  auto* alloc = c10::GetCPUAllocator();
  void* small = alloc->raw_allocate(1000);
  void* large = alloc->raw_allocate(size_t(3 * kMiB));
  EXPECT_EQ(host_cache_stats().live_bytes, before.live_bytes + 3 * kMiB);
  alloc->raw_deallocate(small);
  alloc->raw_deallocate(large);
  EXPECT_EQ(host_cache_stats().live_bytes, before.live_bytes);
}

TEST_F(HostCacheTest, KeepsNoMoreThanTheBound) {
  std::vector<at::Tensor> held;
  held.reserve(4);
  for (int i = 0; i < 4; ++i) held.push_back(floats_of(8 * kMiB));
  held.clear();
  EXPECT_EQ(host_cache_stats().cached_bytes, 32 * kMiB);
  // Blocks of other sizes, one at a time: kept bytes stay within the bound throughout.
  for (int64_t mb = 9; mb < 40; mb += 3) {
    floats_of(mb * kMiB);
    const auto s = host_cache_stats();
    EXPECT_LE(s.cached_bytes, kHostCacheKeepFactor * s.peak_live_bytes) << mb << " MiB";
  }
  empty_host_cache();
  EXPECT_EQ(host_cache_stats().cached_bytes, 0);
}

// Over the bound, the blocks freed longest ago go, not the one a loop asks for again: a
// block of a new size used over and over is mapped once, while the stale ones make room.
TEST_F(HostCacheTest, TheStaleBlocksMakeRoomNotTheBusyOne) {
  std::vector<at::Tensor> held;
  held.reserve(4);
  for (int i = 0; i < 4; ++i) held.push_back(floats_of(8 * kMiB));
  held.clear();
  empty_host_cache();
  // Sizes up to the peak P, one at a time, none serving the next: ~1.9 P kept at the end.
  const int64_t p = host_cache_stats().peak_live_bytes / kMiB;  // >= 32
  for (int64_t eighths = 4; eighths <= 8; ++eighths) floats_of(eighths * p / 8 * kMiB);
  const int64_t maps = host_cache_stats().maps;
  for (int i = 0; i < 10; ++i) floats_of(p / 4 * kMiB).fill_(1.0f);
  EXPECT_EQ(host_cache_stats().maps, maps + 1);
  const auto s = host_cache_stats();
  EXPECT_LE(s.cached_bytes, kHostCacheKeepFactor * s.peak_live_bytes);
}

// A step whose blocks add up to more than its peak in use (as a training step's: backward
// asks for sizes forward did not) is served from the cache from its second run on.
TEST_F(HostCacheTest, AStepLargerThanItsPeakIsMappedOnce) {
  const int64_t p = std::max<int64_t>(host_cache_stats().peak_live_bytes / kMiB, 32);
  auto step = [p] {
    std::vector<at::Tensor> fwd, bwd;
    for (int i = 0; i < 4; ++i) fwd.push_back(floats_of(p / 4 * kMiB));  // "activations"
    for (int i = 0; i < 4; ++i) {  // "gradients", 1/8 larger: no forward block serves them
      bwd.push_back(floats_of(p * 9 / 32 * kMiB));
      fwd[size_t(i)] = at::Tensor();
    }
  };
  step();
  const int64_t maps = host_cache_stats().maps;
  for (int i = 0; i < 3; ++i) step();
  EXPECT_EQ(host_cache_stats().maps, maps);
}

TEST_F(HostCacheTest, ThreadsAllocatingAndFreeingAtOnce) {
  const int64_t live = host_cache_stats().live_bytes;
  std::vector<std::thread> threads;
  threads.reserve(4);
  for (int t = 0; t < 4; ++t)
    threads.emplace_back([t] {
      for (int i = 0; i < 200; ++i) {
        auto a = floats_of((1 + (i + t) % 5) * kMiB);
        a.fill_(float(t));
      }
    });
  for (auto& th : threads) th.join();
  EXPECT_EQ(host_cache_stats().live_bytes, live);
}

int64_t vm_data_bytes() {
  std::ifstream f("/proc/self/status");
  std::string key;
  while (f >> key)
    if (key == "VmData:") {
      int64_t kb = 0;
      f >> kb;
      return kb * 1024;
    }
  return 0;
}

// Under RLIMIT_DATA the kept blocks are what stands between a request and the limit: a
// failed mapping empties the cache and succeeds; one beyond the limit throws, naming it.
// Run in a child process, so the limit does not outlive the test.
TEST_F(HostCacheTest, EmptiesItselfWhenAMappingFails) {
  { auto warm = floats_of(48 * kMiB); }  // kept: 48 MiB
  ASSERT_EQ(host_cache_stats().cached_bytes, 48 * kMiB);
  const pid_t pid = ::fork();
  ASSERT_GE(pid, 0);
  if (pid == 0) {
    const rlim_t cap = rlim_t(vm_data_bytes() + 40 * kMiB);  // the 48 kept are counted
    rlimit r{cap, cap};
    if (::setrlimit(RLIMIT_DATA, &r) != 0) ::_exit(10);
    const int64_t emptied = host_cache_stats().emptied;
    try {
      auto t = floats_of(80 * kMiB);  // fits only once the 48 are unmapped
      if (host_cache_stats().emptied != emptied + 1 || host_cache_stats().cached_bytes != 0)
        ::_exit(11);
    } catch (const std::exception&) {
      ::_exit(12);
    }
    try {
      auto t = floats_of(512 * kMiB);
      ::_exit(13);
    } catch (const c10::Error& e) {
      const std::string what = e.what();
      ::_exit(what.find("lockstep host cache: out of memory") != std::string::npos &&
                      what.find("536870912 bytes") != std::string::npos
                  ? 0
                  : 14);
    }
  }
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "10 setrlimit, 11 not emptied, 12 the retry failed, "
                                       "13 no error past the limit, 14 the error's text";
}

TEST(HostCacheEnv, WantedUnlessTurnedOff) {
  ::setenv("LOCKSTEP_HOST_CACHE", "0", 1);
  EXPECT_FALSE(host_cache_wanted());
  ::setenv("LOCKSTEP_HOST_CACHE", "1", 1);
  EXPECT_TRUE(host_cache_wanted());
  ::unsetenv("LOCKSTEP_HOST_CACHE");
}

}  // namespace
}  // namespace lockstep::comm
