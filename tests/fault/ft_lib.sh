# shellcheck shell=bash
# Shared by ft_test.sh and ft_hsdp_test.sh (sourced): reading what ft_program wrote.

# first_commit_after DIR REPLICA: seconds from DIR/death (the fault's wall-clock time) to
# that replica's next commit (its replica_REPLICA.txt's "commits" line); empty if none.
first_commit_after() {
  local death; death=$(cat "$1/death")
  awk -v d="$death" '/^commits/ { for (i = 2; i <= NF; i++) if ($i > d) { printf "%.2f", $i - d; exit } }' \
    "$1/replica_$2.txt"
}
