// lockstep-run under schedulers (lockstep/launch/scheduler_env.h, parse_args over an
// environment): Slurm one task per node, Kubeflow PyTorchJob pods, PET_* (TrainJob,
// torchrun's defaults), and the conflicts, with the variables each one sets injected.
#include <map>
#include <string>
#include <vector>

#include <gtest/gtest.h>

#include "lockstep/env_contract.h"
#include "lockstep/launch/options.h"
#include "lockstep/launch/scheduler_env.h"

using namespace lockstep::launch;
using Args = std::vector<std::string>;
using Env = std::map<std::string, std::string>;

namespace {

std::string usage_error(const Args& args, const Env& env) {
  try {
    parse_args(args, env);
  } catch (const UsageError& e) {
    return e.what();
  }
  return "";
}

bool has(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// What srun sets in the one task of node `node` of `nodes` (--ntasks-per-node=1).
Env slurm_step(int node, int nodes) {
  return {{"SLURM_JOB_ID", "4242"},
          {"SLURM_STEP_ID", "3"},
          {"SLURM_PROCID", std::to_string(node)},
          {"SLURM_NODEID", std::to_string(node)},
          {"SLURM_LOCALID", "0"},
          {"SLURM_NTASKS", std::to_string(nodes)},
          {"SLURM_NNODES", std::to_string(nodes)},
          {"SLURM_STEP_NUM_TASKS", std::to_string(nodes)},
          {"SLURM_STEP_NUM_NODES", std::to_string(nodes)},
          {"SLURM_STEP_TASKS_PER_NODE", "1(x" + std::to_string(nodes) + ")"},
          {"SLURM_STEP_NODELIST", "node[07-08]"},
          {"SLURM_JOB_NODELIST", "node[01-08]"}};
}

// What Kubeflow's training-operator sets in pod `pod` of a PyTorchJob of `pods` pods with
// nprocPerNode = nproc (pkg/controller.v1/pytorch/envvar.go, master.go).
Env pytorchjob_pod(int pod, int pods, int nproc) {
  return {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
          {"PYTHONUNBUFFERED", "0"},
          {"MASTER_ADDR", "ctsm-master-0"},
          {"MASTER_PORT", "23456"},
          {"WORLD_SIZE", std::to_string(pods * nproc)},
          {"RANK", std::to_string(pod)},
          {"PET_NPROC_PER_NODE", std::to_string(nproc)},
          {"PET_NODE_RANK", std::to_string(pod)},
          {"PET_NNODES", std::to_string(pods)}};
}

// What Trainer v2's torch plugin sets in node `node` of a TrainJob named ctsm
// (pkg/runtime/framework/plugins/torch/torch.go).
Env trainjob_node(int node, int nodes, const std::string& nproc) {
  return {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
          {"PET_NNODES", std::to_string(nodes)},
          {"PET_NPROC_PER_NODE", nproc},
          {"PET_NODE_RANK", std::to_string(node)},
          {"PET_MASTER_ADDR", "ctsm-node-0-0.ctsm"},
          {"PET_MASTER_PORT", "29500"}};
}

TEST(LaunchScheduler, NoSchedulerChangesNothing) {
  LaunchOptions o = parse_args({"--nproc-per-node", "2", "./train"}, Env{{"HOME", "/root"}});
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.node_rank, 0);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.launch_line, "");
  EXPECT_EQ(o.launch_note, "");
}

// The case: srun -N2 --ntasks-per-node=1 lockstep-run --nproc-per-node 2 must be
// one job of 2 nodes, not two jobs of one.
TEST(LaunchScheduler, SlurmTaskPerNodeGivesTheJobShape) {
  for (int node = 0; node < 2; ++node) {
    LaunchOptions o = parse_args({"--nproc-per-node", "2", "./train"}, slurm_step(node, 2));
    EXPECT_EQ(o.nnodes, 2);
    EXPECT_EQ(o.node_rank, node);
    EXPECT_EQ(o.world_size(), 4);
    EXPECT_EQ(o.master_addr, "node07");  // the step's first host, not the job's
    EXPECT_EQ(o.rdzv_id, "slurm-4242.3");
    EXPECT_EQ(o.master_port, lockstep::env::slurm_port("4242.3"));
    EXPECT_GE(o.master_port, 29500);
    EXPECT_LT(o.master_port, 49500);
    EXPECT_TRUE(has(o.launch_line, "Slurm (")) << o.launch_line;
    EXPECT_TRUE(has(o.launch_line, "SLURM_STEP_NODELIST=node[07-08]")) << o.launch_line;
    EXPECT_TRUE(has(o.launch_line, "node " + std::to_string(node) + " of 2")) << o.launch_line;
  }
}

// srun -N1 -n1 lockstep-run: one node keeps 127.0.0.1 (a loopback-only store).
TEST(LaunchScheduler, SlurmOneNodeKeepsLoopback) {
  LaunchOptions o = parse_args({"--nproc-per-node", "4", "./train"}, slurm_step(0, 1));
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_EQ(o.master_addr, "127.0.0.1");
  EXPECT_EQ(o.rdzv_id, "slurm-4242.3");
}

