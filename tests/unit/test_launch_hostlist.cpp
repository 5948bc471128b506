// Slurm's host lists (lockstep/hostlist.h) against the examples of Slurm's own manuals
// (slurm.conf(5) "NodeName", srun(1) "--nodelist", scontrol(1) "show hostnames") and the
// task counts of SLURM_STEP_TASKS_PER_NODE (srun(1), "OUTPUT ENVIRONMENT VARIABLES").
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lockstep/hostlist.h"

using lockstep::ConfigError;
using lockstep::hostlist::expand;
using lockstep::hostlist::first;
using lockstep::hostlist::tasks_on_node;
using Names = std::vector<std::string>;

namespace {

std::string error_of(const std::string& list) {
  try {
    expand(list);
  } catch (const ConfigError& e) {
    return e.what();
  }
  return "";
}

TEST(Hostlist, PlainNames) {
  EXPECT_EQ(expand("tux"), Names({"tux"}));
  EXPECT_EQ(expand("host1,host2"), Names({"host1", "host2"}));
  EXPECT_EQ(expand("node-a.cluster,node-b"), Names({"node-a.cluster", "node-b"}));
}

// slurm.conf(5): "lx[10-20]", "linux[0-64,128]", "lx[15,18,32-33]".
TEST(Hostlist, SlurmConfExamples) {
  const Names lx = expand("lx[10-20]");
  ASSERT_EQ(lx.size(), 11u);
  EXPECT_EQ(lx.front(), "lx10");
  EXPECT_EQ(lx.back(), "lx20");
  const Names linux_ = expand("linux[0-64,128]");
  ASSERT_EQ(linux_.size(), 66u);
  EXPECT_EQ(linux_[0], "linux0");
  EXPECT_EQ(linux_[64], "linux64");
  EXPECT_EQ(linux_[65], "linux128");
  EXPECT_EQ(expand("lx[15,18,32-33]"), Names({"lx15", "lx18", "lx32", "lx33"}));
}

// slurm.conf(5): leading zeros fix the width ("linux[0000-1023]"); without them the
// numbers keep their own width.
TEST(Hostlist, ZeroPadding) {
  const Names l = expand("linux[0000-1023]");
  ASSERT_EQ(l.size(), 1024u);
  EXPECT_EQ(l[0], "linux0000");
  EXPECT_EQ(l[7], "linux0007");
  EXPECT_EQ(l[1023], "linux1023");
  EXPECT_EQ(expand("node[01-04,07]"), Names({"node01", "node02", "node03", "node04", "node07"}));
  EXPECT_EQ(expand("n[8-10]"), Names({"n8", "n9", "n10"}));
  EXPECT_EQ(expand("n[098-101]"), Names({"n098", "n099", "n100", "n101"}));
}

// slurm.conf(5): several numeric ranges in one name ("rack[0-63]_blade[0-41]") expand as
// their product, leftmost slowest, as scontrol show hostnames prints them.
TEST(Hostlist, SeveralBracketGroups) {
  const Names r = expand("rack[0-63]_blade[0-41]");
  ASSERT_EQ(r.size(), 64u * 42u);
  EXPECT_EQ(r[0], "rack0_blade0");
  EXPECT_EQ(r[1], "rack0_blade1");
  EXPECT_EQ(r[42], "rack1_blade0");
  EXPECT_EQ(r.back(), "rack63_blade41");
  EXPECT_EQ(expand("a[1-2]b,c"), Names({"a1b", "a2b", "c"}));
  EXPECT_EQ(expand("a[1-2]b[3-4]"), Names({"a1b3", "a1b4", "a2b3", "a2b4"}));
}

TEST(Hostlist, MixedListsKeepOrderAndDuplicates) {
  EXPECT_EQ(expand("gpu[2-3],cpu1,gpu[1]"), Names({"gpu2", "gpu3", "cpu1", "gpu1"}));
  EXPECT_EQ(expand("localhost,localhost"), Names({"localhost", "localhost"}));
}

TEST(Hostlist, FirstIsTheFirstNameOnly) {
  EXPECT_EQ(first("node[07-08]"), "node07");
  EXPECT_EQ(first("rack[2-3]_blade[5,1]"), "rack2_blade5");
  EXPECT_EQ(first("head,node[1-4]"), "head");
  EXPECT_EQ(first("tux"), "tux");
}

TEST(Hostlist, BadListsNameTheFault) {
  EXPECT_NE(error_of("").find("empty"), std::string::npos);
  EXPECT_NE(error_of("node[1-").find("'[' without ']'"), std::string::npos);
  EXPECT_NE(error_of("node1]").find("']' without '['"), std::string::npos);
  EXPECT_NE(error_of("node[4-2]").find("goes down"), std::string::npos);
  EXPECT_NE(error_of("node[a-b]").find("not a number"), std::string::npos);
  EXPECT_NE(error_of("node[1,,2]").find("not a number"), std::string::npos);
  EXPECT_NE(error_of("a,,b").find("empty name"), std::string::npos);
  EXPECT_NE(error_of("n[[1]]").find("nested"), std::string::npos);
  EXPECT_NE(error_of("n[0-2000000]").find("too long"), std::string::npos);
  EXPECT_NE(error_of("a[0-2000]b[0-2000]").find("2^20"), std::string::npos);
  EXPECT_EQ(error_of("node[1-2]"), "");
  // The message names the list and shows the syntax.
  EXPECT_NE(error_of("x[2-1]").find("host list 'x[2-1]'"), std::string::npos);
  EXPECT_NE(error_of("x[2-1]").find("node[01-04,07]"), std::string::npos);
  EXPECT_THROW(first("ok,bad[1-"), ConfigError);  // a typo further on is still a typo
}

// srun(1): SLURM_STEP_TASKS_PER_NODE "2(x3),1" = nodes 0-2 run 2 tasks, node 3 runs 1.
TEST(Hostlist, TasksPerNode) {
  EXPECT_EQ(tasks_on_node("2(x3),1", 0), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 2), 2);
  EXPECT_EQ(tasks_on_node("2(x3),1", 3), 1);
  EXPECT_EQ(tasks_on_node("4", 0), 4);
  EXPECT_EQ(tasks_on_node("1,3,2", 1), 3);
  EXPECT_THROW(tasks_on_node("2(x3),1", 4), ConfigError);
  EXPECT_THROW(tasks_on_node("2(x3", 0), ConfigError);
  EXPECT_THROW(tasks_on_node("two", 0), ConfigError);
}

}  // namespace
