// Unit tests for lockstep-run's pure parts: argument parsing, the rank environment,
// exit-status wording and line splitting. No process is spawned here.
#include <sys/wait.h>

#include <csignal>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "launch/exit_status.h"
#include "launch/line_buffer.h"
#include "lockstep/launch/launcher.h"
#include "lockstep/launch/options.h"
#include "lockstep/launch/rank_env.h"

using namespace lockstep::launch;
using Args = std::vector<std::string>;

namespace {

GroupContext context(const std::string& job, int port, int restarts) {
  GroupContext g;
  g.job_id = job;
  g.master_port = port;
  g.restart_count = restarts;
  return g;
}

// The UsageError message for args, or "" when they parse.
std::string usage_error(const Args& args) {
  try {
    parse_args(args);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

TEST(LaunchArgs, Defaults) {
  LaunchOptions o = parse_args({"./train"});
  EXPECT_EQ(o.nproc_per_node, 1);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.max_restarts, 0);
  EXPECT_DOUBLE_EQ(o.grace_seconds, 5.0);
  EXPECT_TRUE(o.log_dir.empty());
  EXPECT_FALSE(o.help);
  EXPECT_EQ(o.program, Args{"./train"});
}

TEST(LaunchArgs, BothSpellingsOfValues) {
  LaunchOptions o = parse_args({"--nproc-per-node", "4", "--nnodes=2", "--node-rank", "1",
                                "--master-addr=10.0.0.1", "--master-port", "1234", "--log-dir=logs",
                                "--max-restarts", "3", "--grace-seconds=0.5", "prog"});
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.master_addr, "10.0.0.1");
  EXPECT_EQ(o.master_port, 1234);
  EXPECT_EQ(o.log_dir, "logs");
  EXPECT_EQ(o.max_restarts, 3);
  EXPECT_DOUBLE_EQ(o.grace_seconds, 0.5);
  EXPECT_EQ(o.world_size(), 8);
  EXPECT_EQ(o.global_rank(3), 7);
}

TEST(LaunchArgs, TorchrunUnderscoreAliases) {
  LaunchOptions o = parse_args({"--nproc_per_node=2", "--master_port", "0", "prog"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.master_port, 0);
}

TEST(LaunchArgs, OptionsEndAtProgramOrDoubleDash) {
  LaunchOptions o =
      parse_args({"--nproc-per-node", "2", "./train", "--nproc-per-node", "9", "--lr=3"});
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.program, (Args{"./train", "--nproc-per-node", "9", "--lr=3"}));
  o = parse_args({"--", "--weird-program-name", "x"});
  EXPECT_EQ(o.program, (Args{"--weird-program-name", "x"}));
}

TEST(LaunchArgs, Help) {
  EXPECT_TRUE(parse_args({"--help"}).help);
  EXPECT_TRUE(parse_args({"-h"}).help);
  EXPECT_NE(usage_text().find("--nproc-per-node"), std::string::npos);
}

TEST(LaunchArgs, ErrorsNameTheFlag) {
  EXPECT_NE(usage_error({"--bogus", "prog"}).find("'--bogus'"), std::string::npos);
  EXPECT_NE(usage_error({"--bogus=1", "prog"}).find("'--bogus'"), std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node", "0", "p"})
                .find("--nproc-per-node expects a positive integer"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node", "2x", "p"}).find("got '2x'"), std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node", "", "p"}).find("--nproc-per-node"), std::string::npos);
  EXPECT_NE(usage_error({"--master-port", "70000", "p"}).find("--master-port"), std::string::npos);
  EXPECT_NE(usage_error({"--master-port", "-1", "p"}).find("--master-port"), std::string::npos);
  EXPECT_NE(usage_error({"--grace-seconds", "-1", "p"}).find("--grace-seconds"), std::string::npos);
  EXPECT_NE(usage_error({"--grace-seconds", "nan", "p"}).find("--grace-seconds"),
            std::string::npos);
  EXPECT_NE(usage_error({"--max-restarts", "-2", "p"}).find("--max-restarts"), std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node"}).find("--nproc-per-node requires a value"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nnodes", "2", "--node-rank", "2", "p"}).find("--node-rank"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node", "2"}).find("missing PROGRAM"), std::string::npos);
}

TEST(LaunchArgs, RepeatedFlagsAreEachCheckedAndTheLastWins) {
  EXPECT_EQ(parse_args({"--nproc-per-node", "2", "--nproc_per_node=3", "p"}).nproc_per_node, 3);
  EXPECT_NE(usage_error({"--nproc-per-node", "0", "--nproc-per-node", "1", "p"}).find("got '0'"),
            std::string::npos);
}