TEST(LaunchScheduler, SlurmJobNodeListWhenNoStepList) {
  Env env = slurm_step(0, 2);
  env.erase("SLURM_STEP_NODELIST");
  EXPECT_EQ(parse_args({"./train"}, env).master_addr, "node01");
}

TEST(LaunchScheduler, SlurmFlagsThatAgreeOrDoNotTouchTheShapeAreFine) {
  LaunchOptions o = parse_args({"--nnodes", "2", "--node-rank", "1", "--master-addr", "ib-node07",
                                "--master-port", "4000", "--rdzv-id", "mine", "./train"},
                               slurm_step(1, 2));
  EXPECT_EQ(o.master_addr, "ib-node07");
  EXPECT_EQ(o.master_port, 4000);
  EXPECT_EQ(o.rdzv_id, "mine");
}

TEST(LaunchScheduler, SlurmFlagThatContradictsTheStepIsAnError) {
  const std::string e = usage_error({"--nnodes", "1", "./train"}, slurm_step(1, 2));
  EXPECT_TRUE(has(e, "conflicting launch environments")) << e;
  EXPECT_TRUE(has(e, "--nnodes says nnodes 1")) << e;
  EXPECT_TRUE(has(e, "Slurm step says 2")) << e;
  EXPECT_TRUE(has(e, "SLURM_STEP_NUM_NODES=2")) << e;
  EXPECT_TRUE(has(e, "Leave --nnodes out")) << e;
  const std::string r = usage_error({"--node-rank", "0", "./train"}, slurm_step(1, 2));
  EXPECT_TRUE(has(r, "--node-rank says node rank 0")) << r;
  // A PET_* value is checked like a flag.
  Env env = slurm_step(0, 2);
  env["PET_NNODES"] = "3";
  EXPECT_TRUE(has(usage_error({"./train"}, env), "PET_NNODES=3 says nnodes 3"));
}

TEST(LaunchScheduler, SlurmMoreThanOneTaskPerNodeIsAnError) {
  Env env = slurm_step(1, 2);
  env["SLURM_STEP_NUM_TASKS"] = "4";
  const std::string e = usage_error({"./train"}, env);
  EXPECT_TRUE(has(e, "SLURM_STEP_NUM_TASKS=4 tasks on SLURM_STEP_NUM_NODES=2 nodes")) << e;
  EXPECT_TRUE(has(e, "srun --ntasks-per-node=1 lockstep-run")) << e;
}

TEST(LaunchScheduler, SlurmBadNodeListNamesIt) {
  Env env = slurm_step(0, 2);
  env["SLURM_STEP_NODELIST"] = "node[07-";
  const std::string e = usage_error({"./train"}, env);
  EXPECT_TRUE(has(e, "SLURM_STEP_NODELIST")) << e;
  EXPECT_TRUE(has(e, "'[' without ']'")) << e;
}

// A batch script (no srun): SLURM_PROCID without the step variables is no step.
TEST(LaunchScheduler, SlurmBatchScriptWithoutSrunRunsAloneAndSaysSo) {
  Env env = {{"SLURM_JOB_ID", "9"},
             {"SLURM_PROCID", "0"},
             {"SLURM_NNODES", "2"},
             {"SLURM_JOB_NUM_NODES", "2"},
             {"SLURM_JOB_NODELIST", "n[1-2]"}};
  LaunchOptions o = parse_args({"./train"}, env);
  EXPECT_EQ(o.nnodes, 1);
  EXPECT_TRUE(has(o.launch_note, "not started by srun")) << o.launch_note;
  env["SLURM_JOB_NUM_NODES"] = "1";
  EXPECT_EQ(parse_args({"./train"}, env).launch_note, "");
}

// lockstep-run started by a rank of another launcher reads none of this.
TEST(LaunchScheduler, InsideAnotherLaunchersRankNothingIsRead) {
  Env env = slurm_step(1, 2);
  env["LOCAL_RANK"] = "0";
  EXPECT_EQ(parse_args({"./train"}, env).nnodes, 1);
}

TEST(LaunchScheduler, PyTorchJobPodsFormOneJob) {
  for (int pod = 0; pod < 2; ++pod) {
    LaunchOptions o = parse_args({"./train"}, pytorchjob_pod(pod, 2, 4));
    EXPECT_EQ(o.nnodes, 2);
    EXPECT_EQ(o.node_rank, pod);
    EXPECT_EQ(o.nproc_per_node, 4);  // PET_NPROC_PER_NODE
    EXPECT_EQ(o.world_size(), 8);
    EXPECT_EQ(o.master_addr, "ctsm-master-0");
    EXPECT_EQ(o.master_port, 23456);
    EXPECT_TRUE(has(o.launch_line, "PyTorchJob (RANK=")) << o.launch_line;
    EXPECT_TRUE(has(o.launch_line, "PET_NPROC_PER_NODE=4")) << o.launch_line;
  }
}

