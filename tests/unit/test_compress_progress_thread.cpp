// Unit tests of the compressed allreduce's helper thread: one persistent thread runs every
// job (no thread per call), failures come back through wait(), and it stops cleanly.
#include "compress/progress_thread.h"

#include <lockstep/error.h>

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <stdexcept>
#include <thread>

using lockstep::compress::ProgressThread;

TEST(CompressProgressThread, OneThreadRunsEveryJob) {
  ProgressThread helper;
  std::thread::id first;
  int sum = 0;
  for (int i = 1; i <= 100; ++i) {
    std::thread::id ran_on;
    helper.post([&, i] {
      ran_on = std::this_thread::get_id();
      sum += i;
    });
    helper.wait();
    EXPECT_NE(ran_on, std::this_thread::get_id());
    if (i == 1) first = ran_on;
    EXPECT_EQ(ran_on, first) << "job " << i << " ran on another thread";
  }
  EXPECT_EQ(sum, 5050);
}

TEST(CompressProgressThread, PostReturnsAtOnceAndWaitBlocks) {
  ProgressThread helper;
  std::atomic<bool> release{false}, done{false};
  helper.post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
    done = true;
  });
  EXPECT_FALSE(done);  // post() did not wait for the job
  release = true;
  helper.wait();
  EXPECT_TRUE(done);
  helper.wait();  // nothing pending: returns at once
}

TEST(CompressProgressThread, WaitRethrowsAndTheThreadStaysUsable) {
  ProgressThread helper;
  helper.post([] { throw std::runtime_error("codec failed"); });
  EXPECT_THROW(
      {
        try {
          helper.wait();
        } catch (const std::runtime_error& e) {
          EXPECT_STREQ(e.what(), "codec failed");
          throw;
        }
      },
      std::runtime_error);
  helper.wait();  // the failure is reported once
  bool ran = false;
  helper.post([&] { ran = true; });
  helper.wait();
  EXPECT_TRUE(ran);
}

TEST(CompressProgressThread, SecondPostBeforeWaitIsRefused) {
  ProgressThread helper;
  std::atomic<bool> release{false};
  helper.post([&] {
    while (!release) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  });
  EXPECT_THROW(helper.post([] {}), lockstep::InvalidArgument);
  release = true;
  helper.wait();
}

TEST(CompressProgressThread, DestructorFinishesAPostedJob) {
  std::atomic<bool> done{false};
  {
    ProgressThread helper;
    helper.post([&] {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
      done = true;
    });
  }
  EXPECT_TRUE(done);
  ProgressThread idle;  // never used: starts and stops
}
