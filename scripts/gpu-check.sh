#!/usr/bin/env bash
# The device run (docs/gpu.md, "The device run (scripts/gpu-check.sh)"): on a lent GPU
# machine that has only python3 with a CUDA torch wheel, nvcc, CMake and g++, build the
# CUDA targets against gpu-deps/ (scripts/gpu-prepare.sh) and run the GPU tests.
#
#   bash scripts/gpu-check.sh OUT        from the repository root; OUT gets summary.txt,
#                                        bench.txt and logs.tgz (logs/<step>.log)
# Environment:
#   GPU_CHECK_ONLY_BUILD=1   stop after the build (the rehearsal on a machine without GPU)
#   GPU_CHECK_BENCH=1        build lockstep-bench too
#   GPU_CHECK_JOBS=N         build jobs (default: nproc)
#   GPU_CHECK_ARCH=90        CUDA architecture (default: the first GPU's compute capability)
#   GPU_CHECK_BUILD_TIMEOUT  seconds for the build (default 420)
#   GPU_CHECK_BUILD_DIR      build folder (default build-gpu)
#   GPU_CHECK_CMAKE_ARGS     more configure options, split at spaces
#   GPU_CHECK_DEADLINE_S     every step ends by then, counted from the start (default 530,
#                            under the device tool's 10 minutes a command)
# Every step runs under its own timeout and the script goes on after a failure; it exits
# non-zero when any step failed. The environment is printed first, so even a failed
# configure says which machine it was.
set -uo pipefail

out=${1:-${OUT:-gpu-check-out}}
mkdir -p "$out/logs"
out=$(cd "$out" && pwd)
summary="$out/summary.txt"
: >"$summary"
build=${GPU_CHECK_BUILD_DIR:-build-gpu}
jobs=${GPU_CHECK_JOBS:-$(nproc)}
failed=()
deadline=${GPU_CHECK_DEADLINE_S:-530}

say() { echo "$*" | tee -a "$summary"; }

# step NAME TIMEOUT_S COMMAND...: runs it, logs it whole in logs/NAME.log; its wall time,
# exit code and last lines go to the summary.
step() {
  local name=$1 limit=$2 rc t0 t1 left=$((deadline - SECONDS))
  shift 2
  say "== $name: $*"
  if ((left < 15)); then
    say "-- $name: NOT RUN: the ${deadline}s deadline is near"
    failed+=("$name")
    return 1
  fi
  if ((limit > left)); then limit=$left; fi
  t0=$(date +%s.%N)
  timeout -k 10 "$limit" "$@" >"$out/logs/$name.log" 2>&1
  rc=$?
  t1=$(date +%s.%N)
  local what="exit $rc"
  if ((rc == 124 || rc == 137)); then what="TIMEOUT after ${limit}s (exit $rc)"; fi
  tail -n 15 "$out/logs/$name.log" | sed 's/^/   | /' >>"$summary"
  say "-- $name: $what, $(awk -v a="$t0" -v b="$t1" 'BEGIN { printf "%.1f", b - a }') s wall"
  if ((rc != 0)); then failed+=("$name"); fi
  return "$rc"
}

fail() {  # a step that could not start
  say "-- $1: FAILED: $2"
  failed+=("$1")
}

finish() {
  if [[ -f "$build/.ninja_log" ]]; then cp "$build/.ninja_log" "$out/logs/ninja_log.txt"; fi
  # One archive: the device tool brings back a limited number of files.
  tar czf "$out/logs.tgz" -C "$out" logs && rm -rf "${out:?}/logs"
  if ((${#failed[@]})); then
    say "== RESULT: FAILED: ${failed[*]}"
    exit 1
  fi
  say "== RESULT: all steps passed"
  exit 0
}

# --- the machine ----------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC'), host $(hostname), nproc $(nproc)"
  nvidia-smi -L 2>&1 || echo "(no nvidia-smi)"
  nvidia-smi --query-gpu=name,memory.total,compute_cap,driver_version --format=csv 2>&1 || true
  python3 -c 'import torch, sys; print("python", sys.version.split()[0], "torch", torch.__version__,
"cuda", torch.version.cuda, "available", torch.cuda.is_available(), "devices", torch.cuda.device_count())' 2>&1
  nvcc --version 2>&1 | tail -n 2
  g++ --version 2>&1 | head -n 1
  cmake --version 2>&1 | head -n 1
  if command -v ninja >/dev/null; then echo "ninja $(ninja --version)"; else echo "no ninja"; fi
  free -g 2>/dev/null | head -n 2
} 2>&1 | tee "$out/logs/env.log" >>"$summary"
cat "$out/logs/env.log"

# --- configure ------------------------------------------------------------------------
torch_prefix=$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)' 2>/dev/null) || {
  fail configure "python3 cannot import torch"
  finish
}
arch=${GPU_CHECK_ARCH:-}
if [[ -z "$arch" ]]; then
  arch=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader 2>/dev/null | head -n 1 | tr -d ' .')
  [[ "$arch" =~ ^[0-9]+$ ]] || arch=90  # no GPU visible (the rehearsal): the H100's
