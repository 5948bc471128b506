#!/usr/bin/env bash
# Rendezvous safety (docs/launcher.md, "Rendezvous and its security"), with real processes:
#  1. two jobs on one host with the same port: each succeeds or is refused clearly, and
#     never joins the other;
#  2. a rank of another job reaching the store is refused, naming both job ids;
#  3. a single-node store listens on loopback only (ss shows it bound to "lo");
#  4. a token: ranks without it, or with another one, are refused; a token file must be 0600;
#  5. multi-node launches (with a token) agree on a job id without --rdzv-id, and differing
#     --rdzv-id refuse;
#  6. the default port taken: lockstep-run picks a free one and prints it;
#  7. a single-node job whose MASTER_ADDR is the host's routable address (a one-pod
#     PyTorchJob) forms: the loopback binding applies to a loopback address only.
# usage: rendezvous_test.sh FAULT_PROGRAM LOCKSTEP_RUN BACKEND      (about 20 s)
set -u
prog=$1; run=$2; backend=$3
# Generous: the hand-made rank 0 waits for several rank-1 processes to start one after
# another (each about 1 s, more on a loaded machine); no case waits the timeout out.
export LOCKSTEP_BACKEND=$backend LOCKSTEP_TIMEOUT_S=20
unset MASTER_ADDR MASTER_PORT RANK WORLD_SIZE LOCAL_RANK LOCAL_WORLD_SIZE LOCKSTEP_JOB_ID \
  LOCKSTEP_RDZV_TOKEN LOCKSTEP_RDZV_TOKEN_FILE
tmp=$(mktemp -d); trap 'rm -rf "$tmp"; kill $(jobs -p) 2>/dev/null' EXIT
source "$(dirname "$0")/../lib/checks.sh"
tally_tag="[$backend]"

# A rank 0 of a hand-made 2-rank job on port $1 with job id $2 (more env: the rest), in the
# background, whose output goes to $tmp/r0; waits until its store listens.
start_rank0() {
  local p=$1 id=$2; shift 2
  env RANK=0 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p LOCKSTEP_JOB_ID=$id "$@" \
    "$prog" join >"$tmp/r0" 2>&1 &
  r0_pid=$!
  wait_until 5 listening "$p"
}
# Rank 1 of that job: rank1 NAME PORT ID [ENV...]; output in $tmp/NAME, exit code in $tmp/NAME.rc
rank1() {
  local name=$1 p=$2 id=$3; shift 3
  env RANK=1 WORLD_SIZE=2 MASTER_ADDR=127.0.0.1 MASTER_PORT=$p LOCKSTEP_JOB_ID=$id "$@" \
    "$prog" join >"$tmp/$name" 2>&1
  echo $? >"$tmp/$name.rc"
}
rc() { cat "$tmp/$1.rc"; }

# 1. Two jobs, same port, started together (3 trials).
for trial in 1 2 3; do
  p=$(free_port)
  "$run" --nproc-per-node 2 --master-port "$p" "$prog" join >"$tmp/a$trial" 2>&1 &
  pa=$!
  "$run" --nproc-per-node 2 --master-port "$p" "$prog" join >"$tmp/b$trial" 2>&1 &
  pb=$!
  wait $pa; ra=$?; wait $pb; rb=$?
  ok=1
  for j in a b; do
    rcj=$([ $j = a ] && echo $ra || echo $rb)
    if [ "$rcj" = 0 ]; then
      { has "$tmp/$j$trial" "rank 0 joined" && has "$tmp/$j$trial" "rank 1 joined"; } || ok=0
    elif ! { has "$tmp/$j$trial" "the port is in use" ||
      has "$tmp/$j$trial" "refused by the rendezvous store"; }; then
      ok=0
    fi
  done
  [ $ra = 0 ] || [ $rb = 0 ] || ok=0  # one of them gets the port
  if [ $ok = 1 ]; then
    pass "1. two jobs on port $p (trial $trial): exit codes $ra and $rb, the loser told why"
  else
    fail "1. two jobs on port $p (trial $trial): $ra $rb"; cat "$tmp/a$trial" "$tmp/b$trial"
  fi
done

# 2. + 3. + the right rank joining afterwards.
p=$(free_port)
start_rank0 "$p" jobA
if ! command -v ss >/dev/null; then
  echo "SKIP 3. ss is not installed: cannot see which device the store listens on"
elif ss -ltn | grep -q "%lo:$p "; then
  pass "3. single-node store bound to loopback: $(ss -ltn | grep ":$p " | awk '{print $4}')"
else
  fail "3. store not bound to loopback: $(ss -ltn | grep ":$p ")"
fi
rank1 other "$p" jobB
if [ "$(rc other)" != 0 ] && has "$tmp/other" "job 'jobA', this rank to job 'jobB'"; then
  pass "2. other job's rank refused: $(grep -o 'refused.*' "$tmp/other" | cut -c1-160)"
else
  fail "2. other job's rank: rc $(rc other): $(cat "$tmp/other")"
