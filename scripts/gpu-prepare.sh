#!/usr/bin/env bash
# Fills gpu-deps/ (git-ignored) with what lockstep's configure and build need that a bare
# GPU machine lacks (docs/gpu.md, "The device run"): a prefix laid out like /usr, taken
# from this Debian machine's packages (scripts/install-deps.sh installs them).
#   include/   gloo, zlib, OpenSSL (libcrypto), nlohmann/json, CLI11, toml++
#   lib/       libz.a, libcrypto.a (static: nothing depends on the device's shared libs)
#   share/cmake/{nlohmann_json,CLI11,tomlplusplus}/  package configs for find_package
#   googletest/  GoogleTest's sources, built on the device by its own compiler
# The device's configure takes it with -DLOCKSTEP_DEPS_DIR=$PWD/gpu-deps
# (cmake/Dependencies.cmake). Run from anywhere; running it again starts afresh.
set -euo pipefail

root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
out="$root/gpu-deps"
arch=$(dpkg-architecture -qDEB_HOST_MULTIARCH 2>/dev/null || echo x86_64-linux-gnu)
libdir="/usr/lib/$arch"

need() {  # need PATH PACKAGE: stop naming the package when a source is missing
  if [[ ! -e "$1" ]]; then
    echo "gpu-prepare: $1 missing: apt-get install $2 (or scripts/install-deps.sh)" >&2
    exit 1
  fi
}
need /usr/include/gloo/config.h libgloo-dev
need /usr/include/zlib.h zlib1g-dev
need "$libdir/libz.a" zlib1g-dev
need /usr/include/openssl/evp.h libssl-dev
need "/usr/include/$arch/openssl/opensslconf.h" libssl-dev
need "$libdir/libcrypto.a" libssl-dev
need /usr/include/nlohmann/json.hpp nlohmann-json3-dev
need /usr/share/cmake/nlohmann_json/nlohmann_jsonConfig.cmake nlohmann-json3-dev
need /usr/include/CLI/CLI.hpp libcli11-dev
need /usr/share/cmake/CLI11/CLI11Config.cmake libcli11-dev
need /usr/include/toml++/toml.h libtomlplusplus-dev
need "$libdir/cmake/tomlplusplus/tomlplusplusConfigVersion.cmake" libtomlplusplus-dev
need /usr/src/googletest/CMakeLists.txt googletest

rm -rf "$out"
mkdir -p "$out/include/openssl" "$out/lib" "$out/share/cmake"

cp -r /usr/include/gloo /usr/include/nlohmann /usr/include/CLI /usr/include/toml++ "$out/include/"
cp /usr/include/zlib.h /usr/include/zconf.h "$out/include/"
cp "$libdir/libz.a" "$libdir/libcrypto.a" "$out/lib/"
# OpenSSL's headers: the common ones and the multiarch ones (configuration.h, opensslconf.h).
cp /usr/include/openssl/*.h "/usr/include/$arch/openssl/"*.h "$out/include/openssl/"

# nlohmann_json and CLI11: their configs find the prefix three directories up.
cp -r /usr/share/cmake/nlohmann_json /usr/share/cmake/CLI11 "$out/share/cmake/"
# toml++: Debian's config imports its shared library; the device builds no target that uses
# toml++, and a header-only target needs nothing but the headers (impl/*.inl are there).
mkdir -p "$out/share/cmake/tomlplusplus"
cp "$libdir/cmake/tomlplusplus/tomlplusplusConfigVersion.cmake" "$out/share/cmake/tomlplusplus/"
cat >"$out/share/cmake/tomlplusplus/tomlplusplusConfig.cmake" <<'EOF'
# Written by scripts/gpu-prepare.sh: toml++ header-only, from Debian's headers.
if(NOT TARGET tomlplusplus::tomlplusplus)
  get_filename_component(_tomlpp_prefix "${CMAKE_CURRENT_LIST_DIR}/../../.." ABSOLUTE)
  add_library(tomlplusplus::tomlplusplus INTERFACE IMPORTED)
  set_target_properties(tomlplusplus::tomlplusplus PROPERTIES
    INTERFACE_INCLUDE_DIRECTORIES "${_tomlpp_prefix}/include"
    INTERFACE_COMPILE_DEFINITIONS "TOML_HEADER_ONLY=1"
    INTERFACE_COMPILE_FEATURES cxx_std_17)
  unset(_tomlpp_prefix)
endif()
EOF

# GoogleTest's sources, without the docs and its own tests.
mkdir -p "$out/googletest"
cp -r /usr/src/googletest/. "$out/googletest/"
rm -rf "$out/googletest/docs" "$out/googletest/googletest/test" "$out/googletest/googlemock/test" \
       "$out/googletest/googletest/samples"

size=$(du -sm "$out" | cut -f1)
echo "gpu-prepare: $(du -sh "$out" | cut -f1) in $out (limit 64 MiB of carried paths)"
if ((size >= 64)); then
  echo "gpu-prepare: gpu-deps is ${size} MiB, over the 64 MiB a device run carries" >&2
  exit 1
fi
