// LaunchEnv: reading torchrun, OpenMPI and Slurm environments; errors name the variable;
// what lockstep-run writes (rank_env) reads back as the same place in the job.
#include <lockstep/comm/init.h>
#include <lockstep/comm/make_group.h>
#include <lockstep/env_contract.h>
#include <lockstep/launch/launcher.h>
#include <lockstep/launch/options.h>
#include <lockstep/launch/rank_env.h>

#include "comm/backends/hier/hier_backend.h"

#include <gtest/gtest.h>
#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <fstream>
#include <initializer_list>
#include <map>
#include <optional>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace {

using lockstep::ConfigError;
using lockstep::comm::LaunchEnv;

const char* kVars[] = {"RANK",
                       "WORLD_SIZE",
                       "LOCAL_RANK",
                       "LOCAL_WORLD_SIZE",
                       "MASTER_ADDR",
                       "MASTER_PORT",
                       "LOCKSTEP_LAUNCHER",
                       "LOCKSTEP_JOB_ID",
                       "LOCKSTEP_RDZV_TOKEN",
                       "LOCKSTEP_RDZV_TOKEN_FILE",
                       "OMPI_COMM_WORLD_RANK",
                       "OMPI_COMM_WORLD_SIZE",
                       "OMPI_COMM_WORLD_LOCAL_RANK",
                       "OMPI_COMM_WORLD_LOCAL_SIZE",
                       "PMI_RANK",
                       "SLURM_PROCID",
                       "SLURM_NTASKS",
                       "SLURM_LOCALID",
                       "SLURM_NNODES",
                       "SLURM_NTASKS_PER_NODE",
                       "SLURM_JOB_ID",
                       "SLURM_LAUNCH_NODE_IPADDR",
                       "SLURM_NODEID",
                       "SLURM_STEP_ID",
                       "SLURM_STEP_NUM_TASKS",
                       "SLURM_STEP_NUM_NODES",
                       "SLURM_STEP_NODELIST",
                       "SLURM_STEP_TASKS_PER_NODE",
                       "SLURM_JOB_NODELIST",
                       "SLURM_JOB_NUM_NODES",
                       "GROUP_RANK",
                       "GROUP_WORLD_SIZE",
                       "TORCHELASTIC_RUN_ID",
                       "PMI_SIZE",
                       "KUBERNETES_SERVICE_HOST",
                       "PET_NNODES",
                       "PET_NPROC_PER_NODE",
                       "PET_NODE_RANK",
                       "PET_MASTER_ADDR",
                       "PET_MASTER_PORT",
                       "LOCKSTEP_DEBUG"};

class EnvTest : public ::testing::Test {
 protected:
  void SetUp() override {
    for (const char* v : kVars) unsetenv(v);
  }
  void TearDown() override { SetUp(); }
  void set(std::initializer_list<std::pair<const char*, const char*>> kv) {
    for (auto& [k, v] : kv) setenv(k, v, 1);
  }
};

TEST_F(EnvTest, NoEnvironmentIsAWorldOfOne) {
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.rank, 0);
  EXPECT_EQ(e.world_size, 1);
  EXPECT_EQ(e.launcher, "none");
  EXPECT_TRUE(e.single_node());
}

