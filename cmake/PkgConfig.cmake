# lockstep.pc for builds without CMake: `pkg-config --cflags --libs lockstep` gives the
# headers, every layer but the launcher, libtorch (no .pc of its own, so its include
# directories and libraries are spelled out here), Threads and, when built with it, MPI.
# Relocatable: the prefix is found from the .pc file's own place (${pcfiledir}).
get_filename_component(_torch_libdir "${TORCH_LIBRARY}" DIRECTORY)
set(_torch_libs -ltorch -ltorch_cpu -lc10)
if(C10_CUDA_LIBRARY)  # a CUDA libtorch (the pip wheels): its CUDA half registers itself
  list(APPEND _torch_libs -ltorch_cuda -lc10_cuda)
endif()
set(_pc_libs_torch "-L${_torch_libdir}")
if(NOT _torch_libdir IN_LIST CMAKE_CXX_IMPLICIT_LINK_DIRECTORIES)
  string(APPEND _pc_libs_torch " -Wl,-rpath,${_torch_libdir}")
endif()
list(JOIN _torch_libs " " _torch_libs)
string(APPEND _pc_libs_torch " ${_torch_libs}")

set(_pc_cflags)
foreach(dir ${TORCH_INCLUDE_DIRS})
  if(NOT dir IN_LIST CMAKE_CXX_IMPLICIT_INCLUDE_DIRECTORIES)
    string(APPEND _pc_cflags " -I${dir}")
  endif()
endforeach()
string(APPEND _pc_cflags " ${TORCH_CXX_FLAGS}")
if(Torch_VERSION VERSION_GREATER_EQUAL 2.14)
  string(APPEND _pc_cflags " -std=c++20")  # libtorch >= 2.14's headers refuse C++17
else()
  string(APPEND _pc_cflags " -std=c++17")
endif()

set(_pc_requires)
if(LOCKSTEP_HAVE_MPI)
  string(APPEND _pc_cflags " -DLOCKSTEP_HAVE_MPI=1 -DOMPI_SKIP_MPICXX=1")
  list(APPEND _pc_requires ompi-c)
endif()
# Static layers: their private dependencies go on the user's link line too.
set(_pc_static_libs)
if(NOT BUILD_SHARED_LIBS)
  list(APPEND _pc_requires zlib libcrypto tomlplusplus)
  set(_pc_static_libs " -lrt")
endif()
list(JOIN _pc_requires ", " _pc_requires)

set(_pc_layers)
foreach(layer train parallel numerics compress comm data models)
  string(APPEND _pc_layers " -llockstep_${layer}")
endforeach()
# Relative to ${prefix}, whatever CMAKE_INSTALL_PREFIX the package is installed under.
file(RELATIVE_PATH _pc_up "/${CMAKE_INSTALL_LIBDIR}/pkgconfig" "/")
string(REGEX REPLACE "/$" "" _pc_up "${_pc_up}")
file(WRITE ${PROJECT_BINARY_DIR}/lockstep.pc
"prefix=\${pcfiledir}/${_pc_up}
includedir=\${prefix}/${CMAKE_INSTALL_INCLUDEDIR}
libdir=\${prefix}/${CMAKE_INSTALL_LIBDIR}

Name: lockstep
Description: distributed data-parallel training for the PyTorch C++ API (libtorch ${Torch_VERSION})
Version: ${PROJECT_VERSION}
Requires: ${_pc_requires}
Cflags: -I\${includedir}${_pc_cflags}
Libs: -L\${libdir}${_pc_layers} ${_pc_libs_torch} -pthread${_pc_static_libs}
Libs.private: -lrt
")
install(FILES ${PROJECT_BINARY_DIR}/lockstep.pc DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
