# shellcheck shell=bash
# The shell tests' tally and small helpers (sourced by tests/fault/*.sh and
# tests/multihost/*_test.sh; docs/development.md, "Tests"): one line per check, PASS or
# FAIL, then "N passed, M failed", and the exit status of `finish`. The shell counterpart of
# tests/multiprocess/tally.h.
#   tally_tag   printed after PASS/FAIL on every line ("[shm]"); set it after sourcing
#   on_fail     if the script defines it, called after each FAIL line (to show output)
passes=0
failures=0
tally_tag=""

tally_pass() { echo "PASS${tally_tag:+ $tally_tag} $*"; passes=$((passes + 1)); }
tally_fail() {
  echo "FAIL${tally_tag:+ $tally_tag} $*"
  failures=$((failures + 1))
  if declare -F on_fail >/dev/null; then on_fail; fi
  return 0
}
# pass / fail MESSAGE: a script may redefine them around tally_pass / tally_fail.
pass() { tally_pass "$@"; }
fail() { tally_fail "$@"; }
# check WHAT COMMAND...: PASS WHAT if COMMAND succeeds, else FAIL WHAT.
check() { if "${@:2}"; then pass "$1"; else fail "$1"; fi; }
# finish: the summary line; exits 0 when nothing failed, else 1.
finish() {
  echo "$passes passed, $failures failed"
  [[ $failures == 0 ]] && exit 0
  exit 1
}

# has FILE TEXT / not_has FILE TEXT: FILE holds (or does not hold) the fixed string TEXT.
has() { grep -qF -- "$2" "$1"; }
not_has() { ! grep -qF -- "$2" "$1"; }
# le A B: A <= B, as decimals.
le() { [[ $(echo "$1 <= $2" | bc) == 1 ]]; }
# now: the wall-clock time in seconds, with nanoseconds.
now() { date +%s.%N; }
# free_port: a TCP port free on this host a moment ago.
free_port() {
  python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'
}
# listening PORT: something on this host listens on TCP PORT.
listening() { ss -ltn 2>/dev/null | grep -q ":$1 "; }
# wait_until SECONDS COMMAND...: runs COMMAND every 0.1 s until it succeeds (status 0) or
# SECONDS (a whole number) have passed (status 1).
wait_until() {
  local i
  for ((i = 0; i < $1 * 10; i++)); do
    "${@:2}" && return 0
    sleep 0.1
  done
  return 1
}