TEST(LaunchArgs, EmptyValueAfterEqualsIsAnEmptyValue) {
  // Not the next argument: "--log-dir= prog" must not run nothing with logs in ./prog.
  EXPECT_NE(usage_error({"--log-dir=", "prog"}).find("--log-dir expects a directory"),
            std::string::npos);
  EXPECT_NE(usage_error({"--nproc-per-node=", "2", "p"}).find("--nproc-per-node expects"),
            std::string::npos);
  EXPECT_NE(usage_error({"--master-addr="}).find("--master-addr"), std::string::npos);
}

TEST(LaunchArgs, UnknownOptionAnywhereAmongTheOptions) {
  EXPECT_NE(usage_error({"--nproc-per-node", "2", "--bogus", "p"}).find("'--bogus'"),
            std::string::npos);
  EXPECT_NE(usage_error({"--bogus", "--nproc-per-node", "2", "p"}).find("'--bogus'"),
            std::string::npos);
  EXPECT_NE(usage_error({"-x", "p"}).find("'-x'"), std::string::npos);
  // "-" alone is no option: it is the program.
  EXPECT_EQ(parse_args({"-", "a"}).program, (Args{"-", "a"}));
  // A value may look like an option: it is the flag's value all the same.
  EXPECT_EQ(parse_args({"--log-dir", "--", "p"}).log_dir, "--");
}

TEST(LaunchArgs, FreePortOnlyOnOneNode) {
  EXPECT_EQ(usage_error({"--master-port", "0", "p"}), "");
  std::string err = usage_error({"--nnodes", "2", "--master-port", "0", "p"});
  EXPECT_NE(err.find("--master-port 0"), std::string::npos) << err;
  EXPECT_NE(err.find("--nnodes"), std::string::npos) << err;
}

TEST(LaunchArgs, RdzvIdAndWhetherThePortWasGiven) {
  EXPECT_FALSE(parse_args({"p"}).master_port_given);  // the default may fall back to a free one
  EXPECT_TRUE(parse_args({"--master-port", "29500", "p"}).master_port_given);
  EXPECT_TRUE(parse_args({"p"}).rdzv_id.empty());
  EXPECT_EQ(parse_args({"--rdzv-id", "exp_1.run-2", "p"}).rdzv_id, "exp_1.run-2");
  EXPECT_EQ(parse_args({"--rdzv_id=abc", "p"}).rdzv_id, "abc");
  // It names shm segments and files: no '/', spaces or empty ids.
  for (const char* bad : {"a/b", "a b", ""}) {
    std::string err = usage_error({std::string("--rdzv-id=") + bad, "p"});
    EXPECT_NE(err.find("--rdzv-id"), std::string::npos) << bad << ": " << err;
  }
  EXPECT_NE(usage_error({"--rdzv-id", std::string(65, 'a'), "p"}), "");
}

TEST(LaunchEnv, TorchrunContract) {
  LaunchOptions o = parse_args({"--nproc-per-node", "4", "--nnodes", "3", "--node-rank", "2",
                                "--master-addr", "host0", "--max-restarts", "2", "p"});
  GroupContext g = context("job-1", 4242, 1);
  EnvMap env = rank_env(o, 3, g, {{"PATH", "/bin"}, {"RANK", "stale"}});
  EXPECT_EQ(env["RANK"], "11");
  EXPECT_EQ(env["LOCAL_RANK"], "3");
  EXPECT_EQ(env["WORLD_SIZE"], "12");
  EXPECT_EQ(env["LOCAL_WORLD_SIZE"], "4");
  EXPECT_EQ(env["GROUP_RANK"], "2");
  EXPECT_EQ(env["GROUP_WORLD_SIZE"], "3");
  EXPECT_EQ(env["MASTER_ADDR"], "host0");
  EXPECT_EQ(env["MASTER_PORT"], "4242");
  EXPECT_EQ(env["LOCKSTEP_LAUNCHER"], "lockstep-run");
  EXPECT_EQ(env["LOCKSTEP_JOB_ID"], "job-1");
  EXPECT_EQ(env["LOCKSTEP_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_RESTART_COUNT"], "1");
  EXPECT_EQ(env["TORCHELASTIC_MAX_RESTARTS"], "2");
  EXPECT_EQ(env["OMP_NUM_THREADS"], "1");
  EXPECT_EQ(env["PATH"], "/bin");  // the rest of the environment passes through
}

