#!/usr/bin/env bash
# Kubernetes training operators without a cluster (docs/schedulers.md): 2 "pods", each a
# namespace host of netns.sh (own network, host name, pid namespace, /dev/shm, /etc/hosts),
# each starting exactly what the operator's pod would start with exactly the variables the
# operator sets (plus what any container gets: PATH, HOME, HOSTNAME and the kubelet's
# KUBERNETES_SERVICE_*), and nothing of lockstep's own (no LOCKSTEP_*). The master Service
# name the operator puts in MASTER_ADDR / PET_MASTER_ADDR resolves, as a headless Service
# does, to pod 0's address: a line in the hosts' shared /etc/hosts (netns.sh's $MH_DIR/hosts).
#   pytorchjob:        training-operator v1, a master and 1 worker, nprocPerNode 2: each pod
#                      runs `lockstep-run collectives_check`; one job of 4 ranks, 2 per pod;
#   pytorchjob_direct: the same with nprocPerNode 1 (the operator's default): each pod runs
#                      `collectives_check` itself; one job of 2 ranks, 1 per pod;
#   trainjob:          Trainer v2's torch plugin, numNodes 2, numProcPerNode 2: each pod runs
#                      `lockstep-run collectives_check`; one job of 4 ranks, 2 per pod;
#   trainjob_direct:   the same with numProcPerNode 1, each pod running `collectives_check`
#                      itself; one job of 2 ranks, 1 per pod.
# Each: every process exits 0, every rank reports "N passed, 0 failed", the launch line
# names the contract, and the traffic crossed pod 1's link.
# usage: pods_test.sh CONTRACT LOCKSTEP_RUN COLLECTIVES_CHECK      (7-18 s; root, else 77)
set -u
contract=$1; run=$2; check=$3
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"
# shellcheck source=../lib/checks.sh
source "$here/../lib/checks.sh"
mh_require
job=ctsm  # the PyTorchJob's / TrainJob's metadata.name
case $contract in
  pytorchjob)
    per=2; master=$job-master-0; port=23456
    want_line="lockstep-run: PyTorchJob \\(" ;;
  pytorchjob_direct)
    per=1; master=$job-master-0; port=23456
    want_line="lockstep: launched by PyTorchJob \\(" ;;
  trainjob)
    per=2; master=$job-node-0-0.$job; port=29500
    want_line="lockstep-run: TrainJob \\(" ;;
  trainjob_direct)
    per=1; master=$job-node-0-0.$job; port=29500
    want_line="lockstep: launched by TrainJob \\(" ;;
  *)
    echo "pods_test.sh: unknown contract '$contract'" \
      "(pytorchjob, pytorchjob_direct, trainjob, trainjob_direct)"
    exit 2 ;;
esac
pods=2
world=$((pods * per))
tally_tag="[pods, $contract]"
show() { sed "s/^/    pod$1 | /" "$MH_DIR/pod$1.out" | tail -"${2:-30}"; }

mh_setup $pods || { fail "could not set up $pods pods"; finish; }
# The master's Service name -> pod 0 (host 1), as the cluster DNS answers for a headless
# Service; every pod sees this file as its /etc/hosts (mh_exec bind-mounts it).
echo "$(mh_ip 1) $master" >>"$MH_DIR/hosts"

# operator_env I: what the operator sets in pod I's container (I = 0, 1), one VAR=VALUE a word.
operator_env() {
  local i=$1
  case $contract in
    pytorchjob | pytorchjob_direct)
      # training-operator pkg/controller.v1/pytorch/envvar.go setPodEnv, master.go: master pod
      # RANK 0, worker-0 RANK 1; WORLD_SIZE = replicas x nprocPerNode; PET_NNODES = replicas.
      echo PYTHONUNBUFFERED=0 MASTER_PORT=$port MASTER_ADDR=$master WORLD_SIZE=$world \
        RANK="$i" PET_NPROC_PER_NODE=$per PET_NODE_RANK="$i" PET_NNODES=$pods ;;
    trainjob | trainjob_direct)
      # trainer pkg/runtime/framework/plugins/torch/torch.go EnforceMLPolicy: PET_* only.
      echo PET_NNODES=$pods PET_NPROC_PER_NODE=$per PET_NODE_RANK="$i" \
        PET_MASTER_ADDR=$master PET_MASTER_PORT=$port ;;
  esac
}
# The pod's command: the container's `command:` in deploy/kubernetes/*.yaml.
pod_command() {
  if [[ $contract == *_direct ]]; then echo "$check"; else echo "$run $check"; fi
}

declare -a pids
rx0=$(mh_rx_bytes 2)
t0=$SECONDS
for ((i = 0; i < pods; i++)); do
  # shellcheck disable=SC2046
  (
    mh_exec $((i + 1)) env -i PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin \
      HOME=/root HOSTNAME="host$((i + 1))" KUBERNETES_SERVICE_HOST=10.96.0.1 \
      KUBERNETES_SERVICE_PORT=443 $(operator_env $i) \
      "$(command -v timeout)" -s KILL 60 $(pod_command) >"$MH_DIR/pod$i.out" 2>&1
    echo $? >"$MH_DIR/pod$i.rc"
  ) &
  pids[i]=$!
done
for ((i = 0; i < pods; i++)); do wait "${pids[i]}"; done
echo "collectives_check, $contract, $pods pods x $per process(es): $((SECONDS - t0)) s"
for ((i = 0; i < pods; i++)); do
  rc=$(cat "$MH_DIR/pod$i.rc" 2>/dev/null || echo none)
  echo "pod $i: $(operator_env $i) $(pod_command | sed "s|[^ ]*/||g")"
  if [[ $rc == 0 ]]; then pass "pod $i: exit 0"; else fail "pod $i: exit $rc"; show $i; fi
done
ok=1
for ((r = 0; r < world; r++)); do
  n=$(cat "$MH_DIR"/pod*.out | grep -cE "rank $r/$world \[[a-z]+\]: [0-9]+ passed, 0 failed")
  [[ $n == 1 ]] || { fail "rank $r reported '[BACKEND]: N passed, 0 failed' $n times (want 1)"; ok=0; }
done
((ok)) && pass "one job of $world ranks: $(grep -h -m1 -oE "rank 0/$world .*" "$MH_DIR"/pod*.out)"
# Rank r runs in pod r / per: the pods' ranks are node-major, as the operator's RANK says.
for ((r = 0; r < world; r++)); do
  grep -qE "rank $r/$world " "$MH_DIR/pod$((r / per)).out" ||
    { fail "rank $r did not run in pod $((r / per))"; ok=0; }
done
((ok)) && pass "rank(s) $(seq -s, 0 $((per - 1))) in pod 0, $(seq -s, $per $((world - 1))) in pod 1"
# lockstep-run names the contract in each pod, with that pod's node rank; init() (program
# started directly) on rank 0, with its rank and local rank.
for ((i = 0; i < pods; i++)); do
  if [[ $contract == *_direct ]]; then
    ((i == 0)) || continue
    want="$want_line.*\): rank 0 of $world, local rank 0 of 1"
  else
    want="$want_line.*\): node $i of $pods, $per rank\(s\) on this node, master $master:$port"
  fi
  line=$(grep -m1 -E "$want" "$MH_DIR/pod$i.out")
  if [[ -n $line ]]; then pass "pod $i named the contract: $line"
  else fail "pod $i printed no line matching '$want'"; fi
done
mh_crossed "$rx0" 2 "pod 1" pods
((failures == 0)) || { show 0; show 1; }
finish