fi
generator=()
if command -v ninja >/dev/null; then generator=(-G Ninja); fi
if [[ -f "$build/CMakeCache.txt" ]] && ! grep -q "^CMAKE_GENERATOR:INTERNAL=${generator[1]:-Unix Makefiles}$" "$build/CMakeCache.txt"; then
  rm -rf "$build"  # another generator's tree cannot be reconfigured
fi
read -ra extra <<<"${GPU_CHECK_CMAKE_ARGS:-}"  # more -D options (the rehearsal's)
# The C++ standard is left to the project: 17, raised to 20 for libtorch >= 2.14.
step configure 240 cmake -S . -B "$build" "${generator[@]}" \
  -DCMAKE_PREFIX_PATH="$torch_prefix" -DCMAKE_BUILD_TYPE=Release \
  -DLOCKSTEP_DEPS_DIR="$PWD/gpu-deps" -DLOCKSTEP_CUDA=ON -DLOCKSTEP_CUDA_ARCHITECTURES="$arch" \
  -DLOCKSTEP_WITH_MPI=OFF -DLOCKSTEP_BUILD_BENCH=ON "${extra[@]}" || finish
grep -E "^-- lockstep: build type" "$out/logs/configure.log" | tee -a "$summary"

# --- build ----------------------------------------------------------------------------
cmake --build "$build" --target help >"$out/logs/targets.log" 2>&1
targets=()
wanted=(lockstep-run unit_cuda unit_cuda_stream gpu_training_check)
if [[ "${GPU_CHECK_BENCH:-0}" == 1 ]]; then wanted+=(lockstep-bench); fi
for t in "${wanted[@]}"; do
  if grep -qE "^(\.\.\. )?$t(:|$| )" "$out/logs/targets.log"; then
    targets+=("$t")
  else
    say "-- build: no target $t in this tree: skipped"
  fi
done
keep_going=(-k)  # make: go on after a failed target, so the others still get built
if [[ ${#generator[@]} -gt 0 ]]; then keep_going=(-k 0); fi
step build "${GPU_CHECK_BUILD_TIMEOUT:-420}" \
  cmake --build "$build" -j "$jobs" --target "${targets[@]}" -- "${keep_going[@]}"

if [[ "${GPU_CHECK_ONLY_BUILD:-0}" == 1 ]]; then
  say "== GPU_CHECK_ONLY_BUILD=1: no tests"
  finish
fi

# --- tests ----------------------------------------------------------------------------
binary() {  # binary NAME: its path in the build tree (not the packaging test's copies)
  find "$build" -path "$build/tests/packaging" -prune -o -name "$1" -type f -executable -print |
    head -n 1
}
run_bin=$(binary lockstep-run)
for t in unit_cuda_stream unit_cuda; do
  bin=$(binary "$t")
  if [[ -n "$bin" ]]; then step "$t" 180 "$bin" --gtest_brief=0; else fail "$t" "not built"; fi
done
check=$(binary gpu_training_check)
if [[ -z "$check" ]]; then
  say "-- gpu_training_check: not built: the multi-rank steps skipped"
  [[ " ${targets[*]} " == *" gpu_training_check "* ]] && failed+=(gpu_training_check)
elif [[ -z "$run_bin" ]]; then
  fail gpu_training "lockstep-run not built"
else
  for backend in shm gloo; do
    step "train_${backend}_np2" 150 env LOCKSTEP_BACKEND="$backend" LOCKSTEP_TIMEOUT_S=60 \
      "$run_bin" --nproc-per-node 2 --master-port 0 "$check"
  done
  step train_nccl_np1 150 env LOCKSTEP_BACKEND=nccl LOCKSTEP_TIMEOUT_S=60 \
    "$run_bin" --nproc-per-node 1 --master-port 0 "$check"
  # The benchmarks: lockstep's DDP (shm, with and without QSGD) and the CUDA codec, then
  # PyTorch's DDP over gloo on the same GPU and workload (tests/gpu/torch_ddp_peer.py).
  step bench_lockstep_shm_np2 150 env LOCKSTEP_BACKEND=shm LOCKSTEP_TIMEOUT_S=120 \
    "$run_bin" --nproc-per-node 2 --master-port 0 "$check" --bench
  step bench_torch_ddp_gloo_np2 120 python3 -m torch.distributed.run --standalone \
    --nproc-per-node 2 tests/gpu/torch_ddp_peer.py
  say "== benchmarks"
  grep -hE "^(\[rank 0\] )?bench " "$out/logs/bench_lockstep_shm_np2.log" \
    "$out/logs/bench_torch_ddp_gloo_np2.log" | sed 's/^\[rank 0\] //' | tee "$out/bench.txt" |
    tee -a "$summary"
  # The same-run ratio: PyTorch's step over lockstep's (fp32 allreduce), > 1 when faster.
  awk -F': ' '/lockstep ddp step.*fp32/ { ours = $NF + 0 } /torch ddp step/ { peer = $NF + 0 }
    END { if (ours > 0 && peer > 0) printf "ratio: PyTorch DDP step / lockstep DDP step = %.2f\n", peer / ours }' \
    "$out/bench.txt" | tee -a "$summary"
fi
finish