// The operator before nprocPerNode: WORLD_SIZE = the pods, no PET_*.
TEST(LaunchScheduler, PyTorchJobOldContractWorldSizeIsThePods) {
  Env env = {{"KUBERNETES_SERVICE_HOST", "10.96.0.1"},
             {"MASTER_ADDR", "job-master-0"},
             {"MASTER_PORT", "23456"},
             {"WORLD_SIZE", "3"},
             {"RANK", "2"}};
  LaunchOptions o = parse_args({"--nproc-per-node", "2", "./train"}, env);
  EXPECT_EQ(o.nnodes, 3);
  EXPECT_EQ(o.node_rank, 2);
  EXPECT_EQ(o.world_size(), 6);
}

TEST(LaunchScheduler, PyTorchJobWorldSizeThatFitsNothingIsAnError) {
  // WORLD_SIZE = 2 pods x 4, but lockstep-run told to start 3 per pod.
  const std::string e = usage_error({"--nproc-per-node", "3", "./train"}, pytorchjob_pod(0, 2, 4));
  EXPECT_TRUE(has(e, "WORLD_SIZE=8 is neither the number of pods (2) nor pods x processes")) << e;
}

TEST(LaunchScheduler, TrainJobPetVariablesAreFlagDefaults) {
  LaunchOptions o = parse_args({"./train"}, trainjob_node(1, 2, "2"));
  EXPECT_EQ(o.nnodes, 2);
  EXPECT_EQ(o.node_rank, 1);
  EXPECT_EQ(o.nproc_per_node, 2);
  EXPECT_EQ(o.master_addr, "ctsm-node-0-0.ctsm");
  EXPECT_EQ(o.master_port, 29500);
  EXPECT_EQ(o.set_by.at("--nnodes"), "PET_NNODES=2");
  EXPECT_TRUE(has(o.launch_line, "TrainJob (PET_*)")) << o.launch_line;
  EXPECT_TRUE(has(o.launch_line, "node 1 of 2")) << o.launch_line;
}

TEST(LaunchScheduler, ExplicitFlagsWinOverPet) {
  Env env = trainjob_node(1, 2, "2");
  env["PET_RDZV_ID"] = "from-env";
  env["PET_MAX_RESTARTS"] = "3";
  LaunchOptions o = parse_args(
      {"--nproc-per-node", "4", "--master-port", "4000", "--rdzv-id", "flag", "./train"}, env);
  EXPECT_EQ(o.nproc_per_node, 4);
  EXPECT_EQ(o.master_port, 4000);
  EXPECT_EQ(o.rdzv_id, "flag");
  EXPECT_EQ(o.max_restarts, 3);  // PET_MAX_RESTARTS, no flag
  EXPECT_EQ(o.set_by.at("--rdzv-id"), "--rdzv-id");
}

TEST(LaunchScheduler, PetValuesAreCheckedLikeFlags) {
  Env env = trainjob_node(0, 2, "2");
  env["PET_MASTER_PORT"] = "http";
  EXPECT_TRUE(has(usage_error({"./train"}, env), "PET_MASTER_PORT expects a TCP port"));
  env = trainjob_node(0, 2, "2");
  env["PET_RDZV_ID"] = "a/b";
  EXPECT_TRUE(has(usage_error({"./train"}, env), "PET_RDZV_ID expects 1-64 characters"));
  env = trainjob_node(3, 2, "2");
  EXPECT_TRUE(has(usage_error({"./train"}, env), "--node-rank must be below --nnodes"));
}

TEST(LaunchScheduler, PetDeviceClassNeedsANumber) {
  const std::string e = usage_error({"./train"}, trainjob_node(0, 2, "auto"));
  EXPECT_TRUE(has(e, "PET_NPROC_PER_NODE='auto'")) << e;
  EXPECT_TRUE(has(e, "numProcPerNode")) << e;
  // --nproc-per-node settles it.
  EXPECT_EQ(
      parse_args({"--nproc-per-node", "2", "./train"}, trainjob_node(0, 2, "auto")).nproc_per_node,
      2);
}

TEST(LaunchScheduler, PetElasticRangeOnlyWhenFixed) {
  Env env = trainjob_node(0, 2, "1");
  env["PET_NNODES"] = "2:2";
  EXPECT_EQ(parse_args({"./train"}, env).nnodes, 2);
  env["PET_NNODES"] = "1:3";
  const std::string e = usage_error({"./train"}, env);
  EXPECT_TRUE(has(e, "PET_NNODES='1:3' is an elastic range")) << e;
}

TEST(LaunchScheduler, SlurmAndPodTogetherIsAConflict) {
  Env env = slurm_step(0, 2);
  for (const auto& [k, v] : pytorchjob_pod(1, 2, 1)) env[k] = v;
  const std::string e = usage_error({"./train"}, env);
  EXPECT_TRUE(has(e, "conflicting launch environments: a Slurm step")) << e;
  EXPECT_TRUE(has(e, "PyTorchJob pod (RANK=1")) << e;
}

}  // namespace
