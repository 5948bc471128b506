# `make package` (cpack -G DEB): lockstep_<version>_<arch>.deb for Debian 12, installing
# under /usr what `cmake --install` installs (cmake/Install.cmake). Its Depends: the
# -dev packages a user's build needs (the headers and find_package(lockstep) name
# libtorch, MPI and the static layers' private dependencies: zlib, libcrypto, toml++,
# json) plus what dpkg-shlibdeps finds for lockstep-run and lockstep-train. Only a build against Debian's libtorch makes
# a package that installs: a pip/zip libtorch is not a Debian package to depend on.
set(CPACK_GENERATOR DEB)
set(CPACK_PACKAGE_NAME lockstep)
set(CPACK_PACKAGE_VENDOR "lockstep")
set(CPACK_PACKAGE_CONTACT "lockstep maintainers <lockstep@localhost>")
set(CPACK_PACKAGE_DESCRIPTION_SUMMARY
    "distributed data-parallel training for the PyTorch C++ API (libtorch)")
set(CPACK_PACKAGE_DESCRIPTION
    "DDP, FSDP, gradient compression and a config-driven trainer over shm, gloo and MPI \
backends; headers, libraries, a CMake package (find_package(lockstep)), lockstep.pc and \
the lockstep-run launcher and lockstep-train trainer.")
set(CPACK_PACKAGE_VERSION ${PROJECT_VERSION})
set(CPACK_PACKAGING_INSTALL_PREFIX /usr)
set(CPACK_DEBIAN_FILE_NAME DEB-DEFAULT)
set(CPACK_DEBIAN_PACKAGE_SECTION devel)
set(CPACK_DEBIAN_PACKAGE_HOMEPAGE "https://example.invalid/lockstep")
# gzip: a few seconds for the static libraries where xz takes a minute on 2 cores.
set(CPACK_DEBIAN_COMPRESSION_TYPE gzip)
set(CPACK_DEBIAN_PACKAGE_SHLIBDEPS ON)
# The libtorch minor version lockstep was built against (no stable ABI across minors).
string(REGEX MATCH "^([0-9]+)\\.([0-9]+)" _torch_mm "${Torch_VERSION}")
math(EXPR _torch_next "${CMAKE_MATCH_2} + 1")
set(_deb_depends "libtorch-dev (>= ${_torch_mm})" "libtorch-dev (<< ${CMAKE_MATCH_1}.${_torch_next}~)"
                 libopenblas0-pthread libcli11-dev)
if(LOCKSTEP_HAVE_MPI)
  list(APPEND _deb_depends libopenmpi-dev)
endif()
if(NOT BUILD_SHARED_LIBS)
  list(APPEND _deb_depends zlib1g-dev libssl-dev libtomlplusplus-dev nlohmann-json3-dev)
endif()
list(JOIN _deb_depends ", " CPACK_DEBIAN_PACKAGE_DEPENDS)
# bible-kjv(-text): the text lockstep-train's language-model workload trains on (configs/lm-*.toml).
set(CPACK_DEBIAN_PACKAGE_SUGGESTS "cmake, pkg-config, openmpi-bin, bible-kjv, bible-kjv-text")
include(CPack)
