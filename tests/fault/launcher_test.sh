#!/usr/bin/env bash
# Shell-level tests of lockstep-run: real processes, real signals.
# usage: tests/fault/launcher_test.sh path/to/lockstep-run     (about 10 s)
set -u
RUN=${1:?usage: $0 path/to/lockstep-run}
RUN=$(cd "$(dirname "$RUN")" && pwd)/$(basename "$RUN")
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/../lib/checks.sh"
# A sleep duration unique to this run, so the leftover-process check only sees our ranks.
MARK="30.$$"

no_rank_left() { ! pgrep -f "sleep $MARK" >/dev/null; }
# A SIGKILLed process may take a moment to vanish from the table.
no_leftovers() { wait_until 1 no_rank_left; }
now_ms() { date +%s%3N; }
run() {  # run NAME ARGS...: stdout/stderr to $TMP/NAME.out/.err, exit code to $TMP/NAME.rc
  local name=$1; shift
  "$RUN" "$@" >"$TMP/$name.out" 2>"$TMP/$name.err"
  echo $? >"$TMP/$name.rc"
}
rc_is() { [ "$(cat "$TMP/$1.rc")" = "$2" ]; }
rc_nonzero() { [ "$(cat "$TMP/$1.rc")" != 0 ]; }
show() { echo "--- $1 stdout:"; cat "$TMP/$1.out"; echo "--- $1 stderr:"; cat "$TMP/$1.err"; }

echo "(a) three ranks succeed, output prefixed, torchrun env set"
env -u OMP_NUM_THREADS "$RUN" --nproc-per-node 3 --master-port 0 --log-dir "$TMP/logs" sh -c \
  'echo hi from $RANK; echo "env $RANK $LOCAL_RANK $WORLD_SIZE $LOCAL_WORLD_SIZE $GROUP_RANK $MASTER_ADDR $MASTER_PORT $OMP_NUM_THREADS $LOCKSTEP_LAUNCHER"; echo "warn $RANK" >&2; printf "no newline $RANK"' \
  >"$TMP/a.out" 2>"$TMP/a.err"; echo $? >"$TMP/a.rc"
check "exit code 0" rc_is a 0
for r in 0 1 2; do
  check "stdout has '[rank $r] hi from $r'" has "$TMP/a.out" "[rank $r] hi from $r"
  check "stderr has '[rank $r] warn $r'" has "$TMP/a.err" "[rank $r] warn $r"
  check "partial last line of rank $r flushed" has "$TMP/a.out" "[rank $r] no newline $r"
  check "log file rank_$r.log has its output" has "$TMP/logs/rank_$r.log" "hi from $r"
done
check "RANK/LOCAL_RANK/WORLD_SIZE/LOCAL_WORLD_SIZE/GROUP_RANK/MASTER_ADDR set" has "$TMP/a.out" "env 2 2 3 3 0 127.0.0.1 "
check "MASTER_PORT non-zero with --master-port 0, OMP_NUM_THREADS=1" \
  grep -qE '^\[rank 1\] env 1 1 3 3 0 127\.0\.0\.1 [1-9][0-9]* 1 lockstep-run$' "$TMP/a.out"
check "one port for all ranks" [ "$(grep -oE 'env [0-9] [0-9] 3 3 0 127.0.0.1 [0-9]+' "$TMP/a.out" | awk '{print $8}' | sort -u | wc -l)" = 1 ]
check "OMP_NUM_THREADS note printed" has "$TMP/a.err" "OMP_NUM_THREADS=1"
rc_is a 0 || show a

echo "(b) rank 1 is SIGKILLed while the others sleep: group torn down fast"
t0=$(now_ms)
run b --nproc-per-node 3 --grace-seconds 2 --notice-seconds 0.5 sh -c \
  "if [ \$RANK = 1 ]; then sleep 0.5; echo 'about to die' >&2; kill -9 \$\$; fi; sleep $MARK"
