#!/usr/bin/env bash
# MPI across hosts with a hostfile, as the MPI Operator runs a job (docs/schedulers.md, "MPI
# across hosts: hostfile"): 2 namespace hosts (netns.sh) and `mpirun --hostfile` on host 1
# with "host1 slots=2" and "host2 slots=2"; host 2's orted is started by an rsh agent
# (--mca plm_rsh_agent) that enters host 2's namespaces where the operator's ssh would log in.
#  1. the hostfile places 2 ranks on each host (mpirun ... hostname);
#  2. collectives_check forms one job of 4 ranks on BACKEND: mpi (MPI itself), or gloo / hier
#     bootstrapped under mpirun (rank, size and local rank from OMPI_COMM_WORLD_*, rank 0's
#     store address broadcast over MPI: no MASTER_ADDR), and its traffic crossed host 2's
#     link.
# Skipped (77) with the reason without root, namespaces or mpirun.
# usage: mpi_hostfile_test.sh BACKEND COLLECTIVES_CHECK                    (20-40 s)
set -u
backend=$1; check=$2
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=netns.sh
source "$here/netns.sh"
# shellcheck source=../lib/checks.sh
source "$here/../lib/checks.sh"
mh_require
command -v "${MPIRUN:-mpirun}" >/dev/null ||
  { echo "SKIP: '${MPIRUN:-mpirun}' is not installed (OpenMPI's mpirun)"; exit 77; }
per=2
world=$((2 * per))
tally_tag="[mpirun --hostfile, $backend]"
show() { sed 's/^/    | /' "$1" | tail -"${2:-30}"; }
# Nothing of the caller's launcher leaks in: what the ranks get comes from mpirun's -x.
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_JOB_ID \
  LOCKSTEP_BACKEND LOCKSTEP_LAUNCHER LOCKSTEP_RDZV_TOKEN LOCKSTEP_RDZV_TOKEN_FILE
export LOCKSTEP_TIMEOUT_S=${LOCKSTEP_TIMEOUT_S:-60}

mh_setup 2 || { fail "could not set up 2 hosts"; finish; }

# 1. Where the hostfile puts the ranks.
out=$MH_DIR/hostname.out
MH_MPI_TIMEOUT=60 mh_mpirun_hostfile $per hostname >"$out" 2>&1
rc=$?
placed=$(sort "$out" | uniq -c | awk '{printf "%s:%s ", $2, $1}')
if [[ $rc == 0 && $placed == "host1:2 host2:2 " ]]; then
  pass "hostfile '$(paste -sd, "$MH_DIR/hostfile")' placed the ranks $placed"
else
  fail "mpirun --hostfile hostname: rc $rc, placed '$placed' (want host1:2 host2:2)"
  show "$out"
  finish
fi

# 2. One job of 4 ranks across the hosts.
# Only LOCKSTEP_*: OpenMPI hands a remote rank nothing of mpirun's environment but OMPI_*
# and what -x names. No MASTER_ADDR / MASTER_PORT: under mpirun rank 0's store address
# travels over MPI (docs/mpi.md), and is rank 0's host name across hosts.
env=(-x LOCKSTEP_BACKEND="$backend" -x LOCKSTEP_TIMEOUT_S)
out=$MH_DIR/collectives.out
rx0=$(mh_rx_bytes 2)
t0=$SECONDS
MH_MPI_TIMEOUT=150 mh_mpirun_hostfile $per "${env[@]}" "$check" >"$out" 2>&1
rc=$?
echo "collectives_check, mpirun --hostfile, $backend, 2 hosts x $per ranks: $((SECONDS - t0)) s"
if [[ $rc == 0 ]]; then pass "mpirun exit 0"; else fail "mpirun exit $rc"; fi
ok=1
for ((r = 0; r < world; r++)); do
  grep -qE "rank $r/$world \[$backend\]: [0-9]+ passed, 0 failed" "$out" ||
    { fail "rank $r did not report '[$backend]: N passed, 0 failed'"; ok=0; }
done
((ok)) && pass "all $world ranks: $(grep -m1 -o "rank 0/$world .*" "$out")"
if grep -q "lockstep: launched by OpenMPI/PMIx (.*): rank 0 of $world, local rank 0 of $per" "$out"; then
  pass "init() read OpenMPI's contract: $(grep -m1 -o 'rank 0 of .*' "$out")"
else
  fail "no 'lockstep: launched by OpenMPI/PMIx ...: rank 0 of $world, local rank 0 of $per' line"
fi
mh_crossed "$rx0" 2 host2 hosts
((failures == 0)) || show "$out"
finish
