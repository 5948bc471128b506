#!/usr/bin/env bash
# Schedulers benchmark: one job of 2 nodes x 2 ranks (fault_program die-in-loop: 1 MiB
# allreduces, gloo, on loopback) started three ways:
#   srun       srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1 (a task per rank) under a
#              real Slurm: tests/multihost/slurm_cluster.sh (slurmctld + 2 slurmd -N here);
#   srun+run   srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 lockstep-run
#              --nproc-per-node 2 (a launcher per node);
#   by hand    2 lockstep-run --nnodes 2 --node-rank I --nproc-per-node 2 --master-addr
#              127.0.0.1 (no Slurm), the reference of the ratios.
# In every run rank 3 SIGKILLs itself right after its first step (before iteration 1),
# noting the wall-clock time in a death file. Figures (medians over ROUNDS, interleaved):
#   start -> first step   the launch command started .. the death (the first step done)
#   death -> end          the death .. the launch command (both, by hand) exited
# usage: bench/schedulers.sh [BUILD_DIR]   (root; Debian's slurmctld, slurmd, slurm-client)
# env:   ROUNDS=3                                                     docs/benchmarks.md
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$(cd "${1:-$here/../build}" && pwd)
prog=$build/tests/fault/fault_program
run=$build/apps/lockstep-run
ROUNDS=${ROUNDS:-3}
for f in "$prog" "$run"; do
  [[ -x $f ]] || { echo "bench/schedulers.sh: $f not built (--target fault_program lockstep-run)"; exit 2; }
done
# shellcheck source=../tests/multihost/slurm_cluster.sh
source "$here/../tests/multihost/slurm_cluster.sh"
slurm_require
slurm_start
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_LAUNCHER \
  LOCKSTEP_JOB_ID GROUP_RANK GROUP_WORLD_SIZE
export LOCKSTEP_BACKEND=gloo LOCKSTEP_TIMEOUT_S=60
now() { date +%s.%N; }
loop=("$prog" die-in-loop --victim 3 --signal KILL --at 1)

# launch CONFIG DEATH_FILE OUT: the job, started the CONFIG way; returns when it ended.
launch() {
  local config=$1 death=$2 out=$3 port pids=() p
  case $config in
    srun)
      timeout 120 srun -N2 --ntasks-per-node=2 --kill-on-bad-exit=1 "${loop[@]}" \
        --death-file "$death" >"$out" 2>&1 ;;
    srun+run)
      timeout 120 srun -N2 --ntasks-per-node=1 --kill-on-bad-exit=1 "$run" --nproc-per-node 2 \
        "${loop[@]}" --death-file "$death" >"$out" 2>&1 ;;
    by-hand)
      port=$(slurm_port)
      for node in 0 1; do
        timeout 120 "$run" --nnodes 2 --node-rank $node --nproc-per-node 2 --master-addr 127.0.0.1 \
          --master-port "$port" --rdzv-id "bench$$" "${loop[@]}" --death-file "$death" \
          >"$out.$node" 2>&1 &
        pids+=($!)
      done
      for p in "${pids[@]}"; do wait "$p"; done
      cat "$out".? >"$out" ;;
  esac
}

configs=(by-hand srun srun+run)
declare -A first end
echo "2 nodes x 2 ranks on loopback, gloo; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
for ((round = 1; round <= ROUNDS; round++)); do
  for c in "${configs[@]}"; do
    death=$SLURM_DIR/death.$c.$round out=$SLURM_DIR/$c.$round.out
    rm -f "$death"
    t0=$(now)
    launch "$c" "$death" "$out"
    t1=$(now)
    if [[ ! -s $death ]] || ! grep -q "caught CommError.*peer rank 3" "$out"; then
      echo "round $round $c: no death, or no survivor named rank 3:"; tail -15 "$out"
      continue
    fi
    d=$(cat "$death")
    first[$c]+=" $(echo "$d - $t0" | bc)"
    end[$c]+=" $(echo "$t1 - $d" | bc)"
    printf 'round %d %-9s start -> first step %6.2f s   death -> end %5.2f s\n' "$round" "$c" \
      "$(echo "$d - $t0" | bc)" "$(echo "$t1 - $d" | bc)"
  done
done
median() { tr ' ' '\n' | grep . | sort -g | awk '{v[NR]=$1} END {if (NR == 0) print "nan";
  else if (NR % 2) print v[(NR + 1) / 2]; else print (v[NR / 2] + v[NR / 2 + 1]) / 2}'; }
echo
printf '%-9s %20s %7s %16s %7s\n' config "start->first step s" ratio "death->end s" ratio
b1=$(echo "${first[by-hand]:-}" | median) b2=$(echo "${end[by-hand]:-}" | median)
for c in "${configs[@]}"; do
  f=$(echo "${first[$c]:-}" | median) e=$(echo "${end[$c]:-}" | median)
  printf '%-9s %20.2f %6.2fx %16.2f %6.2fx\n' "$c" "$f" "$(echo "$f / $b1" | bc -l)" "$e" \
    "$(echo "$e / $b2" | bc -l)"
done
echo "medians over $ROUNDS rounds; ratios against by-hand; load $(cut -d' ' -f1-3 /proc/loadavg)"
