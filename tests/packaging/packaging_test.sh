#!/usr/bin/env bash
# packaging_test.sh BUILD SRC WORK MODE: lockstep as a user gets it (docs/install.md).
#   install    cmake --install BUILD into WORK/prefix; checks the tree's layout; no internal
#              header installed; a program using only the base header links no library
#   cmake      examples/consumer configured with find_package(lockstep) against WORK/prefix
#              only, built, run on 2 ranks (shm and gloo) by the installed lockstep-run
#   pkgconfig  the same program compiled with `pkg-config --cflags --libs lockstep`, 2 ranks;
#              every installed header, in one translation unit, compiles with its flags
#   deb        cpack -G DEB: dpkg-deb -I (Depends) and -c (contents), extracted into a fresh
#              root: no build or source path in it, its lockstep-run runs the consumer on 2 ranks
set -uo pipefail
BUILD=$1 SRC=$2 WORK=$3 MODE=$4
PREFIX=$WORK/prefix
fail() { echo "FAIL ($MODE): $*"; exit 1; }
step() { echo "== $*"; }
export CCACHE_BASEDIR=$SRC

# Runs PROGRAM on 2 ranks with LAUNCHER on each backend; both ranks must print "ok".
run_two_ranks() {
  local launcher=$1 program=$2 backend out
  for backend in shm gloo; do
    step "2 ranks, $backend: $launcher $program"
    out=$(LOCKSTEP_BACKEND=$backend LOCKSTEP_TIMEOUT_S=60 \
          "$launcher" --nproc-per-node 2 --master-port 0 "$program" 2>&1)
    local rc=$?
    echo "$out"
    [[ $rc == 0 ]] || fail "$program on 2 ranks ($backend) exited $rc"
    for r in 0 1; do
      grep -q "consumer: rank $r of 2 ok" <<<"$out" || fail "rank $r did not report ok ($backend)"
    done
  done
}

