#!/usr/bin/env bash
# A test program's command line goes through lockstep::launch::parse_command_line
# (lockstep/launch/cli.h): a misspelt flag exits 2, not CLI11's 109, with one line naming it
# and the nearest valid flag, then the usage line. Nothing is launched (about 1 s).
# usage: cli_typo_test.sh PROGRAM TYPO NEAREST [ARGS...]     runs PROGRAM ARGS... TYPO
set -u
prog=$1; typo=$2; nearest=$3
shift 3
name=$(basename "$prog")
tmp=$(mktemp -d); trap 'rm -rf "$tmp"' EXIT
# shellcheck source=../lib/checks.sh
source "$(dirname "$0")/../lib/checks.sh"
tally_tag="[$name $typo]"
on_fail() { sed 's/^/    | /' "$tmp/err"; }

"$prog" "$@" "$typo" >"$tmp/out" 2>"$tmp/err"
rc=$?
check "exit status 2 (got $rc)" [ "$rc" = 2 ]
want="$name: unknown option '$typo'; did you mean '$nearest'?"
check "first line: $want" [ "$(head -1 "$tmp/err")" = "$want" ]
check "then its usage line" grep -q "^Usage: $name " "$tmp/err"
finish