TEST(LaunchEnv, UserOmpSettingWins) {
  LaunchOptions o = parse_args({"--nproc-per-node", "2", "p"});
  EnvMap base{{"OMP_NUM_THREADS", "4"}};
  EXPECT_EQ(rank_env(o, 0, context("j", 1, 0), base)["OMP_NUM_THREADS"], "4");
  EXPECT_FALSE(should_note_omp(o, base));
  EXPECT_TRUE(should_note_omp(o, {}));
  EXPECT_FALSE(should_note_omp(parse_args({"p"}), {}));  // one rank: no note, as torchrun
}

TEST(LaunchEnv, MallocKeepsLargeTensorsInTheHeapUnlessTheUserTunesIt) {
  LaunchOptions o = parse_args({"--nproc-per-node", "2", "p"});
  EnvMap env = rank_env(o, 0, context("j", 1, 0), {});
  EXPECT_EQ(env["MALLOC_MMAP_MAX_"], "0");
  EXPECT_EQ(env["MALLOC_TRIM_THRESHOLD_"], "17179869184");
  // A setting of the user's wins, variable by variable.
  env = rank_env(o, 0, context("j", 1, 0), {{"MALLOC_MMAP_MAX_", "65536"}});
  EXPECT_EQ(env["MALLOC_MMAP_MAX_"], "65536");
  EXPECT_EQ(env["MALLOC_TRIM_THRESHOLD_"], "17179869184");
  env = rank_env(o, 0, context("j", 1, 0), {{"MALLOC_MMAP_THRESHOLD_", "1073741824"}});
  EXPECT_EQ(env.count("MALLOC_MMAP_MAX_"), 0u);  // mmap stays on for the user's threshold
  // Malloc tunables in GLIBC_TUNABLES: leave malloc entirely to them.
  env = rank_env(o, 0, context("j", 1, 0), {{"GLIBC_TUNABLES", "glibc.malloc.arena_max=2"}});
  EXPECT_EQ(env.count("MALLOC_MMAP_MAX_"), 0u);
  EXPECT_EQ(env.count("MALLOC_TRIM_THRESHOLD_"), 0u);
  EXPECT_EQ(rank_env(o, 0, context("j", 1, 0), {{"GLIBC_TUNABLES", "glibc.cpu.x86_shstk=on"}})
                .count("MALLOC_MMAP_MAX_"),
            1u);
}

TEST(LaunchEnv, EnvpAndJobId) {
  EXPECT_EQ(to_envp({{"A", "1"}, {"B", "x=y"}}), (Args{"A=1", "B=x=y"}));
  std::string id = make_job_id();
  EXPECT_NE(id.find('-'), std::string::npos);
  EXPECT_EQ(id.find('/'), std::string::npos);  // usable inside a shm_open name
  EXPECT_NE(make_job_id(), id);                // random part: two launches never share one
  EXPECT_FALSE(current_environment().empty());
}

TEST(LaunchStatus, Wording) {
  EXPECT_EQ(describe_wait_status(3 << 8), "exited with code 3");  // W_EXITCODE(3, 0)
  EXPECT_EQ(describe_wait_status(SIGKILL), "killed by signal 9 (SIGKILL)");
  EXPECT_EQ(exit_code_of(3 << 8), 3);
  EXPECT_EQ(exit_code_of(SIGKILL), 137);
  EXPECT_TRUE(succeeded(0));
  EXPECT_FALSE(succeeded(SIGTERM));
  EXPECT_EQ(signal_name(SIGSEGV), "SIGSEGV");
  EXPECT_EQ(signal_name(63), "SIG63");
}

TEST(LaunchOutput, LineSplitting) {
  LineBuffer b;
  EXPECT_TRUE(b.feed("ab", 2).empty());
  EXPECT_EQ(b.feed("c\nd\n\ne", 6), (Args{"abc", "d", ""}));
  std::string rest;
  ASSERT_TRUE(b.flush(&rest));
  EXPECT_EQ(rest, "e");
  EXPECT_FALSE(b.flush(&rest));
  std::string huge(LineBuffer::kMaxLine + 10, 'x');
  EXPECT_EQ(b.feed(huge.data(), huge.size()).size(), 1u);  // bounded memory for endless lines
}

TEST(LaunchOutput, TailKeepsLastLines) {
  TailBuffer t(2);
  for (const char* s : {"1", "2", "3"}) t.push(s);
  EXPECT_EQ(std::vector<std::string>(t.lines().begin(), t.lines().end()), (Args{"2", "3"}));
}

TEST(LaunchPort, PicksANonZeroPort) {
  int p = pick_free_port();
  EXPECT_GT(p, 0);
  EXPECT_LT(p, 65536);
}

}  // namespace

