#!/usr/bin/env bash
# The BLAS the ranks get (lockstep/blas_core.h): after lockstep-run, no rank runs OpenBLAS
# kernels below what this CPU supports, and a user's OPENBLAS_CORETYPE stands (init() says
# what it costs). Real processes, the OpenBLAS Debian's libtorch loads.
# usage: tests/fault/blas_test.sh fault_program lockstep-run FAKE_BLAS_DIR   (about 5 s)
# FAKE_BLAS_DIR holds a libblas.so.3 whose openblas_get_corename() says Prescott.
set -u
PROG=${1:?usage: $0 fault_program lockstep-run FAKE_BLAS_DIR}
RUN=${2:?usage: $0 fault_program lockstep-run FAKE_BLAS_DIR}
FAKE=${3:?usage: $0 fault_program lockstep-run FAKE_BLAS_DIR}
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
source "$(dirname "$0")/../lib/checks.sh"
show() { echo "--- $1:"; cat "$TMP/$1.err"; }

# What lockstep-run's ranks run, as init() reports it under LOCKSTEP_DEBUG.
env -u OPENBLAS_CORETYPE LOCKSTEP_DEBUG=1 LOCKSTEP_BACKEND=shm \
  "$RUN" --nproc-per-node 2 --master-port 0 "$PROG" join >"$TMP/a.out" 2>"$TMP/a.err"
echo "(a) lockstep-run's ranks: $(grep -oE 'OpenBLAS runs its [A-Za-z0-9_]+ kernels \(CPU: [^)]+\)' "$TMP/a.err" | head -1)"
check "the job ran" has "$TMP/a.out" "rank 1 joined"
if has "$TMP/a.err" "OpenBLAS" ; then
  check "no rank runs kernels below the CPU" not_has "$TMP/a.err" "slower than they could"
  check "one line per node (local rank 0 only)" [ "$(grep -c 'OpenBLAS runs its' "$TMP/a.err")" = 1 ]
  if has "$TMP/a.err" "setting OPENBLAS_CORETYPE="; then
    echo "  (lockstep-run corrected OpenBLAS's choice: $(grep -o 'OpenBLAS would run.*' "$TMP/a.err"))"
  fi
else
  echo "  (this libtorch loads no OpenBLAS: nothing to check)"
fi
[ "$failures" = 0 ] || show a

# A user's OPENBLAS_CORETYPE below the CPU: lockstep-run keeps it, init() says what to set.
if grep -qwE 'avx|avx2|avx512f' /proc/cpuinfo && has "$TMP/a.err" "OpenBLAS"; then
  OPENBLAS_CORETYPE=Prescott LOCKSTEP_BACKEND=shm \
    "$RUN" --nproc-per-node 2 --master-port 0 "$PROG" join >"$TMP/b.out" 2>"$TMP/b.err"
  echo "(b) OPENBLAS_CORETYPE=Prescott set by the user"
  check "the job ran" has "$TMP/b.out" "rank 1 joined"
  check "lockstep-run keeps the user's value" not_has "$TMP/b.err" "setting OPENBLAS_CORETYPE"
  check "init() names the setting and the fix" \
    grep -qE 'OPENBLAS_CORETYPE=Prescott selects its Prescott kernels on a CPU with .*start the ranks with OPENBLAS_CORETYPE=[A-Za-z]+' "$TMP/b.err"
  [ "$failures" = 0 ] || show b
fi
# An OpenBLAS that misdetects the CPU (the stand-in): lockstep-run sets the core type for
# every rank and says so, on any CPU with AVX or more.
if grep -qwE 'avx|avx2|avx512f' /proc/cpuinfo; then
  env -u OPENBLAS_CORETYPE LD_LIBRARY_PATH="$FAKE" \
    "$RUN" --nproc-per-node 2 --master-port 0 sh -c 'echo "core=$OPENBLAS_CORETYPE"' \
    >"$TMP/c.out" 2>"$TMP/c.err"
  echo "(c) an OpenBLAS that runs Prescott kernels on this CPU: $(grep -o 'setting OPENBLAS_CORETYPE=[A-Za-z]*' "$TMP/c.err")"
  check "lockstep-run names the fallback and its fix" \
    grep -qE 'OpenBLAS would run its Prescott kernels on this CPU \(AVX.*\); setting OPENBLAS_CORETYPE=[A-Za-z]+ for each rank' "$TMP/c.err"
  for r in 0 1; do
    check "rank $r starts with OPENBLAS_CORETYPE set" grep -qE "^\[rank $r\] core=(SkylakeX|Haswell|Zen|Sandybridge|Bulldozer)$" "$TMP/c.out"
  done
  env OPENBLAS_CORETYPE=Haswell LD_LIBRARY_PATH="$FAKE" \
    "$RUN" --nproc-per-node 1 --master-port 0 sh -c 'echo "core=$OPENBLAS_CORETYPE"' \
    >"$TMP/d.out" 2>"$TMP/d.err"
  check "a user's value stands" grep -qx '\[rank 0\] core=Haswell' "$TMP/d.out"
  check "and nothing is said" not_has "$TMP/d.err" "OPENBLAS_CORETYPE"
  [ "$failures" = 0 ] || { show c; cat "$TMP/c.out"; }
fi
finish
