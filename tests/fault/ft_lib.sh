# shellcheck shell=bash disable=SC2154  # run, prog, tmp, steps, layout, train_flags: the caller's
# Shared by ft_test.sh and ft_hsdp_test.sh (sourced after tests/lib/checks.sh): running an
# ft_program job and reading what it wrote. The caller sets $run, $prog, $tmp, $steps, and
# the arrays $layout (lockstep-run's flags: how many replicas, of how many ranks) and
# $train_flags (ft_program's own).

# on_fail: after a FAIL line, the failing job's output (once per job).
on_fail() {
  if [[ -n ${out:-} && -f $out && ${shown:-} != "$out" ]]; then
    sed 's/^/    | /' "$out" | tail -40; shown=$out
  fi
}

# job NAME FAULTS [LOCKSTEP-RUN FLAGS...]: one $steps-step job; sets $out, $dir and $rc.
job() {
  local name=$1 faults=$2
  shift 2
  dir=$tmp/$name; out=$tmp/$name.out
  mkdir -p "$dir"
  timeout 120 "$run" --fault-tolerant "${layout[@]}" --grace-seconds 2 "$@" \
    "$prog" train "$dir" "${train_flags[@]}" --steps "$steps" --faults "$faults" >"$out" 2>&1
  rc=$?
  [[ $rc -eq 124 ]] && fail "$name: the job hung (killed by timeout after 120 s)"
}

# first_commit_after DIR REPLICA: seconds from DIR/death (the fault's wall-clock time) to
# that replica's next commit (its replica_REPLICA.txt's "commits" line); empty if none.
first_commit_after() {
  local death; death=$(cat "$1/death")
  awk -v d="$death" '/^commits/ { for (i = 2; i <= NF; i++) if ($i > d) { printf "%.2f", $i - d; exit } }' \
    "$1/replica_$2.txt"
}