namespace {

TEST(LaunchArgs, FaultTolerantFlags) {
  LaunchOptions o =
      parse_args({"--fault-tolerant", "--nproc-per-node", "3", "--min-replicas", "2",
                  "--heartbeat-timeout", "1.5", "--coordinator-port", "0", "./train"});
  EXPECT_TRUE(o.fault_tolerant);
  EXPECT_EQ(o.min_replicas, 2);
  EXPECT_DOUBLE_EQ(o.heartbeat_timeout, 1.5);
  EXPECT_EQ(o.coordinator_port, 0);
  EXPECT_EQ(usage_error({"--fault-tolerant", "--min-replicas", "3", "./train"}),
            "lockstep-run: --min-replicas 3 is more than the job's 1 replicas");
  EXPECT_NE(usage_error({"--heartbeat-timeout", "0.1", "./t"}).find("at least 0.5 s"),
            std::string::npos);
  EXPECT_NE(usage_error({"--coordinator", "./train"}).find("takes no PROGRAM"), std::string::npos);
  EXPECT_TRUE(parse_args({"--coordinator", "--min-replicas", "2", "--nnodes", "4"}).coordinator);
  EXPECT_NE(usage_error({"--fault-tolerent", "./t"}).find("did you mean '--fault-tolerant'"),
            std::string::npos);
}

TEST(LaunchArgs, FaultTolerantRanksLearnTheService) {
  LaunchOptions o = parse_args({"--nproc-per-node", "2", "./train"});
  GroupContext g;
  g.job_id = "j";
  g.master_port = 29500;
  EXPECT_EQ(rank_env(o, 1, g, {}).count("LOCKSTEP_COORDINATOR"), 0u);
  g.coordinator = "10.0.0.1:4000";
  EnvMap e = rank_env(o, 1, g, {});
  EXPECT_EQ(e["LOCKSTEP_COORDINATOR"], "10.0.0.1:4000");
  EXPECT_EQ(e["LOCKSTEP_REPLICA_ID"], "1");
}

TEST(LaunchArgs, ReplicaSizeGroupsRanksIntoReplicas) {
  LaunchOptions o = parse_args({"--fault-tolerant", "--nnodes", "2", "--node-rank", "1",
                                "--nproc-per-node", "4", "--replica-size", "2", "./train"});
  EXPECT_EQ(o.replica_size, 2);
  EXPECT_EQ(o.replicas(), 4);
  EXPECT_EQ(usage_error({"--replica-size", "2", "--nproc-per-node", "2", "./t"}),
            "lockstep-run: --replica-size groups ranks into replicas of a fault-tolerant job; "
            "add --fault-tolerant (a job without it has no replicas)");
  EXPECT_EQ(
      usage_error({"--fault-tolerant", "--replica-size", "2", "--nproc-per-node", "3", "./t"}),
      "lockstep-run: --replica-size 2 must divide --nproc-per-node 3: a replica's ranks run "
      "on one node");
  EXPECT_EQ(usage_error({"--fault-tolerant", "--replica-size", "2", "--nproc-per-node", "4",
                         "--min-replicas", "3", "./t"}),
            "lockstep-run: --min-replicas 3 is more than the job's 2 replicas");
  // Global rank 7 = node 1's local rank 3: rank 1 of replica 3's own job of 2.
  GroupContext g;
  g.job_id = "j";
  g.master_port = 29500;
  g.coordinator = "10.0.0.1:4000";
  EnvMap e = rank_env(o, 3, g, {});
  EXPECT_EQ(e["LOCKSTEP_REPLICA_ID"], "3");
  EXPECT_EQ(e["LOCKSTEP_REPLICAS"], "4");
  make_replica_env(o, 3, 41000, 2, e);
  EXPECT_EQ(e["RANK"], "1");
  EXPECT_EQ(e["LOCAL_RANK"], "1");
  EXPECT_EQ(e["WORLD_SIZE"], "2");
  EXPECT_EQ(e["LOCAL_WORLD_SIZE"], "2");
  EXPECT_EQ(e["MASTER_ADDR"], "127.0.0.1");
  EXPECT_EQ(e["MASTER_PORT"], "41000");
  EXPECT_EQ(e["LOCKSTEP_REPLICA_SIZE"], "2");
  EXPECT_EQ(e["LOCKSTEP_JOB_ID"], "j.replica3.2");  // each incarnation a job of its own
  EXPECT_EQ(e["LOCKSTEP_REPLICA_ID"], "3");
}

}  // namespace
