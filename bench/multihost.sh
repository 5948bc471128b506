#!/usr/bin/env bash
# Multi-host benchmark: 2 "hosts" (network namespaces, tests/multihost/netns.sh) x 2 ranks,
# their links shaped to RATE (tbf; plus a netem DELAY where the kernel has sch_netem), one
# `lockstep-run --nnodes 2` per host running lockstep-bench's workers:
#   - `lockstep-bench collectives --worker --impls IMPL --sizes SIZE`: allreduce (and
#     allgather, reduce_scatter) per implementation;
#   - `lockstep-bench ddp --worker --backend B`: the DDP step of the 21M-parameter MLP;
#   - `lockstep-bench fsdp --worker --strategy full_shard [FLAGS]`: the FSDP step of the
#     benchmark's transformer (FSDP_SHAPE), plain and with ZeRO++'s compression (FSDP).
# Prints each figure and the ratio to flat gloo. Needs root (ip netns); docs/benchmarks.md.
#
# usage: bench/multihost.sh [BUILD_DIR]          (BUILD_DIR built with LOCKSTEP_BUILD_BENCH=ON)
# env:   RATE=1gbit DELAY=0.2ms SIZES=64MiB STEPS=10 WARMUP=2
#        COLL="gloo"   collectives configs, each LABEL=IMPL[+ENV=VALUE...] or IMPL
#        DDP="gloo"    DDP configs, each LABEL=BACKEND[+ENV=VALUE...] or BACKEND
#   e.g. COLL="gloo hier hier-qsgd4=hier+LOCKSTEP_HIER_COMPRESS=qsgd4" (the first is the base)
#        FSDP=""      FSDP configs, each LABEL or LABEL=FLAG,FLAG,... (worker flags), e.g.
#          FSDP="fp32 q=--gather-bits=8,--reduce-bits=4 q-hpz=--gather-bits=8,--reduce-bits=4,--hpz"
#        FSDP_SHAPE="--d-model 512 --layers 4 --seq 64 --batch 2"  FSDP_BACKEND=gloo
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=${1:-$here/../build}
bench=$build/bench/lockstep-bench
run=$build/apps/lockstep-run
RATE=${RATE:-1gbit} DELAY=${DELAY:-0.2ms} SIZES=${SIZES:-64MiB} STEPS=${STEPS:-10}
WARMUP=${WARMUP:-2} COLL=${COLL:-gloo} DDP=${DDP:-gloo} FSDP=${FSDP:-}
FSDP_SHAPE=${FSDP_SHAPE:---d-model 512 --layers 4 --seq 64 --batch 2} FSDP_BACKEND=${FSDP_BACKEND:-gloo}
for f in "$bench" "$run"; do
  [[ -x $f ]] || { echo "bench/multihost.sh: $f not built (cmake -DLOCKSTEP_BUILD_BENCH=ON)"; exit 2; }
done
# shellcheck source=../tests/multihost/netns.sh
source "$here/../tests/multihost/netns.sh"
mh_require
mh_setup 2 || exit 1
mh_shape "$RATE" "$DELAY" || exit 1
shaping="tbf $RATE"
[[ $MH_NETEM == 1 ]] && shaping="$shaping + netem $DELAY"
echo "2 hosts x 2 ranks, each host's link: $shaping; $(nproc) cores, load $(cut -d' ' -f1-3 /proc/loadavg)"
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_JOB_ID
export LOCKSTEP_TIMEOUT_S=300

# run_job NAME ENV... -- ARGS...: one lockstep-run per host; host 1's output in
# $MH_DIR/NAME. A failed job is shown and run again (up to 3 tries): a rare spurious gloo
# timeout on slow links (see docs/benchmarks.md) must not lose the figures.
job=0
run_once() {
  local name=$1 i pids=() ok=0
  job=$((job + 1))
  for i in 1 2; do
    mh_exec "$i" env "${envs_[@]}" "$run" --nnodes 2 --node-rank $((i - 1)) --nproc-per-node 2 \
      --master-addr "$(mh_ip 1)" --master-port 29500 --rdzv-id "bench$$-$job" "$bench" \
      "${args_[@]}" >"$MH_DIR/$name.host$i" 2>&1 &
    pids+=($!)
  done
  for i in "${pids[@]}"; do wait "$i" || ok=1; done
  cp "$MH_DIR/$name.host1" "$MH_DIR/$name"
  return $ok
}
run_job() {
  local name=$1 try
  shift
  envs_=()
  while [[ $1 != -- ]]; do envs_+=("$1"); shift; done
  shift
  args_=("$@")
  for try in 1 2 3; do
    run_once "$name" && return 0
    echo "  $name: the job failed (try $try of 3):"
    grep -h -m2 -E "lockstep-bench: |failed first" "$MH_DIR/$name.host1" "$MH_DIR/$name.host2" |
      cut -c1-240 | sed 's/^/    /'
  done
  return 1
}