t1=$(now_ms)
check "exit code 137 (128+9)" rc_is b 137
check "finished within 4 s (took $((t1 - t0)) ms)" [ $((t1 - t0)) -lt 4000 ]
check "summary names rank 1 and SIGKILL" has "$TMP/b.err" "rank 1 (local rank 1, pid"
check "summary says 'killed by signal 9 (SIGKILL)'" has "$TMP/b.err" "failed first: killed by signal 9 (SIGKILL)"
check "summary shows rank 1's last stderr line" has "$TMP/b.err" "    about to die"
check "other ranks reported as stopped" has "$TMP/b.err" "stopped by lockstep-run with SIGTERM"
check "no leftover rank processes" no_leftovers
rc_is b 137 || show b

echo "(b2) a rank that ignores SIGTERM is SIGKILLed after --grace-seconds"
t0=$(now_ms)
run b2 --nproc-per-node 2 --grace-seconds 1 --notice-seconds 0 sh -c \
  "if [ \$RANK = 0 ]; then sleep 0.5; exit 5; fi; trap '' TERM; sleep $MARK"
t1=$(now_ms)
check "exit code 5" rc_is b2 5
check "took about the grace period ($((t1 - t0)) ms)" [ $((t1 - t0)) -ge 900 -a $((t1 - t0)) -lt 3500 ]
check "summary says SIGKILL after grace" has "$TMP/b2.err" "stopped by lockstep-run with SIGKILL"
check "no leftover rank processes" no_leftovers

echo "(c) rank 2 exits 3 with a message on stderr"
run c --nproc-per-node 3 --grace-seconds 2 --notice-seconds 0.5 sh -c \
  "if [ \$RANK = 2 ]; then echo 'fatal: bad learning rate' >&2; exit 3; fi; sleep $MARK"
check "exit code 3" rc_is c 3
check "summary names rank 2 and code 3" has "$TMP/c.err" "rank 2 (local rank 2, pid"
check "summary says 'exited with code 3'" has "$TMP/c.err" "failed first: exited with code 3"
check "summary contains the message" has "$TMP/c.err" "    fatal: bad learning rate"
check "no leftover rank processes" no_leftovers
rc_is c 3 || show c

echo "(c2) error files: the first failure's message is printed, others' one line each"
t0=$(now_ms)
run c2 --nproc-per-node 3 --grace-seconds 1 --notice-seconds 2 sh -c '
  [ "$LOCKSTEP_ERROR_FILE" = "$TORCHELASTIC_ERROR_FILE" ] || echo "error file vars differ" >&2
  case $RANK in
    1) sleep 0.3; printf "ValueError: bad batch\nsecond line\n" >"$LOCKSTEP_ERROR_FILE"; exit 4;;
    0) sleep 1; echo "peer gone: rank 1 exited" >"$LOCKSTEP_ERROR_FILE"; exit 3;;
    *) sleep '"$MARK"';;
  esac'
t1=$(now_ms)
check "exit code 4 (rank 1's)" rc_is c2 4
check "rank 1 failed first" has "$TMP/c2.err" "rank 1 (local rank 1, pid"
check "its error file is printed" has "$TMP/c2.err" "lockstep-run: error reported by rank 1:"
check "  ... every line of it" has "$TMP/c2.err" "    second line"
check "rank 0 exited by itself within the notice period" has "$TMP/c2.err" "exited with code 3"
check "  ... and its error is listed" has "$TMP/c2.err" "        error: peer gone: rank 1 exited"
check "rank 2 got SIGTERM after the notice period" has "$TMP/c2.err" "stopped by lockstep-run with SIGTERM"
check "took the notice period, not more (took $((t1 - t0)) ms)" [ $((t1 - t0)) -ge 2000 -a $((t1 - t0)) -lt 4500 ]
check "same path in LOCKSTEP_ERROR_FILE and TORCHELASTIC_ERROR_FILE" not_has "$TMP/c2.err" "error file vars differ"
check "no leftover rank processes" no_leftovers
rc_is c2 4 || show c2
run c3 --nproc-per-node 2 --grace-seconds 1 --notice-seconds 0.5 sh -c '
  if [ $RANK = 0 ]; then
    printf "{\"message\": {\"message\": \"RuntimeError: from @record\", \"extraInfo\": {\"timestamp\": \"1\"}}}" >"$TORCHELASTIC_ERROR_FILE"
    exit 1
  fi; sleep '"$MARK"
