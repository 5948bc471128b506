#!/usr/bin/env bash
# lockstep-train's refusals, each one line naming its cause (seconds, 1 process):
# a directory, missing, empty, comment-only or binary config; --set errors naming the --set
# argument; unknown flags (exit 2, the nearest valid flag, the usage line), also for
# lockstep-run; data generation printing its size and time, and asking for --yes above
# 1 GB; a missing shard naming its path and the command that creates it.
set -uo pipefail
RUN=$1 TRAIN=$2 SCORE=$3 SRC=$4
CFG=$SRC/configs/ctsm-tiny.toml
W=$(mktemp -d /tmp/lockstep-train-cli.XXXXXX)
trap 'rm -rf "$W"' EXIT
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$W"
# expect RC PATTERN ARGS...: lockstep-train ARGS exits RC and its output matches PATTERN.
expect() {
  local rc=$1 pattern=$2; shift 2
  "$TRAIN" "$@" > out.log 2>&1; local got=$?
  echo "  [$got] $(grep -E -- "$pattern" out.log | head -1)"
  [[ $got == "$rc" ]] || { cat out.log; fail "'$*' exited $got, want $rc"; }
  grep -qE -- "$pattern" out.log || { cat out.log; fail "'$*': no line matches '$pattern'"; }
}

echo "== configs that are none"
mkdir confdir; : > empty.toml; printf '# only\n\n  # comments\n' > comments.toml
head -c 300 "$TRAIN" > binary.toml
expect 2 "config error: $W/confdir: is a directory, not a config file" "$W/confdir"
expect 2 "config error: $W/missing.toml: no such config file" "$W/missing.toml"
expect 2 "config error: $W/empty.toml: is empty" "$W/empty.toml"
expect 2 "config error: $W/comments.toml: is empty" "$W/comments.toml"
expect 2 "config error: $W/binary.toml: is a binary file" "$W/binary.toml"

echo "== --set errors name the --set argument"
expect 2 "config error: --set train.epochs=abc: key 'train.epochs' must be an integer, got a string" \
  "$CFG" --set train.epochs=abc
expect 2 "config error: --set train.epochs=-1: key 'train.epochs' = -1 is out of range" "$CFG" --set train.epochs=-1
expect 2 "config error: --set trian.epochs=2: unknown section 'trian' \(sections: run, " "$CFG" --set trian.epochs=2
expect 2 "config error: --set train.epoch=2: unknown key 'train.epoch'" "$CFG" --set train.epoch=2
expect 2 "config error: --set train=3: key must be section.key" "$CFG" --set train=3
! grep -q "<config>" out.log || fail "an error points at <config>"

echo "== unknown flags: exit 2, nearest flag, usage line"
expect 2 "^lockstep-train: unknown option '--resum'; did you mean '--resume'\?" "$CFG" --resum
grep -q "^Usage: lockstep-train \[OPTIONS\] config" out.log || fail "usage line"
expect 2 "^lockstep-train: unknown option '--generate_only'; did you mean '--generate-only'\?" "$CFG" --generate_only
expect 2 "^lockstep-train: unknown option '--frobnicate'$" "$CFG" --frobnicate
expect 2 "^lockstep-train: config is required" --resume
expect 0 "^Usage: lockstep-train" --help
"$RUN" --nproc-per-nod 2 true > run.log 2>&1; rc=$?
cat run.log
[[ $rc == 2 ]] || fail "lockstep-run unknown flag exited $rc"
grep -q "unknown option '--nproc-per-nod'; did you mean '--nproc-per-node'?" run.log || fail "lockstep-run nearest flag"

echo "== data generation: size and time, --yes above 1 GB"
expect 2 "about [0-9.]+ GB \(2000000 clients x 365 days\), about [0-9]+ min to generate; above 1.0 GB lockstep-train wants --yes" \
  "$CFG" --set data.dir="$W/big" --set data.clients=2000000 --set strategy.kind=single --generate-only
[[ ! -e $W/big ]] || fail "generated without --yes"
expect 0 "generating 800 clients x 365 days into 2 shards in $W/data: about [0-9.]+ MB, about [0-9.]+ s" \
  "$CFG" --set data.dir="$W/data" --set strategy.kind=single --generate-only
actual=$(du -sb "$W/data" | cut -f1); echo "  actual size: $actual bytes"

echo "== a missing shard names its path and the command that creates it"
rm "$W/data/events-00000-of-00002.lse"
expect 2 "$W/data/events-00000-of-00002.lse: missing shard of the event log in data.dir \(1 of 2 missing\); create it with: lockstep-train $CFG --generate-only --set data.generate=true" \
  "$CFG" --set data.dir="$W/data" --set data.generate=false --set strategy.kind=single --generate-only
expect 0 "warning: $W/data/events-00000-of-00002.lse is missing \(1 of 2 shards\); generating the event log again" \
  "$CFG" --set data.dir="$W/data" --set strategy.kind=single --generate-only
[[ -s $W/data/events-00000-of-00002.lse ]] || fail "shard not regenerated"
echo "PASS"
