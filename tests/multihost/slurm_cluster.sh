# shellcheck shell=bash
# A real Slurm on this host for tests and benchmarks: Debian's slurmctld and 2 slurmd -N
# nodes on loopback, auth/none and cred/none (no munge), started and stopped by the caller.
# Source it (bash); tests/multihost/slurm_test.sh and bench/schedulers.sh do.
#
#   slurm_require   exit 77 with the reason where it cannot run (not root, no daemons, no
#                   auth/none or cred/none plugins, a host name that does not resolve)
#   slurm_start     write the configuration, start the daemons, wait until both nodes are
#                   idle (exit 77 with their logs' tail if they never are); exports
#                   SLURM_CONF; SLURM_DIR is its directory, SLURM_NODE1 / SLURM_NODE2 the
#                   nodes' names. A trap stops the daemons and removes SLURM_DIR on exit.
#   slurm_stop      stop the daemons now (KEEP=1 keeps SLURM_DIR)
#
# The first node is named after this host so that the first host of the node list (the
# master address) resolves; the second is that name with "-2", which sorts after it: Slurm
# orders its nodes by name, task 0 runs on the first, and the master address is the first
# host of the step's node list, which must resolve (a second node "node2" sorted first and
# did not). Both run at 127.0.0.1.

SLURM_DIR=""
SLURM_PIDS=()

slurm_skip() {
  echo "SKIP: $* (a real Slurm needs root and Debian's slurmctld, slurmd, slurm-client)"
  exit 77
}

slurm_require() {
  [[ $(id -u) == 0 ]] || slurm_skip "not root"
  local t plugins
  for t in slurmctld slurmd srun sbatch sinfo; do
    command -v $t >/dev/null || slurm_skip "'$t' is not installed"
  done
  plugins=$(dirname "$(find /usr/lib -name auth_none.so -path '*slurm*' 2>/dev/null | head -1)")
  [[ -f $plugins/auth_none.so && -f $plugins/cred_none.so ]] ||
    slurm_skip "no auth/none, cred/none plugins"
  getent hosts "$(hostname)" >/dev/null || slurm_skip "this host's name '$(hostname)' does not resolve"
}

slurm_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}

slurm_stop() {
  local p
  for p in "${SLURM_PIDS[@]}"; do kill "$p" 2>/dev/null; done
  sleep 0.5
  for p in "${SLURM_PIDS[@]}"; do kill -9 "$p" 2>/dev/null; done
  SLURM_PIDS=()
  [[ -n ${KEEP:-} || -z $SLURM_DIR ]] || rm -rf "$SLURM_DIR"
}

slurm_write_conf() {
  local d=$SLURM_DIR n1=$SLURM_NODE1 n2=$SLURM_NODE2
  cat >"$d/slurm.conf" <<CONF
ClusterName=lockstep$$
SlurmctldHost=localhost(127.0.0.1)
SlurmctldPort=$(slurm_port)
SlurmdPort=$(slurm_port)
AuthType=auth/none
CredType=cred/none
SlurmUser=root
SlurmdUser=root
StateSaveLocation=$d/state
SlurmdSpoolDir=$d/spool/%n
SlurmctldPidFile=$d/slurmctld.pid
SlurmdPidFile=$d/slurmd-%n.pid
SlurmctldLogFile=$d/slurmctld.log
SlurmdLogFile=$d/slurmd-%n.log
SlurmdParameters=config_overrides
ProctrackType=proctrack/pgid
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
SwitchType=switch/none
JobCompType=jobcomp/none
AccountingStorageType=accounting_storage/none
JobAcctGatherType=jobacct_gather/none
ReturnToService=2
PlugStackConfig=/dev/null
NodeName=$n1 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(slurm_port) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000
NodeName=$n2 NodeHostname=localhost NodeAddr=127.0.0.1 Port=$(slurm_port) CPUs=2 Sockets=1 CoresPerSocket=2 ThreadsPerCore=1 RealMemory=1000
PartitionName=test Nodes=$n1,$n2 Default=YES MaxTime=INFINITE State=UP OverSubscribe=YES
CONF
}

slurm_up() { [[ $(timeout 3 sinfo -h -o '%t' 2>/dev/null | sort -u) == idle ]]; }

slurm_start() {
  local node t0=$SECONDS
  SLURM_DIR=$(mktemp -d "${TMPDIR:-/tmp}/lockstep-slurm.XXXXXX")
  SLURM_NODE1=$(hostname)
  SLURM_NODE2=$SLURM_NODE1-2
  trap slurm_stop EXIT
  mkdir -p "$SLURM_DIR/state" "$SLURM_DIR/spool"
  slurm_write_conf
  export SLURM_CONF=$SLURM_DIR/slurm.conf
  slurmctld -D -c -f "$SLURM_CONF" >"$SLURM_DIR/slurmctld.out" 2>&1 &
  SLURM_PIDS+=($!)
  disown $!
  sleep 1
  for node in "$SLURM_NODE1" "$SLURM_NODE2"; do
    slurmd -D -N "$node" -f "$SLURM_CONF" >"$SLURM_DIR/slurmd-$node.out" 2>&1 &
    SLURM_PIDS+=($!)
    disown $!
  done
  for _ in $(seq 40); do
    slurm_up && [[ $(timeout 3 sinfo -h -o '%D') == 2 ]] && break
    sleep 0.5
  done
  if ! slurm_up; then
    cat "$SLURM_DIR"/*.out "$SLURM_DIR"/*.log 2>/dev/null | tail -20
    slurm_skip "the daemons did not bring 2 nodes up (sinfo: $(timeout 3 sinfo -h 2>&1 | tr '\n' ' '))"
  fi
  echo "slurm: 2 nodes up ($(timeout 3 sinfo -h -o '%N %t')) after $((SECONDS - t0)) s"
}