TEST_F(EnvTest, TorchrunContract) {
  set({{"RANK", "3"},
       {"WORLD_SIZE", "4"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "node0"},
       {"MASTER_PORT", "1234"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.rank, 3);
  EXPECT_EQ(e.world_size, 4);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 2);
  EXPECT_EQ(e.master_addr, "node0");
  EXPECT_EQ(e.master_port, 1234);
  EXPECT_EQ(e.launcher, "torchrun");
  EXPECT_FALSE(e.single_node());
}

TEST_F(EnvTest, OpenMpiContract) {
  set({{"OMPI_COMM_WORLD_RANK", "1"},
       {"OMPI_COMM_WORLD_SIZE", "2"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "2"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.launcher, "mpirun");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_TRUE(e.single_node());
  // No MASTER_ADDR to report: the store's address comes over MPI.
  EXPECT_NE(e.describe().find("store address from MPI"), std::string::npos) << e.describe();
}

// srun --ntasks-per-node=4 -N2 ./train: rank 5 is task 1 of node 1.
TEST_F(EnvTest, SlurmContract) {
  set({{"SLURM_PROCID", "5"},
       {"SLURM_NTASKS", "8"},
       {"SLURM_LOCALID", "1"},
       {"SLURM_NODEID", "1"},
       {"SLURM_NNODES", "2"},
       {"SLURM_JOB_ID", "777"},
       {"SLURM_STEP_ID", "2"},
       {"SLURM_STEP_NUM_TASKS", "8"},
       {"SLURM_STEP_NUM_NODES", "2"},
       {"SLURM_STEP_TASKS_PER_NODE", "4(x2)"},
       {"SLURM_STEP_NODELIST", "node[07-08]"},
       {"SLURM_JOB_NODELIST", "node[01-08]"},
       {"SLURM_LAUNCH_NODE_IPADDR", "10.1.2.3"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.launcher, "slurm");
  EXPECT_EQ(e.contract, "Slurm");
  EXPECT_EQ(e.rank, 5);
  EXPECT_EQ(e.world_size, 8);
  EXPECT_EQ(e.local_rank, 1);
  EXPECT_EQ(e.local_world_size, 4);
  // The first host of the step, where task 0 runs; not the node srun was typed on.
  EXPECT_EQ(e.master_addr, "node07");
  EXPECT_EQ(e.job_id, "slurm-777.2");
  EXPECT_EQ(e.master_port, lockstep::env::slurm_port("777.2"));
  const std::string d = e.describe();
  EXPECT_NE(d.find("launched by Slurm (SLURM_PROCID=5"), std::string::npos) << d;
  EXPECT_NE(d.find("SLURM_STEP_NODELIST=node[07-08]"), std::string::npos) << d;
  EXPECT_NE(d.find("rank 5 of 8, local rank 1 of 4, master node07:"), std::string::npos) << d;
}

TEST_F(EnvTest, SlurmUnevenTasksPerNodeAndJobNodeList) {
  set({{"SLURM_PROCID", "4"},
       {"SLURM_LOCALID", "0"},
       {"SLURM_NODEID", "2"},
       {"SLURM_STEP_NUM_TASKS", "5"},
       {"SLURM_STEP_TASKS_PER_NODE", "2(x2),1"},
       {"SLURM_JOB_NODELIST", "gpu[3-5]"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.local_world_size, 1);
  EXPECT_EQ(e.master_addr, "gpu3");
}

// In a batch script (no srun) the SLURM_* variables describe the allocation, not a rank:
// one process, and a note saying why.
TEST_F(EnvTest, SlurmBatchScriptIsOneProcessWithANote) {
  set({{"SLURM_PROCID", "0"},
       {"SLURM_NTASKS", "8"},
       {"SLURM_JOB_ID", "777"},
       {"SLURM_JOB_NUM_NODES", "2"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.contract, "none");
  EXPECT_EQ(e.world_size, 1);
  EXPECT_NE(e.note.find("not started by srun"), std::string::npos) << e.note;
}

TEST_F(EnvTest, SlurmAndHandMadeRankThatDisagreeIsAnError) {
  set({{"SLURM_PROCID", "3"},
       {"SLURM_STEP_NUM_TASKS", "4"},
       {"SLURM_LOCALID", "1"},
       {"RANK", "0"},
       {"WORLD_SIZE", "1"}});
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected a conflict";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("conflicting launch environments: torchrun says rank 0 of 1 (RANK=0 "
                     "WORLD_SIZE=1"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("Slurm says rank 3 of 4 (SLURM_PROCID=3 SLURM_STEP_NUM_TASKS=4)"),
              std::string::npos)
        << m;
    EXPECT_NE(m.find("unset the other's variables"), std::string::npos) << m;
  }
  // Agreeing variables (export RANK=$SLURM_PROCID ...) are fine.
  set({{"RANK", "3"}, {"WORLD_SIZE", "4"}});
  EXPECT_EQ(LaunchEnv::from_environment().rank, 3);
}

// srun -N2 --ntasks-per-node=1 torchrun --nnodes 1 ...: each launcher formed its own job.
TEST_F(EnvTest, PerNodeLauncherThatIgnoredSlurmIsAnError) {
  set({{"SLURM_PROCID", "1"},
       {"SLURM_STEP_NUM_TASKS", "2"},
       {"RANK", "1"},
       {"WORLD_SIZE", "2"},
       {"LOCAL_RANK", "1"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"GROUP_RANK", "0"},
       {"GROUP_WORLD_SIZE", "1"},
       {"TORCHELASTIC_RUN_ID", "x"}});
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected a conflict";
  } catch (const ConfigError& e) {
    const std::string m = e.what();
    EXPECT_NE(m.find("srun started 2 launchers but each formed a job of 1 node"), std::string::npos)
        << m;
  }
  // lockstep-run under srun, one per node, as it should be.
  set({{"GROUP_RANK", "1"},
       {"GROUP_WORLD_SIZE", "2"},
       {"RANK", "3"},
       {"WORLD_SIZE", "4"},
       {"LOCKSTEP_LAUNCHER", "lockstep-run"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.contract, "lockstep-run");
  EXPECT_EQ(e.rank, 3);
}

// mpirun under Slurm starts its daemons with srun (one task per node): the step is not the
// ranks', no conflict. srun --mpi=pmix ./train: as many tasks as ranks, they must agree.
TEST_F(EnvTest, MpiUnderSlurm) {
  set({{"OMPI_COMM_WORLD_RANK", "5"},
       {"OMPI_COMM_WORLD_SIZE", "8"},
       {"OMPI_COMM_WORLD_LOCAL_RANK", "1"},
       {"OMPI_COMM_WORLD_LOCAL_SIZE", "4"},
       {"SLURM_PROCID", "1"},
       {"SLURM_STEP_NUM_TASKS", "2"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.contract, "OpenMPI/PMIx");
  EXPECT_EQ(e.rank, 5);
  set({{"SLURM_STEP_NUM_TASKS", "8"}});
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);
}

TEST_F(EnvTest, HandMadeRankBesideMpiThatDisagreesIsAnError) {
  set({{"OMPI_COMM_WORLD_RANK", "1"},
       {"OMPI_COMM_WORLD_SIZE", "2"},
       {"RANK", "0"},
       {"WORLD_SIZE", "2"}});
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected a conflict";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("OpenMPI/PMIx says rank 1 of 2"), std::string::npos)
        << e.what();
  }
}

// A PyTorchJob pod running the program directly: RANK is the pod, one process per pod.
TEST_F(EnvTest, PyTorchJobPodIsOneProcessPerPod) {
  set({{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
       {"RANK", "1"},
       {"WORLD_SIZE", "3"},
       {"MASTER_ADDR", "job-master-0"},
       {"MASTER_PORT", "23456"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.contract, "PyTorchJob");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 3);
  EXPECT_EQ(e.local_world_size, 1);  // not "every rank on this node"
  EXPECT_FALSE(e.single_node());
  EXPECT_EQ(e.master_addr, "job-master-0");
  // nprocPerNode 4: the program needed lockstep-run in the pod.
  set({{"PET_NPROC_PER_NODE", "4"}, {"WORLD_SIZE", "12"}});
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected an error";
  } catch (const ConfigError& ex) {
    EXPECT_NE(std::string(ex.what()).find("start them with lockstep-run"), std::string::npos)
        << ex.what();
  }
}

TEST_F(EnvTest, TrainJobNodeIsOneProcessPerNode) {
  set({{"PET_NNODES", "2"},
       {"PET_NODE_RANK", "1"},
       {"PET_NPROC_PER_NODE", "1"},
       {"PET_MASTER_ADDR", "ctsm-node-0-0.ctsm"},
       {"PET_MASTER_PORT", "29500"}});
  auto e = LaunchEnv::from_environment();
  EXPECT_EQ(e.contract, "TrainJob");
  EXPECT_EQ(e.rank, 1);
  EXPECT_EQ(e.world_size, 2);
  EXPECT_EQ(e.master_addr, "ctsm-node-0-0.ctsm");
  set({{"PET_NPROC_PER_NODE", "auto"}});
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);
}

TEST_F(EnvTest, DescribeNamesTheContractAndTheValues) {
  set({{"RANK", "0"},
       {"WORLD_SIZE", "2"},
       {"LOCAL_RANK", "0"},
       {"LOCAL_WORLD_SIZE", "2"},
       {"MASTER_ADDR", "127.0.0.1"},
       {"MASTER_PORT", "1234"},
       {"LOCKSTEP_LAUNCHER", "lockstep-run"}});
  const std::string d = LaunchEnv::from_environment().describe();
  EXPECT_EQ(d,
            "lockstep: launched by lockstep-run (RANK=0 WORLD_SIZE=2 LOCAL_RANK=0 "
            "LOCAL_WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=1234): rank 0 of 2, local rank 0 "
            "of 2, master 127.0.0.1:1234");
}

TEST_F(EnvTest, AnnounceIsQuietForLockstepRunAndSpeaksForSchedulers) {
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"LOCKSTEP_LAUNCHER", "lockstep-run"}});
  EXPECT_EQ(LaunchEnv::from_environment().announcement(), "");
  set({{"LOCKSTEP_DEBUG", "1"}});
  EXPECT_NE(LaunchEnv::from_environment().announcement().find("launched by lockstep-run"),
            std::string::npos);
  SetUp();
  set({{"SLURM_PROCID", "0"}, {"SLURM_STEP_NUM_TASKS", "2"}, {"SLURM_JOB_ID", "5"}});
  const std::string line = LaunchEnv::from_environment().announcement();
  EXPECT_NE(line.find("launched by Slurm"), std::string::npos) << line;
  EXPECT_EQ(line.back(), '\n');
  set({{"SLURM_PROCID", "1"}});
  EXPECT_EQ(LaunchEnv::from_environment().announcement(), "");  // rank 1 is quiet
  // announce() writes it, once per process.
  set({{"SLURM_PROCID", "0"}});
  testing::internal::CaptureStderr();
  LaunchEnv::from_environment().announce();
  LaunchEnv::from_environment().announce();
  // Once: the line, or nothing where an earlier init() in this process already spoke.
  const std::string out = testing::internal::GetCapturedStderr();
  EXPECT_TRUE(out == line || out.empty()) << out;
}

// Sets variables for one scope and restores what was there before (set or not).
class ScopedEnv {
 public:
  explicit ScopedEnv(const std::map<std::string, std::string>& vars) {
    for (const auto& [k, v] : vars) {
      const char* old = std::getenv(k.c_str());
      saved_.emplace_back(k, old ? std::optional<std::string>(old) : std::nullopt);
      setenv(k.c_str(), v.c_str(), 1);
    }
  }
  ~ScopedEnv() {
    for (const auto& [k, v] : saved_) {
      if (v)
        setenv(k.c_str(), v->c_str(), 1);
      else
        unsetenv(k.c_str());
    }
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::vector<std::pair<std::string, std::optional<std::string>>> saved_;
};

// The launcher's writer and comm's reader share the names of lockstep/env_contract.h;
// this checks they also agree on the values: every rank of a launch reads back its own
// place in the job, its node's shape, the rendezvous address and the job id.
TEST_F(EnvTest, LauncherEnvironmentReadsBack) {
  namespace launch = lockstep::launch;
  struct Case {
    std::vector<std::string> args;
    bool single_node;
  };
  const Case cases[] = {
      {{"--nproc-per-node", "1", "p"}, true},
      {{"--nproc-per-node", "3", "--master-port", "4242", "p"}, true},
      {{"--nnodes", "3", "--node-rank", "2", "--nproc-per-node", "4", "--master-addr", "node0",
        "p"},
       false},
      {{"--nnodes", "2", "--node-rank", "0", "--nproc-per-node", "2", "p"}, false},
  };
  for (const Case& c : cases) {
    const launch::LaunchOptions o = launch::parse_args(c.args);
    launch::GroupContext group;
    group.job_id = "host-123-456";
    group.master_port = o.master_port;
    group.restart_count = 1;
    for (int local = 0; local < o.nproc_per_node; ++local) {
      SCOPED_TRACE(testing::Message() << "node " << o.node_rank << " of " << o.nnodes
                                      << ", local rank " << local << " of " << o.nproc_per_node);
      ScopedEnv scoped(launch::rank_env(o, local, group, {}));
      const LaunchEnv e = LaunchEnv::from_environment();
      EXPECT_EQ(e.rank, o.global_rank(local));
      EXPECT_EQ(e.world_size, o.world_size());
      EXPECT_EQ(e.local_rank, local);
      EXPECT_EQ(e.local_world_size, o.nproc_per_node);
      EXPECT_EQ(e.master_addr, o.master_addr);
      EXPECT_EQ(e.master_port, o.master_port);
      EXPECT_EQ(e.launcher, lockstep::env::kLauncherName);
      EXPECT_EQ(e.job_id, group.job_id);
      EXPECT_EQ(e.single_node(), c.single_node);
    }
  }
}

TEST_F(EnvTest, BadValuesNameTheVariable) {
  set({{"RANK", "abc"}, {"WORLD_SIZE", "2"}});
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("RANK='abc'"), std::string::npos) << e.what();
  }
  set({{"RANK", "2"}, {"WORLD_SIZE", "2"}});
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);
  set({{"RANK", "0"}, {"WORLD_SIZE", "2"}, {"MASTER_PORT", "70000"}});
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);
  unsetenv("WORLD_SIZE");
  unsetenv("MASTER_PORT");
  try {
    LaunchEnv::from_environment();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("WORLD_SIZE"), std::string::npos) << e.what();
  }
}

TEST_F(EnvTest, AutoBackendChoice) {
  using lockstep::comm::resolve_backend;
  LaunchEnv one_node;
  one_node.world_size = one_node.local_world_size = 2;
  EXPECT_EQ(resolve_backend("auto", one_node), "shm");
  LaunchEnv two_nodes = one_node;
  two_nodes.world_size = 4;
  EXPECT_EQ(resolve_backend("auto", two_nodes), "hier");  // several ranks per node
  LaunchEnv one_per_node = two_nodes;
  one_per_node.local_world_size = 1;
  EXPECT_EQ(resolve_backend("auto", one_per_node), "gloo");
  EXPECT_EQ(resolve_backend("hier", one_per_node), "hier");
  EXPECT_EQ(resolve_backend("gloo", one_node), "gloo");
  EXPECT_THROW(resolve_backend("nccl2", one_node), ConfigError);
  setenv("LOCKSTEP_BACKEND", "gloo", 1);
  EXPECT_EQ(resolve_backend("auto", one_node), "gloo");
  unsetenv("LOCKSTEP_BACKEND");
}

TEST_F(EnvTest, InitRejectsBadSettingsByName) {
  setenv("LOCKSTEP_CHECK_COLLECTIVES", "yes", 1);
  try {
    lockstep::init();
    FAIL() << "expected ConfigError";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("LOCKSTEP_CHECK_COLLECTIVES"), std::string::npos);
  }
  unsetenv("LOCKSTEP_CHECK_COLLECTIVES");
  for (const char* bad : {"0.0001", "-3", "abc", "1e12"}) {
    setenv("LOCKSTEP_TIMEOUT_S", bad, 1);
    EXPECT_THROW(lockstep::init(), ConfigError) << bad;
  }
  setenv("LOCKSTEP_TIMEOUT_S", "2.5", 1);
  auto pg = lockstep::init();
  EXPECT_EQ(pg->options().timeout.count(), 2500);
  EXPECT_EQ(pg->size(), 1);
  unsetenv("LOCKSTEP_TIMEOUT_S");
}

// The settings of the fingerprint check and the stall inspector (docs/debugging.md), spelled
// through env_contract.h as init() reads them.
TEST_F(EnvTest, DebugDetailAndStallWarnSettings) {
  namespace n = lockstep::env;
  for (const char* bad : {"abc", "-1", "1e12", "2s"}) {
    setenv(n::kStallWarnSeconds, bad, 1);
    try {
      lockstep::init();
      ADD_FAILURE() << "expected ConfigError for " << bad;
    } catch (const ConfigError& e) {
      EXPECT_NE(std::string(e.what()).find(n::kStallWarnSeconds), std::string::npos) << e.what();
    }
  }
  setenv(n::kStallWarnSeconds, "2.5", 1);
  EXPECT_EQ(lockstep::init()->options().stall_warn.count(), 2500);
  setenv(n::kStallWarnSeconds, "0", 1);  // never warn
  EXPECT_EQ(lockstep::init()->options().stall_warn.count(), 0);
  unsetenv(n::kStallWarnSeconds);
  EXPECT_EQ(lockstep::init()->options().stall_warn.count(), 60000);

  EXPECT_FALSE(lockstep::init()->options().detail);
  for (const char* v : {"DETAIL", "detail", "Detail"}) {
    setenv(n::kDebug, v, 1);
    EXPECT_TRUE(lockstep::init()->options().detail) << v;
  }
  setenv(n::kDebug, "1", 1);  // libtorch's traces only
  EXPECT_FALSE(lockstep::init()->options().detail);
  unsetenv(n::kDebug);
  lockstep::InitOptions o;
  o.detail = true;
  o.stall_warn = lockstep::comm::Millis(1500);
  auto pg = lockstep::init(o);
  EXPECT_TRUE(pg->options().detail);
  EXPECT_EQ(pg->options().stall_warn.count(), 1500);
}

// make_group (the Python extension's entry point) reads the environment as init() does:
// what the program sets wins, then LOCKSTEP_*, then the defaults; hier and mpi need init().
TEST_F(EnvTest, MakeGroupReadsTheEnvironmentLikeInit) {
  namespace n = lockstep::env;
  using lockstep::comm::make_group;
  const auto store = c10::make_intrusive<c10d::HashStore>();
  lockstep::InitOptions o;
  o.env = LaunchEnv{};  // a world of one
  auto pg = make_group(store, o, "mg/0/");
  EXPECT_EQ(pg->backend_name(), "shm");  // auto, on one node
  EXPECT_EQ(pg->options().timeout.count(), 300000);
  EXPECT_TRUE(pg->options().check_collectives);
  setenv(n::kTimeoutSeconds, "2.5", 1);
  setenv(n::kCheckCollectives, "0", 1);
  setenv(n::kStallWarnSeconds, "0", 1);
  setenv(n::kBackend, "gloo", 1);
  pg = make_group(store, o, "mg/1/");
  EXPECT_EQ(pg->backend_name(), "gloo");
  EXPECT_EQ(pg->options().timeout.count(), 2500);
  EXPECT_FALSE(pg->options().check_collectives);
  EXPECT_EQ(pg->options().stall_warn.count(), 0);
  o.timeout = lockstep::comm::Millis(1500);  // the program's own wins
  o.backend = "shm";
  pg = make_group(store, o, "mg/2/");
  EXPECT_EQ(pg->backend_name(), "shm");
  EXPECT_EQ(pg->options().timeout.count(), 1500);
  setenv(n::kTimeoutSeconds, "abc", 1);
  o.timeout.reset();
  EXPECT_THROW(make_group(store, o, "mg/3/"), ConfigError);
  for (const char* v :
       {n::kTimeoutSeconds, n::kCheckCollectives, n::kStallWarnSeconds, n::kBackend})
    unsetenv(v);
  o.backend = "mpi";
  try {
    make_group(store, o, "mg/4/");
    ADD_FAILURE() << "expected ConfigError for mpi";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("lockstep::init()"), std::string::npos) << e.what();
  }
}