fi
rank1 own "$p" jobA
wait $r0_pid; r0=$?
if [ "$(rc own)" = 0 ] && [ $r0 = 0 ]; then
  pass "2. the job's own rank 1 still joins after the refusal"
else
  fail "2. own rank: rc $(rc own) / rank 0 $r0: $(cat "$tmp/own" "$tmp/r0")"
fi

# 4. Token.
p=$(free_port)
printf 'correct horse\n' >"$tmp/token"; chmod 600 "$tmp/token"
start_rank0 "$p" jobT LOCKSTEP_RDZV_TOKEN_FILE="$tmp/token"
rank1 none "$p" jobT
rank1 wrong "$p" jobT LOCKSTEP_RDZV_TOKEN=battery
rank1 right "$p" jobT LOCKSTEP_RDZV_TOKEN="correct horse"
wait $r0_pid; r0=$?
if [ "$(rc none)" != 0 ] && has "$tmp/none" "requires the job's token and this rank has none"; then
  pass "4. rank without the token refused"
else
  fail "4. rank without the token: rc $(rc none): $(cat "$tmp/none")"
fi
if [ "$(rc wrong)" != 0 ] && has "$tmp/wrong" "token differs from rank 0's"; then
  pass "4. rank with another token refused"
else
  fail "4. rank with another token: rc $(rc wrong): $(cat "$tmp/wrong")"
fi
if [ "$(rc right)" = 0 ] && [ $r0 = 0 ]; then
  pass "4. rank with the token joins (token from the environment, rank 0's from a 0600 file)"
else
  fail "4. rank with the token: rc $(rc right) / rank 0 $r0: $(cat "$tmp/right" "$tmp/r0")"
fi
chmod 644 "$tmp/token"
rank1 open "$(free_port)" jobT LOCKSTEP_RDZV_TOKEN_FILE="$tmp/token"
if [ "$(rc open)" != 0 ] && has "$tmp/open" "chmod 600"; then
  pass "4. a token file others can read is rejected"
else
  fail "4. token file 0644: rc $(rc open): $(cat "$tmp/open")"
fi

# 5. Two "nodes" on this host: the default job id is the same on both; --rdzv-id must match.
if [ "$backend" = gloo ]; then
  for ids in "same" "differ"; do
    p=$(free_port)
    id0=(); id1=()
    [ $ids = differ ] && id0=(--rdzv-id one) && id1=(--rdzv-id two)
    LOCKSTEP_RDZV_TOKEN=t5 "$run" --nnodes 2 --node-rank 0 --master-port "$p" "${id0[@]}" \
      "$prog" join >"$tmp/n0" 2>&1 &
    n0=$!
    LOCKSTEP_RDZV_TOKEN=t5 "$run" --nnodes 2 --node-rank 1 --master-port "$p" "${id1[@]}" \
      "$prog" join >"$tmp/n1" 2>&1
    r1=$?
    [ $ids = differ ] && kill $n0 2>/dev/null  # its rank 0 waits for a rank that never comes
    wait $n0; r0=$?
    if [ $ids = same ] && [ $r0 = 0 ] && [ $r1 = 0 ]; then
      pass "5. two nodes without --rdzv-id agree on the job id and join (with a token)"
    elif [ $ids = differ ] && [ $r1 != 0 ] && has "$tmp/n1" "job 'one', this rank to job 'two'"; then
      pass "5. a node with another --rdzv-id is refused, naming both"
    else
      fail "5. nodes ($ids): $r0 $r1: $(cat "$tmp/n0" "$tmp/n1")"
    fi
  done
fi

# 6. The default port (29500) taken: a free one is used and printed. Serialised with the
# other backend's run (ctest -j): two launches probing 29500 at the same instant can both
# find it free, and one then fails "port in use" (documented in docs/launcher.md).
exec 9>"${TMPDIR:-/tmp}/lockstep-rendezvous-test-29500.lock"
flock -w 60 9
python3 -c 'import socket,time
s=socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
try:
    s.bind(("0.0.0.0", 29500)); s.listen()
except OSError: pass  # already taken by someone else: just as good
time.sleep(30)' &
holder=$!
sleep 0.5
"$run" --nproc-per-node 2 "$prog" join >"$tmp/free" 2>&1
rfree=$?
kill $holder 2>/dev/null
flock -u 9
if [ $rfree = 0 ] && has "$tmp/free" "port 29500 is in use; rendezvous on free port"; then
  pass "6. $(grep -o 'port 29500 is in use.*' "$tmp/free")"
else
  fail "6. default port taken: rc $rfree: $(cat "$tmp/free")"
fi

# 7. One node, MASTER_ADDR the host's own routable address.
addr=$(hostname -I 2>/dev/null | awk '{print $1}')
if [ -z "$addr" ]; then
  echo "SKIP 7. this host has no address besides loopback"
elif "$run" --nproc-per-node 2 --master-addr "$addr" --master-port "$(free_port)" "$prog" join \
  >"$tmp/routable" 2>&1; then
  pass "7. one node with MASTER_ADDR=$addr (not loopback) forms its job"
else
  fail "7. one node with MASTER_ADDR=$addr: $(tail -3 "$tmp/routable")"
fi

finish