check "torchelastic's JSON error file: its message is printed" has "$TMP/c3.err" "    RuntimeError: from @record"
check "no leftover rank processes" no_leftovers

echo "(c4) a rank stopped by SIGSTOP: the summary says so when a peer fails for it"
run c4 --nproc-per-node 2 --grace-seconds 1 --notice-seconds 0.5 sh -c \
  "if [ \$RANK = 1 ]; then kill -STOP \$\$; fi; sleep 1; exit 3"
check "exit code 3" rc_is c4 3
check "note names rank 1 and SIGSTOP" has "$TMP/c4.err" "note: rank 1 was stopped by SIGSTOP"
check "the stopped rank is ended (SIGTERM + SIGCONT)" has "$TMP/c4.err" "rank 1 (pid"
check "no leftover rank processes" no_leftovers
rc_is c4 3 || show c4

echo "(d) a program that cannot be executed"
run d --nproc-per-node 2 /nonexistent/lockstep-prog
check "exit code 127" rc_is d 127
check "clear error naming the program" has "$TMP/d.err" "lockstep-run: cannot execute '/nonexistent/lockstep-prog': No such file or directory"
run d2 "$TMP"
check "a directory: non-zero, named" rc_nonzero d2
check "  ... message" has "$TMP/d2.err" "cannot execute '$TMP': Permission denied"

echo "(e) --max-restarts 2: fails on the first start, succeeds on the restart"
run e --nproc-per-node 2 --max-restarts 2 --grace-seconds 1 sh -c \
  'if [ "$LOCKSTEP_RESTART_COUNT" -lt 1 ]; then [ $RANK = 1 ] && exit 1; sleep 5; fi; echo "ok $RANK restart $LOCKSTEP_RESTART_COUNT $TORCHELASTIC_RESTART_COUNT"'
check "exit code 0" rc_is e 0
check "restart announced" has "$TMP/e.err" "restarting all 2 ranks (restart 1 of 2)"
check "rank 0 ran again with restart count 1" has "$TMP/e.out" "[rank 0] ok 0 restart 1 1"
check "rank 1 ran again with restart count 1" has "$TMP/e.out" "[rank 1] ok 1 restart 1 1"
rc_is e 0 || show e
run e2 --max-restarts 1 sh -c 'echo "start $LOCKSTEP_RESTART_COUNT"; exit 4'
check "always failing: gives up with its exit code 4" rc_is e2 4
check "  ... after 2 starts" has "$TMP/e2.out" "[rank 0] start 1"

echo "(f) SIGINT to the launcher stops every rank, exit 130"
"$RUN" --nproc-per-node 2 --grace-seconds 2 sh -c "echo started \$RANK; sleep $MARK" >"$TMP/f.out" 2>"$TMP/f.err" &
pid=$!
both_started() { [ "$(grep -c started "$TMP/f.out")" = 2 ]; }
wait_until 5 both_started
t0=$(now_ms)
kill -INT $pid
wait $pid; echo $? >"$TMP/f.rc"
t1=$(now_ms)
check "exit code 130" rc_is f 130
check "stopped within 3 s ($((t1 - t0)) ms)" [ $((t1 - t0)) -lt 3000 ]
check "says it was interrupted" has "$TMP/f.err" "interrupted by SIGINT"
check "no leftover rank processes" no_leftovers
"$RUN" sh -c "sleep $MARK" >/dev/null 2>&1 &
pid=$!; sleep 0.3; kill -TERM $pid; wait $pid; echo $? >"$TMP/f2.rc"
check "SIGTERM to the launcher: exit 143" rc_is f2 143

echo "(g) bad flags exit 2 with a message naming the flag"
run g --nproc-per-nod 2 true
check "unknown flag: exit 2" rc_is g 2
check "  ... message names it" has "$TMP/g.err" "'--nproc-per-nod'"
run g2 --nproc-per-node two true
check "bad value: exit 2" rc_is g2 2
check "  ... message names flag and value" has "$TMP/g2.err" "--nproc-per-node expects a positive integer, got 'two'"
run g3 --nnodes 2 --master-port 0 true
check "--master-port 0 with --nnodes 2: exit 2" rc_is g3 2
run h --help
check "--help: exit 0 with usage" has "$TMP/h.out" "usage: lockstep-run"

finish
