#!/usr/bin/env bash
# Time-to-quality across thin links (driven by `lockstep-bench thin-links`, which reads what
# this leaves in OUT): 2 "hosts" (network namespaces, tests/multihost/netns.sh), one rank
# each, their links shaped to each RATE; the CTSM job of bench/thin-links.toml trained once
# per METHOD with eval.every_steps, one lockstep-run per host. OUT/methods.txt lists the
# labels; per run, OUT/RATE/LABEL/ holds the trainer's summary.json and metrics/eval.csv, and
# wire.json the bytes each host sent and received (its link's counters) and the job's wall
# time. Needs root (ip netns): exits 77 (skip) without.
#
# usage: bench/thin_links.sh BUILD_DIR OUT
# env:   RATES="1gbit 100mbit 10mbit"  DELAY=1ms  EVAL_EVERY=31  EXTRA="--set k=v ..."
#        ONLY="LABEL LABEL ..." (methods of the catalog below; default: its first six)
#        METHODS="LABEL=KEY=VALUE,KEY=VALUE ..." (methods of your own, instead of ONLY)
set -u
here=$(cd "$(dirname "$0")" && pwd)
build=$1 out=$2
run=$build/apps/lockstep-run
train=$build/apps/lockstep-train/lockstep-train
cfg=$here/thin-links.toml
RATES=${RATES:-1gbit 100mbit 10mbit} DELAY=${DELAY:-1ms} EVAL_EVERY=${EVAL_EVERY:-31}
EXTRA=${EXTRA:-}
# The catalog: label=config keys. The first six are the default set of docs/thin-links.md;
# the "-m0.5" ones take the outer momentum that did best with 2 replicas (its "Long job").
CATALOG="ddp-fp32=strategy.kind=ddp
ddp-qsgd4=strategy.kind=ddp,strategy.comm_hook=qsgd
ddp-powersgd4=strategy.kind=ddp,strategy.comm_hook=powersgd,strategy.powersgd_rank=4,strategy.powersgd_start_iter=10
diloco-h10=strategy.kind=diloco,strategy.diloco_inner_steps=10
diloco-h50=strategy.kind=diloco,strategy.diloco_inner_steps=50
streaming-h50-4bit=strategy.kind=diloco,strategy.diloco_inner_steps=50,strategy.diloco_fragments=5,strategy.diloco_overlap_steps=5,strategy.diloco_mixing=0.5,strategy.diloco_compression=qsgd
diloco-h100-m0.5=strategy.kind=diloco,strategy.diloco_inner_steps=100,strategy.diloco_outer_momentum=0.5
diloco-h50-m0.5-4bit=strategy.kind=diloco,strategy.diloco_inner_steps=50,strategy.diloco_outer_momentum=0.5,strategy.diloco_compression=qsgd"
ONLY=${ONLY:-ddp-fp32 ddp-qsgd4 ddp-powersgd4 diloco-h10 diloco-h50 streaming-h50-4bit}
if [[ -z ${METHODS:-} ]]; then
  for label in $ONLY; do
    line=$(grep -m1 "^$label=" <<<"$CATALOG") ||
      { echo "thin_links.sh: no method '$label'; the catalog has: $(cut -d= -f1 <<<"$CATALOG" | xargs)"; exit 2; }
    METHODS+="$line"$'\n'
  done
fi
for f in "$run" "$train"; do
  [[ -x $f ]] || { echo "thin_links.sh: $f not built"; exit 2; }
done
# shellcheck source=../tests/multihost/netns.sh
source "$here/../tests/multihost/netns.sh"
mh_require
mkdir -p "$out"
echo "== data (once, shared by every run)"
"$train" "$cfg" --generate-only --set data.dir="$out/data" > "$out/generate.log" 2>&1 ||
  { cat "$out/generate.log"; exit 1; }
mh_setup 2 || exit 1
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_JOB_ID
export LOCKSTEP_TIMEOUT_S=600

# sent I / received I: the bytes host I's link carried so far from / to host I (the
# counters of the link's root end, where the host's sending is received).
sent() { cat "/sys/class/net/$(mh_veth "$1")/statistics/rx_bytes"; }
received() { cat "/sys/class/net/$(mh_veth "$1")/statistics/tx_bytes"; }

unshape() {
  local i
  for i in 1 2; do
    tc -n "$(mh_ns "$i")" qdisc del dev "$MH_IF" root 2>/dev/null
    tc qdisc del dev "$(mh_veth "$i")" root 2>/dev/null
  done
}

while read -r m; do [[ -n $m ]] && echo "${m%%=*}"; done <<<"$METHODS" > "$out/methods.txt"
job=0
for rate in $RATES; do
  unshape
  mh_shape "$rate" "$DELAY" || exit 1
  while read -r m; do
    [[ -z $m ]] && continue
    label=${m%%=*}
    IFS=, read -r -a keys <<<"${m#*=}"
    sets=()
    for k in "${keys[@]}"; do sets+=(--set "$k"); done
    dir=$out/$rate/$label
    rm -rf "$dir" && mkdir -p "$dir"
    job=$((job + 1))
    s1=$(sent 1) s2=$(sent 2) r1=$(received 1) r2=$(received 2) t0=$(date +%s.%N)
    pids=()
    for i in 1 2; do
      # shellcheck disable=SC2086
      mh_exec "$i" "$run" --nnodes 2 --node-rank $((i - 1)) --nproc-per-node 1 \
        --master-addr "$(mh_ip 1)" --master-port 29500 --rdzv-id "thin$$-$job" \
        "$train" "$cfg" --set run.out_dir="$dir" --set data.dir="$out/data" \
        --set log.progress=false --set eval.every_steps="$EVAL_EVERY" "${sets[@]}" $EXTRA \
        > "$dir/host$i.log" 2>&1 &
      pids+=($!)
    done
    ok=1
    for p in "${pids[@]}"; do wait "$p" || ok=0; done
    t1=$(date +%s.%N)
    printf '{"rate": "%s", "method": "%s", "ok": %s, "host_sent": [%s, %s], "host_received": [%s, %s], "wall_s": %s}\n' \
      "$rate" "$label" "$([[ $ok == 1 ]] && echo true || echo false)" \
      $(($(sent 1) - s1)) $(($(sent 2) - s2)) $(($(received 1) - r1)) $(($(received 2) - r2)) \
      "$(echo "$t1 - $t0" | bc)" > "$dir/wire.json"
    echo "$rate $label: $([[ $ok == 1 ]] && echo done || echo FAILED) in $(echo "$t1 - $t0" | bc | cut -c1-6) s"
    [[ $ok == 1 ]] || tail -5 "$dir/host1.log" "$dir/host2.log"
  done <<<"$METHODS"
done