// The proofs of the rendezvous token are HMAC-SHA256: RFC 4231 test cases 1, 2 and 6
// (a key longer than the 64-byte block is hashed first).
TEST(RdzvProof, IsHmacSha256) {
  using lockstep::comm::rdzv_proof;
  EXPECT_EQ(rdzv_proof(std::string(20, '\x0b'), "Hi There"),
            "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7");
  EXPECT_EQ(rdzv_proof("Jefe", "what do ya want for nothing?"),
            "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843");
  EXPECT_EQ(rdzv_proof(std::string(131, '\xaa'),
                       "Test Using Larger Than Block-Size Key - Hash Key First"),
            "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54");
}

TEST_F(EnvTest, RdzvTokenFromTheEnvironmentOrAPrivateFile) {
  EXPECT_TRUE(LaunchEnv::from_environment().rdzv_token.empty());
  set({{"LOCKSTEP_RDZV_TOKEN", "s3cret"}});
  EXPECT_EQ(LaunchEnv::from_environment().rdzv_token, "s3cret");
  unsetenv("LOCKSTEP_RDZV_TOKEN");
  char path[] = "/tmp/lockstep-token-XXXXXX";
  const int fd = mkstemp(path);  // created 0600
  ASSERT_GE(fd, 0);
  close(fd);
  std::ofstream(path) << "from file\nsecond line ignored\n";
  set({{"LOCKSTEP_RDZV_TOKEN_FILE", path}});
  EXPECT_EQ(LaunchEnv::from_environment().rdzv_token, "from file");
  set({{"LOCKSTEP_RDZV_TOKEN", "s3cret"}});  // both: ambiguous
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);
  unsetenv("LOCKSTEP_RDZV_TOKEN");
  chmod(path, 0644);  // readable by others: protects nothing
  try {
    LaunchEnv::from_environment();
    ADD_FAILURE() << "expected ConfigError for a 0644 token file";
  } catch (const ConfigError& e) {
    EXPECT_NE(std::string(e.what()).find("chmod 600"), std::string::npos) << e.what();
  }
  unlink(path);
  EXPECT_THROW(LaunchEnv::from_environment(), ConfigError);  // missing file
}

