# Every dependency, found once. A missing one stops the configure with the Debian package
# that provides it (scripts/install-deps.sh installs them all); only MPI is optional.

function(lockstep_require found what package)
  if(NOT ${found})
    message(FATAL_ERROR "lockstep needs ${what}: apt-get install ${package} "
                        "(or run scripts/install-deps.sh)")
  endif()
endfunction()

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
