# shellcheck shell=bash
# The fault tests' survivor check (sourced after checks.sh by tests/fault/death_test.sh and
# hier_death_test.sh): when a rank dies or stops in a loop of collectives, every other rank
# must raise naming it, in time. fault_program's survivors print
#   rank R caught CommError (KIND) at iteration I, S s after the death: WHAT

# survivors_raised NAME OUT VICTIM OP_RE BOUND RANK...: each RANK but VICTIM printed that
# line in file OUT, naming "rank VICTIM" and matching the grep pattern OP_RE ("allreduce
# #6"), S <= BOUND seconds after the death. One PASS or FAIL per rank, led by NAME.
survivors_raised() {
  local name=$1 out=$2 victim=$3 op=$4 bound=$5 r line s
  shift 5
  for r in "$@"; do
    [[ $r == "$victim" ]] && continue
    line=$(grep -m1 "rank $r caught CommError" "$out")
    if [[ -z $line ]]; then
      fail "$name: rank $r printed no CommError"
      continue
    fi
    s=$(echo "$line" | sed -E 's/.* ([0-9.]+) s after the death.*/\1/')
    if echo "$line" | grep -q "$op" && echo "$line" | grep -q "rank $victim" &&
      le "$s" "$bound"; then
      pass "$name: rank $r raised ${s} s after the death: $(echo "$line" | sed 's/.*the death: //' | cut -c1-220)"
    else
      fail "$name: rank $r: $line"
    fi
  done
}