case $MODE in
install)
  rm -rf "$PREFIX"
  step "cmake --install $BUILD --prefix $PREFIX"
  cmake --install "$BUILD" --prefix "$PREFIX" > "$WORK/install.log" || { cat "$WORK/install.log"; fail "install"; }
  n=$(grep -c "Installing:" "$WORK/install.log")
  echo "installed $n files"
  libdir=$(cd "$PREFIX" && ls -d lib*/cmake/lockstep | head -1) || fail "no <libdir>/cmake/lockstep"
  libdir=${libdir%/cmake/lockstep}
  for f in bin/lockstep-run bin/lockstep-train include/lockstep/lockstep.h include/lockstep/compat.h \
           "$libdir"/cmake/lockstep/lockstep-config.cmake "$libdir"/cmake/lockstep/lockstep-targets.cmake \
           "$libdir"/cmake/lockstep/lockstep-config-version.cmake "$libdir"/pkgconfig/lockstep.pc \
           share/doc/lockstep/README.md share/doc/lockstep/install.md share/lockstep/configs/ctsm-tiny.toml; do
    [[ -e $PREFIX/$f ]] || fail "missing $f"
  done
  for layer in comm compress numerics parallel data models train launch; do
    ls "$PREFIX/$libdir"/liblockstep_$layer.* >/dev/null 2>&1 || fail "missing liblockstep_$layer"
  done
  # Every public header, and nothing from src/ (private headers stay private).
  want=$(cd "$SRC/include" && find lockstep -name '*.h' | sort)
  got=$(cd "$PREFIX/include" && find lockstep -name '*.h' | sort)
  [[ "$want" == "$got" ]] || fail "installed headers differ from include/lockstep: $(diff <(echo "$want") <(echo "$got"))"
  echo "headers: $(wc -l <<<"$got") (all of include/lockstep)"
  # No internal header: none installed under lockstep/<layer>/ is named as a header that
  # lives next to the sources in src/<layer>/ (the trainer's report writers, PNG encoder,
  # lr schedule, ...), and no installed header includes one ("train/report/...").
  while read -r h; do
    layer=${h%%/*}
    [[ -d $PREFIX/include/lockstep/$layer ]] || continue
    found=$(find "$PREFIX/include/lockstep/$layer" -name "$(basename "$h")")
    [[ -z $found ]] || fail "internal header src/$h installed as ${found#"$PREFIX"/}"
  done < <(cd "$SRC/src" && find . -name '*.h' | sed 's|^\./||')
  if grep -rnE '^\s*#\s*include\s*"(launch|comm|compress|numerics|parallel|data|models|train)/' \
       "$PREFIX/include/lockstep"; then
    fail "an installed header includes an internal one (above)"
  fi
  # Every <lockstep/...> an installed header includes is installed too.
  missing=$(grep -rhoE '^\s*#\s*include\s*<lockstep/[^>]+>' "$PREFIX/include/lockstep" |
            sed -E 's/.*<(lockstep\/[^>]+)>/\1/' | sort -u |
            while read -r inc; do [[ -e $PREFIX/include/$inc ]] || echo "$inc"; done)
  [[ -z $missing ]] || fail "installed headers include headers that are not installed: $missing"
  echo "no internal header installed"
  # The base layer is header-only: a program using its error classes (CommError included)
  # compiles and links against the installed headers alone, with no lockstep library.
  step "base alone: <lockstep/error.h> with no library"
  cat > "$WORK/base_only.cpp" <<'EOF'
#include <lockstep/error.h>
#include <cstdio>
#include <string>
int main() {
  lockstep::CommContext ctx;
  ctx.rank = 1, ctx.world_size = 2, ctx.backend = "shm", ctx.op = "allreduce", ctx.seq = 3;
  try {
    throw lockstep::CommError(lockstep::CommError::Kind::Timeout, ctx, "peer silent");
  } catch (const lockstep::Error& e) {
    const std::string want = "rank 1/2 [shm] allreduce #3: timed out: peer silent";
    if (e.what() != want) return std::printf("got '%s', want '%s'\n", e.what(), want.c_str()), 1;
  }
  return 0;
}
EOF
  c++ -std=c++17 -Wall -Werror "-I$PREFIX/include" "$WORK/base_only.cpp" -o "$WORK/base_only" ||
    fail "a program using only <lockstep/error.h> does not build without lockstep's libraries"
  "$WORK/base_only" || fail "CommError's message from the header-only base"
  # The package names no path of the source or build tree (a relocatable install).
  if grep -rl -e "$SRC/include" -e "$BUILD" "$PREFIX/$libdir/cmake" "$PREFIX/$libdir/pkgconfig"; then
    fail "the CMake package or lockstep.pc names the build or source tree"
  fi
  "$PREFIX/bin/lockstep-run" --help > /dev/null || fail "installed lockstep-run --help"
  ;;
cmake)
  B=$WORK/consumer-cmake
  rm -rf "$B"
  step "configure examples/consumer against $PREFIX"
  launcher=()
  command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
  # No package registry: the installed tree is the only place to find lockstep in.
  cmake -S "$SRC/examples/consumer" -B "$B" -DCMAKE_BUILD_TYPE=Release "${launcher[@]}" \
    -DCMAKE_PREFIX_PATH="$PREFIX" -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF > "$WORK/consumer-configure.log" 2>&1 || { cat "$WORK/consumer-configure.log"; fail "configure"; }
  found=$(grep '^lockstep_DIR' "$B/CMakeCache.txt")
  echo "$found"
  [[ $found == *"$PREFIX/"* ]] || fail "find_package(lockstep) did not take the installed tree: $found"
  step "build"
  start=$SECONDS
  cmake --build "$B" -j2 || fail "build"
  echo "built in $((SECONDS - start)) s"
  run_two_ranks "$PREFIX/bin/lockstep-run" "$B/consumer"
  ;;
pkgconfig)
  B=$WORK/consumer-pkgconfig
  rm -rf "$B" && mkdir -p "$B"
  pc_dir=$(dirname "$(ls "$PREFIX"/lib*/pkgconfig/lockstep.pc | head -1)")
  export PKG_CONFIG_PATH=$pc_dir
  flags=$(pkg-config --cflags --libs lockstep) || fail "pkg-config --cflags --libs lockstep"
  echo "pkg-config: $flags"
  [[ $(pkg-config --modversion lockstep) == "$(sed -n 's/^project(lockstep VERSION \([0-9.]*\).*/\1/p' "$SRC/CMakeLists.txt")" ]] ||
    fail "lockstep.pc version"
  cxx=(c++)
  command -v ccache >/dev/null && cxx=(ccache c++)
  step "compile with pkg-config's flags"
  start=$SECONDS
  # shellcheck disable=SC2086  # the flags are words
  "${cxx[@]}" -O2 "$SRC/examples/consumer/main.cpp" -o "$B/consumer" $flags || fail "compile + link"
  echo "built in $((SECONDS - start)) s"
  run_two_ranks "$PREFIX/bin/lockstep-run" "$B/consumer"
  # The installed set is whole: every header, all in one translation unit, compiles with
  # pkg-config's flags alone (none reaches for a header that stayed in src/).
  step "every installed header in one translation unit"
  (cd "$PREFIX/include" && find lockstep -name '*.h' | sort | sed 's/.*/#include <&>/') > "$B/all_headers.cpp"
  start=$SECONDS
  # shellcheck disable=SC2046  # the flags are words
  c++ -fsyntax-only "$B/all_headers.cpp" $(pkg-config --cflags lockstep) ||
    fail "the installed headers do not compile together"
  echo "$(wc -l < "$B/all_headers.cpp") headers compiled in $((SECONDS - start)) s"
  ;;
