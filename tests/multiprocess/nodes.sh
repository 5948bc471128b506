#!/usr/bin/env bash
# nodes.sh RUN NNODES NPROC PROG [ARGS...]: one job of NNODES "nodes" on this host, each
# node its own `lockstep-run --nnodes NNODES --node-rank i --nproc-per-node NPROC`, as on
# separate machines: the launchers give each rank its node's LOCAL_RANK and
# LOCAL_WORLD_SIZE, so the job is multi-node to lockstep (the hier backend groups ranks by
# node as the launchers number them). Every node's output goes to stdout, prefixed by the
# launcher. Exits 0 if every launcher does, else with the first failure's status.
# Multi-host tests proper (network namespaces, one host per node): tests/multihost/.
set -u
run=$1 nnodes=$2 nproc=$3
shift 3
# A free port, chosen by the kernel; another program could take it before rank 0 binds it
# (then the job fails naming the port: rerun).
port=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
pids=()
for ((i = 0; i < nnodes; i++)); do
  "$run" --nnodes "$nnodes" --node-rank "$i" --nproc-per-node "$nproc" --master-addr 127.0.0.1 \
    --master-port "$port" --rdzv-id "nodes-$$" "$@" &
  pids+=($!)
done
status=0
for p in "${pids[@]}"; do
  wait "$p"
  rc=$?
  [ $status = 0 ] && status=$rc
done
exit $status