// With a token, a join entry written by a process that does not know it (here a raw store
// client forging rank 1's entry) stops the job at rank 0 instead of joining it.
TEST(RdzvProof, ForgedJoinEntryIsRejected) {
  LaunchEnv e;
  e.world_size = e.local_world_size = 2;
  e.master_port = lockstep::launch::pick_free_port();
  e.job_id = "job-t";
  e.rdzv_token = "the token";
  lockstep::comm::InitOptions o;
  o.env = e;
  o.backend = "gloo";
  o.timeout = std::chrono::milliseconds(3000);
  std::string error;
  std::thread rank0([&] {
    try {
      lockstep::init(o);
    } catch (const lockstep::CommError& ex) {
      error = ex.what();
    }
  });
  c10d::TCPStoreOptions so;
  so.port = static_cast<uint16_t>(e.master_port);
  so.waitWorkers = false;
  so.timeout = std::chrono::milliseconds(3000);
  c10d::TCPStore forger("127.0.0.1", so);
  const std::string v = "evilhost\n" + std::string(64, '0');
  // The key prefix counts the groups this process made before: cover the first 64.
  for (int g = 0; g < 64; ++g)
    forger.set("lockstep/" + std::to_string(g) + "/join/1",
               std::vector<uint8_t>(v.begin(), v.end()));
  rank0.join();
  EXPECT_NE(error.find("join entry of rank 1 carries no valid proof"), std::string::npos) << error;
}

