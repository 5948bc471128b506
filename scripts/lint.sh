#!/usr/bin/env bash
# make lint: clang-format (.clang-format, check only) and clang-tidy (.clang-tidy) over every
# C++ source of the project; exits non-zero on the first kind of finding it reports.
#   scripts/lint.sh [BUILD_DIR]     BUILD_DIR holds compile_commands.json (default: build),
#                                   configured with -DCMAKE_UNITY_BUILD=OFF (make lint does)
#   LINT_FILES="a.cpp b.cpp" scripts/lint.sh   only these files (clang-tidy)
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
jobs=${JOBS:-$(nproc)}

echo "lint: clang-format"
git ls-files '*.cpp' '*.h' | xargs clang-format --dry-run --Werror

[[ -f $build/compile_commands.json ]] || { echo "lint: $build/compile_commands.json missing: run make configure" >&2; exit 2; }
if grep -q '/Unity/unity_' "$build/compile_commands.json"; then
  echo "lint: $build was configured as a unity build (its compile commands name batches, not" \
       "sources): configure it with -DCMAKE_UNITY_BUILD=OFF, as make lint does" >&2
  exit 2
fi
# The project's sources that this configuration compiles (compile_commands.json).
files=${LINT_FILES:-$(python3 - "$build/compile_commands.json" <<'PY'
import json, os, subprocess, sys
tracked = set(subprocess.check_output(["git", "ls-files", "*.cpp"], text=True).split())
here = os.getcwd()
seen = {os.path.relpath(e["file"], here) for e in json.load(open(sys.argv[1]))}
print("\n".join(sorted(seen & tracked)))
PY
)}
echo "lint: clang-tidy over $(wc -w <<<"$files") files, $jobs at a time"
# Each file's output is printed whole (one clang-tidy per file), findings only.
printf '%s\n' $files | xargs -P "$jobs" -I{} sh -c \
  'out=$(clang-tidy -p "$0" --quiet "{}" 2>&1) || { printf "%s\n" "$out" | grep -v "warnings generated\|^Suppressed\|^Use -header-filter" >&2; exit 1; }' "$build"
echo "lint: clean"
