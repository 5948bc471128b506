#!/usr/bin/env bash
# The schedulers' environment contracts with real processes, the variables each scheduler
# sets injected by hand (docs/schedulers.md): every case must form ONE job whose ranks
# 0..N-1 each join once, where the bug was N/2-rank jobs formed twice.
#  1. Slurm, lockstep-run per node (srun -N2 --ntasks-per-node=1 lockstep-run
#     --nproc-per-node 2): 2 "nodes" on this host, no flags but --nproc-per-node;
#  2. the same with --nnodes 1 (the old way of forming two jobs): an error naming both;
#  3. Slurm, a task per rank (srun -N2 --ntasks-per-node=2 PROGRAM): 4 processes;
#  4. a task per rank with RANK / WORLD_SIZE exported that disagree: an error naming both;
#  5. PyTorchJob (training-operator with nprocPerNode): 2 pods x lockstep-run of 2;
#  6. PyTorchJob before nprocPerNode (WORLD_SIZE = pods) with --nproc-per-node 2;
#  7. TrainJob (PET_* only): 2 nodes x lockstep-run of 2.
# usage: scheduler_env_test.sh FAULT_PROGRAM LOCKSTEP_RUN        (about 15 s)
set -u
prog=$1; run=$2
export LOCKSTEP_BACKEND=gloo LOCKSTEP_TIMEOUT_S=30
# Nothing of the caller's own launcher or scheduler may leak in.
for v in $(env | grep -oE '^(SLURM_[A-Z_]*|PET_[A-Z_]*|OMPI_[A-Z_]*|PMI_[A-Z_]*|PMIX_[A-Z_]*|KUBERNETES_[A-Z_]*)='); do
  unset "${v%=}"
done
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE GROUP_RANK \
  GROUP_WORLD_SIZE LOCKSTEP_LAUNCHER LOCKSTEP_JOB_ID LOCKSTEP_RDZV_TOKEN LOCKSTEP_RDZV_TOKEN_FILE \
  TORCHELASTIC_RUN_ID
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null' EXIT
source "$(dirname "$0")/../lib/checks.sh"
on_fail() { sed 's/^/    | /' "$tmp"/out.* | tail -40; }

# one_job N: ranks 0..N-1 each joined exactly once over all outputs, and nothing else did.
one_job() {
  local n=$1 r
  [[ $(cat "$tmp"/out.* | grep -c ' joined$') == "$n" ]] || return 1
  for ((r = 0; r < n; r++)); do
    [[ $(cat "$tmp"/out.* | grep -c "rank $r joined$") == 1 ]] || return 1
  done
}
# rcs_zero: every background job of the case exited 0.
wait_all() {
  local pid rc=0
  for pid in "$@"; do wait "$pid" || rc=1; done
  return $rc
}
fresh() { rm -f "$tmp"/out.*; }

# What srun sets in the task of node NODE of a 2-node step, one task per node.
slurm_node() {
  local node=$1
  echo SLURM_JOB_ID=$job SLURM_STEP_ID=0 SLURM_PROCID=$node SLURM_NODEID=$node SLURM_LOCALID=0 \
    SLURM_NTASKS=2 SLURM_NNODES=2 SLURM_STEP_NUM_TASKS=2 SLURM_STEP_NUM_NODES=2 \
    SLURM_STEP_TASKS_PER_NODE='1(x2)' SLURM_STEP_NODELIST=localhost,localhost \
    SLURM_JOB_NODELIST=localhost,localhost
}
job=$((100000 + RANDOM))

# 1. Slurm, lockstep-run per node.
fresh; pids=()
for node in 0 1; do
  env $(slurm_node $node) timeout 60 "$run" --nproc-per-node 2 --grace-seconds 1 "$prog" join \
    >"$tmp/out.$node" 2>&1 &
  pids+=($!)
done
if wait_all "${pids[@]}" && one_job 4 && has "$tmp/out.1" "lockstep-run: Slurm (" &&
  has "$tmp/out.1" "node 1 of 2, 2 rank(s) on this node, master localhost:" &&
  has "$tmp/out.0" "job id slurm-$job.0"; then
  pass "slurm: srun --ntasks-per-node=1 lockstep-run on 2 nodes forms one job of 4 ranks"
else
  fail "slurm: lockstep-run per node"
fi

# 2. ... with --nnodes 1: refused before anything starts, naming both.
fresh
env $(slurm_node 1) "$run" --nnodes 1 --nproc-per-node 2 "$prog" join >"$tmp/out.0" 2>&1
rc=$?
if [[ $rc == 2 ]] && has "$tmp/out.0" "--nnodes says nnodes 1 but the Slurm step says 2" &&
  ! grep -q joined "$tmp/out.0"; then
  pass "slurm: --nnodes 1 under a 2-node step is refused naming both (rc $rc)"
