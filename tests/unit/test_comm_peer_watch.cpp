// comm's peer watch (src/comm/peer_watch.h), the one "has this process exited" check of
// shm, gloo and mpi: exits, zombies and long stops of same-machine peers, by pid.
#include "comm/peer_watch.h"

#include <gtest/gtest.h>

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

namespace {

using lockstep::comm::machine_id;
using lockstep::comm::PeerWatch;
using lockstep::comm::process_exited;
using lockstep::comm::process_state;

// A child that waits for a signal; the caller kills and reaps it.
pid_t sleeping_child() {
  const pid_t pid = fork();
  if (pid == 0) {
    for (;;) pause();
  }
  return pid;
}

TEST(PeerWatch, ProcessExitedSeesZombiesAndReapedChildren) {
  EXPECT_FALSE(process_exited(getpid()));
  EXPECT_FALSE(process_exited(0));  // not "every process of my group"
  EXPECT_EQ(process_state(-1), '?');
  const pid_t pid = fork();
  if (pid == 0) _exit(0);
  ASSERT_GT(pid, 0);
  // Not reaped yet: a zombie, which kill(pid, 0) alone reports as alive.
  for (int i = 0; i < 200 && process_state(pid) != 'Z'; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  EXPECT_EQ(process_state(pid), 'Z');
  EXPECT_TRUE(process_exited(pid));
  int status = 0;
  ASSERT_EQ(waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(process_exited(pid));  // reaped: gone
}

TEST(PeerWatch, NamesTheRankThatExited) {
  const pid_t child = sleeping_child();
  ASSERT_GT(child, 0);
  const std::string here = machine_id();
  ASSERT_FALSE(here.empty()) << "this machine's boot id or pid namespace cannot be read";
  PeerWatch watch(0, {here, here}, {getpid(), child}, std::chrono::seconds(60));
  ASSERT_FALSE(watch.empty());
  std::string what;
  EXPECT_EQ(watch.check(&what), -1) << what;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
  EXPECT_EQ(watch.check(&what), 1);
  EXPECT_EQ(what, "rank 1 (pid " + std::to_string(child) + ", this host) exited");
}

TEST(PeerWatch, AStopPastTheLimitIsAFailure) {
  const pid_t child = sleeping_child();
  ASSERT_GT(child, 0);
  const std::string here = machine_id();
  PeerWatch watch(1, {here, here}, {child, getpid()}, std::chrono::milliseconds(0));
  kill(child, SIGSTOP);
  for (int i = 0; i < 200 && process_state(child) != 'T'; ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  std::string what;
  EXPECT_EQ(watch.check(&what), 0);
  EXPECT_NE(what.find("rank 0 (pid " + std::to_string(child) + ", this host) is stopped"),
            std::string::npos)
      << what;
  kill(child, SIGKILL);
  waitpid(child, nullptr, 0);
}

// Peers on another machine (another boot id or pid namespace) are not watched: their pids
// mean other processes here.
TEST(PeerWatch, WatchesOnlyThisMachine) {
  PeerWatch watch(0, {machine_id(), "another-boot/pid:[1]"}, {getpid(), 1},
                  std::chrono::seconds(1));
  EXPECT_TRUE(watch.empty());
  std::string what;
  EXPECT_EQ(watch.check(&what), -1);
}

}  // namespace