# split CONFIG: sets label, what (impl or backend) and envs (array).
split_config() {
  local c=$1 rest
  label=${c%%=*}
  rest=${c#*=}
  [[ $c == *=* ]] || rest=$c
  IFS=+ read -r -a parts <<<"$rest"
  what=${parts[0]}
  envs=("${parts[@]:1}")
}

ratio() { [[ -n $1 && -n $2 ]] && echo "scale=2; $1 / $2" | bc; }

echo
echo "allreduce, $SIZES, float32 (median ms; ratio = flat gloo / this)"
base=""
for c in $COLL; do
  split_config "$c"
  # The control group (timing, checks) is gloo; IMPL is the group measured.
  run_job "coll-$label" LOCKSTEP_BACKEND=gloo "${envs[@]}" -- collectives --worker \
    --sizes "$SIZES" --impls "$what" || continue
  ms=$(grep -E "\] $what +allreduce " "$MH_DIR/coll-$label" | awk '{for (i=1;i<=NF;i++) if ($i=="ms") print $(i-1)}' | tail -1)
  [[ -z $base ]] && base=$ms
  printf '  %-20s %10s ms   x%s\n' "$label" "$ms" "$(ratio "$base" "$ms")"
  grep -E "\] $what +(allgather|reduce_scatter) " "$MH_DIR/coll-$label" | sed 's/^\[rank 0\]/   /'
done

echo
echo "DDP step, MLP 1024-4096-4096-10 (21M parameters), batch 64 per rank, $STEPS steps (median s)"
base=""
for c in $DDP; do
  split_config "$c"
  run_job "ddp-$label" LOCKSTEP_BACKEND="$what" "${envs[@]}" -- ddp --worker --backend "$what" \
    --steps "$STEPS" --warmup "$WARMUP" || continue
  s=$(grep -o 'RESULT step [0-9.]*' "$MH_DIR/ddp-$label" | awk '{print $3}')
  exposed=$(grep -o 'RESULT exposed_comm [0-9.]*' "$MH_DIR/ddp-$label" | awk '{print $3}')
  verified=$(grep -o 'RESULT verified [0-9.]*' "$MH_DIR/ddp-$label" | awk '{print $3}')
  [[ -z $base ]] && base=$s
  printf '  %-20s step %8s s  exposed comm %8s s  replicas equal %s   x%s\n' "$label" "$s" \
    "$exposed" "$verified" "$(ratio "$base" "$s")"
done

[[ -z $FSDP ]] && exit 0
echo
echo "FSDP full_shard step, transformer $FSDP_SHAPE, $FSDP_BACKEND, $STEPS steps (median s;"
echo "x = first config's step / this; bytes = FSDP's uncompressed / sent; link MB = what host 1's"
echo "link carried out of it over the whole job, init and warm-up included)"
base=""
for c in $FSDP; do
  label=${c%%=*} flags=""
  [[ $c == *=* ]] && flags=${c#*=}
  IFS=, read -r -a fl <<<"$flags"
  # shellcheck disable=SC2086 # FSDP_SHAPE is a list of flags
  link0=$(cat "/sys/class/net/$(mh_veth 1)/statistics/rx_bytes")
  run_job "fsdp-$label" LOCKSTEP_BACKEND="$FSDP_BACKEND" -- fsdp --worker --strategy full_shard \
    $FSDP_SHAPE --steps "$STEPS" --warmup "$WARMUP" "${fl[@]}" || continue
  get() { grep -o "RESULT $1 [-0-9.e+]*" "$MH_DIR/fsdp-$label" | awk '{print $3}'; }
  s=$(get step)
  link=$((($(cat "/sys/class/net/$(mh_veth 1)/statistics/rx_bytes") - link0) / 1000000))
  [[ -z $base ]] && base=$s
  printf '  %-10s step %8s s  bytes x%-5s link %5s MB  loss %s -> %s  equal %s   x%s\n' "$label" \
    "$s" "$(get traffic_ratio)" "$link" "$(get loss_first)" "$(get loss_last)" "$(get verified)" \
    "$(ratio "$base" "$s")"
done