// The hierarchical backend's layout: node by node, the same count per node, one host each.
TEST(HierLayout, AcceptsNodeMajorAndNamesWhatBreaksIt) {
  using lockstep::comm::hier_layout;
  std::string why;
  const std::vector<std::string> hosts{"a", "a", "b", "b", "c", "c"};
  auto l = hier_layout(3, {0, 1, 0, 1, 0, 1}, {2, 2, 2, 2, 2, 2}, hosts, &why);
  ASSERT_TRUE(l.has_value());
  EXPECT_EQ(l->nodes, 3);
  EXPECT_EQ(l->per_node, 2);
  EXPECT_EQ(l->node, 1);
  EXPECT_EQ(l->local, 1);
  EXPECT_EQ(l->job_rank(2, 1), 5);
  // round-robin numbering (mpirun --map-by node)
  EXPECT_FALSE(hier_layout(0, {0, 0, 1, 1}, {2, 2, 2, 2}, {"a", "b", "a", "b"}, &why));
  EXPECT_NE(why.find("not numbered node by node"), std::string::npos) << why;
  // nodes of different sizes
  EXPECT_FALSE(hier_layout(0, {0, 1, 0}, {2, 2, 1}, {"a", "a", "b"}, &why));
  EXPECT_NE(why.find("different numbers of ranks"), std::string::npos) << why;
  // one node's ranks on two hosts
  EXPECT_FALSE(hier_layout(0, {0, 1, 0, 1}, {2, 2, 2, 2}, {"a", "x", "b", "b"}, &why));
  EXPECT_NE(why.find("node 0's ranks run on hosts a and x"), std::string::npos) << why;
}

}  // namespace