deb)
  D=$WORK/deb
  rm -rf "$D" && mkdir -p "$D"
  step "cpack -G DEB"
  (cd "$D" && cpack -G DEB --config "$BUILD/CPackConfig.cmake" -B "$D") > "$D/cpack.log" 2>&1 ||
    { cat "$D/cpack.log"; fail "cpack"; }
  deb=$(ls "$D"/lockstep_*.deb) || fail "no .deb in $D"
  echo "$deb: $(du -h "$deb" | cut -f1)"
  info=$(dpkg-deb -I "$deb") || fail "dpkg-deb -I"
  echo "$info"
  depends=$(dpkg-deb -f "$deb" Depends)
  for p in libtorch-dev libopenblas0-pthread libc6 libstdc++6; do
    grep -q "\b$p\b" <<<"$depends" || fail "Depends lacks $p: $depends"
  done
  if grep -q "OpenSSL::Crypto" "$PREFIX"/lib*/cmake/lockstep/lockstep-targets.cmake; then
    grep -q "libssl-dev" <<<"$depends" || fail "static lockstep_comm links libcrypto, Depends lacks libssl-dev"
  fi
  if grep -q "MPI::MPI_C" "$PREFIX"/lib*/cmake/lockstep/lockstep-targets.cmake; then
    grep -q "libopenmpi-dev" <<<"$depends" || fail "built with MPI, Depends lacks libopenmpi-dev"
  fi
  contents=$(dpkg-deb -c "$deb") || fail "dpkg-deb -c"
  for f in ./usr/bin/lockstep-run ./usr/bin/lockstep-train ./usr/include/lockstep/lockstep.h \
           ./usr/lib/cmake/lockstep/lockstep-config.cmake ./usr/lib/pkgconfig/lockstep.pc \
           ./usr/lib/liblockstep_comm ./usr/share/doc/lockstep/README.md; do
    grep -q " $f" <<<"$contents" || fail "the .deb lacks $f"
  done
  echo "files: $(grep -vc '/$' <<<"$contents")"
  step "extract into a fresh root and run its lockstep-run"
  root=$D/root
  dpkg-deb -x "$deb" "$root" || fail "dpkg-deb -x"
  if grep -rl -e "$SRC" -e "$BUILD" "$root/usr/lib/cmake" "$root/usr/lib/pkgconfig"; then
    fail "the package names the build or source tree"
  fi
  run_two_ranks "$root/usr/bin/lockstep-run" "$WORK/consumer-cmake/consumer"
  ;;
*) fail "unknown mode" ;;
esac
echo "PASS ($MODE)"
