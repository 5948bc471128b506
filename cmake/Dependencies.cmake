# Every dependency, found once. A missing one stops the configure with the Debian package
# that provides it (scripts/install-deps.sh installs them all); only MPI is optional.

function(lockstep_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "lockstep needs ${what}: apt-get install ${package} "
                        "(or run scripts/install-deps.sh)")
  endif()
endfunction()

# A bare machine (the lent GPU: docs/gpu.md, "The device run"): LOCKSTEP_DEPS_DIR (or the
# environment's) names a prefix that scripts/gpu-prepare.sh filled from Debian's packages,
# searched before the system: headers, static zlib and libcrypto, package configs, and
# GoogleTest's sources. Unset (the default), nothing below changes.
if(NOT LOCKSTEP_DEPS_DIR AND DEFINED ENV{LOCKSTEP_DEPS_DIR})
  set(LOCKSTEP_DEPS_DIR "$ENV{LOCKSTEP_DEPS_DIR}")
endif()
set(LOCKSTEP_DEPS_DIR "${LOCKSTEP_DEPS_DIR}" CACHE PATH "Prefix of gpu-prepare.sh's dependencies (empty: the system's)")
if(LOCKSTEP_DEPS_DIR)
  list(PREPEND CMAKE_PREFIX_PATH "${LOCKSTEP_DEPS_DIR}")  # nlohmann_json, CLI11, toml++, gloo
  set(ZLIB_ROOT "${LOCKSTEP_DEPS_DIR}")
  set(OPENSSL_ROOT_DIR "${LOCKSTEP_DEPS_DIR}")
  set(OPENSSL_USE_STATIC_LIBS TRUE)  # libcrypto.a (FindOpenSSL adds -ldl and threads)
endif()

find_package(Threads REQUIRED)
find_package(Torch QUIET)
lockstep_require(Torch_FOUND "libtorch (with c10d)" libtorch-dev)
include(${CMAKE_CURRENT_LIST_DIR}/TorchFixups.cmake)  # a pip wheel's libtorch: c10, CUDA
# libtorch >= 2.14's headers #error below C++20 (ATen/ATen.h, torch/all.h).
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14 AND CMAKE_CXX_STANDARD LESS 20)
  set(CMAKE_CXX_STANDARD 20)
endif()
# c10d's ProcessGroupGloo.hpp includes <gloo/...>.
find_path(LOCKSTEP_GLOO_INCLUDE gloo/config.h)
lockstep_require(LOCKSTEP_GLOO_INCLUDE "the Gloo headers" libgloo-dev)
if(LOCKSTEP_DEPS_DIR)  # not a system directory there: every target gets it
  include_directories(SYSTEM "${LOCKSTEP_GLOO_INCLUDE}")
endif()
find_package(ZLIB QUIET)
lockstep_require(ZLIB_FOUND "zlib" zlib1g-dev)
# OpenSSL's libcrypto: HMAC-SHA256 for the rendezvous token's proofs (src/comm/rdzv_auth.cpp).
find_package(OpenSSL QUIET COMPONENTS Crypto)
lockstep_require(OpenSSL_FOUND "OpenSSL's libcrypto" libssl-dev)
find_package(tomlplusplus QUIET)
lockstep_require(tomlplusplus_FOUND "toml++" libtomlplusplus-dev)
find_package(nlohmann_json QUIET)
lockstep_require(nlohmann_json_FOUND "nlohmann/json" nlohmann-json3-dev)
find_package(CLI11 QUIET)
lockstep_require(CLI11_FOUND "CLI11" libcli11-dev)
if(LOCKSTEP_BUILD_TESTS)
  find_package(GTest QUIET)
  # No GoogleTest installed: build it from LOCKSTEP_DEPS_DIR's sources with this compiler
  # (before CompilerFlags.cmake, so lockstep's warnings stay out of it). Its CMake makes
  # GTest::gtest and GTest::gtest_main, the names tests/ link.
  if(NOT GTest_FOUND AND EXISTS "${LOCKSTEP_DEPS_DIR}/googletest/CMakeLists.txt")
    set(BUILD_GMOCK OFF CACHE BOOL "")
    set(INSTALL_GTEST OFF CACHE BOOL "")
    add_subdirectory("${LOCKSTEP_DEPS_DIR}/googletest" "${CMAKE_BINARY_DIR}/_deps/googletest"
                     EXCLUDE_FROM_ALL)
    if(NOT TARGET GTest::gtest_main)
      add_library(GTest::gtest ALIAS gtest)
      add_library(GTest::gtest_main ALIAS gtest_main)
    endif()
    set(GTest_FOUND TRUE)
  endif()
  lockstep_require(GTest_FOUND "GoogleTest" libgtest-dev)
endif()

if(LOCKSTEP_WITH_MPI STREQUAL "OFF")
  set(LOCKSTEP_HAVE_MPI OFF)
else()
  find_package(MPI QUIET COMPONENTS C)
  if(LOCKSTEP_WITH_MPI STREQUAL "ON")
    lockstep_require(MPI_C_FOUND "MPI (LOCKSTEP_WITH_MPI=ON)" libopenmpi-dev)
  endif()
  set(LOCKSTEP_HAVE_MPI ${MPI_C_FOUND})
endif()
if(LOCKSTEP_HAVE_MPI)
  set(LOCKSTEP_MPI_STATUS ", mpi")
elseif(LOCKSTEP_WITH_MPI STREQUAL "OFF")
  set(LOCKSTEP_MPI_STATUS " (mpi off: LOCKSTEP_WITH_MPI=OFF)")
else()
  set(LOCKSTEP_MPI_STATUS " (mpi off: OpenMPI not found; apt-get install libopenmpi-dev to build it)")
endif()