else
  fail "slurm: --nnodes 1 under a 2-node step (rc $rc)"
fi

# What srun sets in task RANK of srun -N2 --ntasks-per-node=2.
slurm_task() {
  local r=$1
  echo SLURM_JOB_ID=$job SLURM_STEP_ID=1 SLURM_PROCID=$r SLURM_NODEID=$((r / 2)) \
    SLURM_LOCALID=$((r % 2)) SLURM_NTASKS=4 SLURM_NNODES=2 SLURM_STEP_NUM_TASKS=4 \
    SLURM_STEP_NUM_NODES=2 SLURM_STEP_TASKS_PER_NODE='2(x2)' \
    SLURM_STEP_NODELIST=localhost,localhost SLURM_JOB_NODELIST=localhost,localhost
}

# 3. Slurm, a task per rank.
fresh; pids=()
for r in 0 1 2 3; do
  env $(slurm_task $r) timeout 60 "$prog" join >"$tmp/out.$r" 2>&1 &
  pids+=($!)
done
if wait_all "${pids[@]}" && one_job 4 && has "$tmp/out.0" "lockstep: launched by Slurm (SLURM_PROCID=0" &&
  has "$tmp/out.0" "rank 0 of 4, local rank 0 of 2, master localhost:" &&
  ! grep -q "launched by" "$tmp/out.1"; then
  pass "slurm: srun --ntasks-per-node=2 on 2 nodes forms one job of 4; rank 0 says how"
else
  fail "slurm: a task per rank"
fi

# 4. A task per rank with RANK / WORLD_SIZE exported by hand that disagree.
fresh
env $(slurm_task 2) RANK=0 WORLD_SIZE=1 timeout 30 "$prog" join >"$tmp/out.0" 2>&1
rc=$?
if [[ $rc != 0 ]] && has "$tmp/out.0" "conflicting launch environments: torchrun says rank 0 of 1" &&
  has "$tmp/out.0" "Slurm says rank 2 of 4"; then
  pass "slurm + RANK/WORLD_SIZE that disagree: an error naming both (rc $rc)"
else
  fail "slurm + RANK/WORLD_SIZE that disagree (rc $rc)"
fi

# 5. PyTorchJob pods (training-operator envvar.go with nprocPerNode 2): lockstep-run in each.
p=$(free_port)
pod() {
  echo KUBERNETES_SERVICE_HOST=10.96.0.1 PYTHONUNBUFFERED=0 MASTER_ADDR=localhost MASTER_PORT=$p \
    WORLD_SIZE=4 RANK=$1 PET_NPROC_PER_NODE=2 PET_NODE_RANK=$1 PET_NNODES=2
}
fresh; pids=()
for i in 0 1; do
  env $(pod $i) timeout 60 "$run" --grace-seconds 1 "$prog" join >"$tmp/out.$i" 2>&1 &
  pids+=($!)
done
if wait_all "${pids[@]}" && one_job 4 && has "$tmp/out.1" "lockstep-run: PyTorchJob (RANK=1" &&
  has "$tmp/out.1" "node 1 of 2"; then
  pass "pytorchjob: 2 pods x lockstep-run (PET_NPROC_PER_NODE=2) form one job of 4"
else
  fail "pytorchjob with nprocPerNode"
fi

# 6. PyTorchJob before nprocPerNode: WORLD_SIZE = the pods, --nproc-per-node in the command.
p=$(free_port)
fresh; pids=()
for i in 0 1; do
  env KUBERNETES_SERVICE_HOST=10.96.0.1 MASTER_ADDR=localhost MASTER_PORT=$p WORLD_SIZE=2 RANK=$i \
    timeout 60 "$run" --nproc-per-node 2 --grace-seconds 1 "$prog" join >"$tmp/out.$i" 2>&1 &
  pids+=($!)
done
if wait_all "${pids[@]}" && one_job 4; then
  pass "pytorchjob (WORLD_SIZE = pods): 2 pods x lockstep-run --nproc-per-node 2 form one job of 4"
else
  fail "pytorchjob, WORLD_SIZE = pods"
fi

# 7. TrainJob (trainer's torch plugin): PET_* only.
p=$(free_port)
fresh; pids=()
for i in 0 1; do
  env KUBERNETES_SERVICE_HOST=10.96.0.1 PET_NNODES=2 PET_NPROC_PER_NODE=2 PET_NODE_RANK=$i \
    PET_MASTER_ADDR=localhost PET_MASTER_PORT=$p \
    timeout 60 "$run" --grace-seconds 1 "$prog" join >"$tmp/out.$i" 2>&1 &
  pids+=($!)
done
if wait_all "${pids[@]}" && one_job 4 && has "$tmp/out.0" "lockstep-run: TrainJob (PET_*)"; then
  pass "trainjob: 2 nodes x lockstep-run from PET_* form one job of 4"
else
  fail "trainjob"
fi

finish
