# The CUDA parts (docs/gpu.md): the QSGD codec's kernels (src/compress/cuda/) and the NCCL
# backend (src/comm/backends/nccl/). Included after Dependencies.cmake and
# CompilerFlags.cmake, since it needs Torch and adjusts the warning flags for nvcc.
#
# LOCKSTEP_CUDA: AUTO (default) builds them when the libtorch found has CUDA and nvcc and
# NCCL are found; OFF never; ON fails the configure naming what is missing. Debian's
# libtorch is CPU-only, so AUTO changes nothing there (no CUDA language is even probed).
set(LOCKSTEP_CUDA AUTO CACHE STRING "Build the CUDA codec kernels and the NCCL backend: AUTO, ON, OFF")
set_property(CACHE LOCKSTEP_CUDA PROPERTY STRINGS AUTO ON OFF)
# sm_80 (A100) and sm_90 (H100, the GPU this project is lent); 90 also embeds PTX, which
# newer GPUs (sm_100, ...) JIT-compile. Each architecture is one more device compile of
# the kernels: CI (2 cores, no GPU) pays for both. CUDA 13 supports nothing below sm_75.
set(LOCKSTEP_CUDA_ARCHITECTURES "80-real;90" CACHE STRING "CUDA architectures of the kernels")

set(LOCKSTEP_HAVE_CUDA OFF)
set(_lockstep_cuda_missing "")  # short, for the summary line
set(_lockstep_cuda_fix "")      # with the fix, for LOCKSTEP_CUDA=ON's error
if(NOT LOCKSTEP_CUDA STREQUAL "OFF")
  # A CUDA libtorch (a CUDA wheel): Caffe2's cuda.cmake has set CAFFE2_USE_CUDA and
  # made torch::cudart.
  if(NOT CAFFE2_USE_CUDA OR NOT TARGET torch::cudart)
    list(APPEND _lockstep_cuda_missing "the libtorch found is CPU-only")
    list(APPEND _lockstep_cuda_fix
         "a libtorch built with CUDA (the one found, ${Torch_VERSION}, is CPU-only: configure with \
-DCMAKE_PREFIX_PATH=<a CUDA torch wheel's torch.utils.cmake_prefix_path>)")
  else()
    include(CheckLanguage)
    check_language(CUDA)
    if(NOT CMAKE_CUDA_COMPILER)
      list(APPEND _lockstep_cuda_missing "no nvcc")
      list(APPEND _lockstep_cuda_fix "nvcc (the CUDA toolkit: put its bin/ on PATH or set CUDACXX)")
    endif()
    # NCCL: the wheel's own (nvidia/nccl, the one libtorch_cuda loads: two libnccl.so.2 in
    # one process would clash) before the toolkit's or the system's.
    set(_lockstep_wheel_nccl "${TORCH_INSTALL_PREFIX}/../nvidia/nccl")
    find_path(LOCKSTEP_NCCL_INCLUDE nccl.h
              HINTS "${_lockstep_wheel_nccl}/include" ENV NCCL_HOME PATH_SUFFIXES include
              PATHS /usr/local/cuda/include)
    find_library(LOCKSTEP_NCCL_LIBRARY NAMES nccl libnccl.so.2 NAMES_PER_DIR
                 HINTS "${_lockstep_wheel_nccl}/lib" ENV NCCL_HOME PATH_SUFFIXES lib lib64
                 PATHS /usr/local/cuda/lib64)
    if(NOT LOCKSTEP_NCCL_INCLUDE OR NOT LOCKSTEP_NCCL_LIBRARY)
      list(APPEND _lockstep_cuda_missing "no NCCL")
      list(APPEND _lockstep_cuda_fix
           "NCCL (nccl.h: ${LOCKSTEP_NCCL_INCLUDE}, libnccl: ${LOCKSTEP_NCCL_LIBRARY}: pip's \
nvidia-nccl-cu13 beside the wheel, apt-get install libnccl-dev, or set NCCL_HOME)")
    endif()
  endif()
  if(_lockstep_cuda_missing)
    if(LOCKSTEP_CUDA STREQUAL "ON")
      string(REPLACE ";" "; and " _m "${_lockstep_cuda_fix}")
      message(FATAL_ERROR "LOCKSTEP_CUDA=ON but lockstep's CUDA build needs ${_m}. "
                          "Configure with -DLOCKSTEP_CUDA=AUTO or OFF to build without CUDA.")
    endif()
  else()
    set(LOCKSTEP_HAVE_CUDA ON)
  endif()
endif()

if(LOCKSTEP_HAVE_CUDA)
  enable_language(CUDA)
  # Caffe2's cuda.cmake appended its own build's flags to CMAKE_CUDA_FLAGS: -gencode for a
  # dozen architectures (sm_50, which CUDA 13 refuses, to sm_120) and its nvcc options.
  # lockstep's kernels take only the user's flags and LOCKSTEP_CUDA_ARCHITECTURES.
  set(CMAKE_CUDA_FLAGS "$CACHE{CMAKE_CUDA_FLAGS}")
  # The host side is C++17 or 20 like the rest; the .cu files include no libtorch header
  # (which wants C++20 from 2.14 on), only lockstep's plain ones, so C++17 is enough.
  set(CMAKE_CUDA_STANDARD 17)
  set(CMAKE_CUDA_STANDARD_REQUIRED ON)
  set(CMAKE_CUDA_EXTENSIONS OFF)
  # One CUDA runtime in the process: libtorch's (torch::cudart, the wheel's libcudart.so),
  # not CMake's default static cudart of the toolkit in every target with CUDA code.
  set(CMAKE_CUDA_RUNTIME_LIBRARY None)
  if(CCACHE_PROGRAM)
    set(CMAKE_CUDA_COMPILER_LAUNCHER ${CCACHE_PROGRAM})
  endif()
  # nvcc does not take GCC's -Wall/-Wextra/-Werror: CompilerFlags.cmake's options are
  # kept for C and C++ and handed to the host compiler of .cu files through -Xcompiler.
  get_property(_lockstep_opts DIRECTORY PROPERTY COMPILE_OPTIONS)
  set(_lockstep_c_opts "")
  set(_lockstep_host_opts "")
  foreach(_o IN LISTS _lockstep_opts)
    list(APPEND _lockstep_c_opts "$<$<COMPILE_LANGUAGE:C,CXX>:${_o}>")
    if(_o MATCHES "^-W")
      list(APPEND _lockstep_host_opts "$<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=${_o}>")
    endif()
  endforeach()
  set_property(DIRECTORY PROPERTY COMPILE_OPTIONS ${_lockstep_c_opts} ${_lockstep_host_opts})
  if(LOCKSTEP_WERROR)
    add_compile_options("$<$<COMPILE_LANGUAGE:CUDA>:-Werror=all-warnings>")
  endif()
  set(LOCKSTEP_CUDA_STATUS ", nccl (CUDA ${CMAKE_CUDA_COMPILER_VERSION}, sm ${LOCKSTEP_CUDA_ARCHITECTURES})")
elseif(LOCKSTEP_CUDA STREQUAL "OFF")
  set(LOCKSTEP_CUDA_STATUS " (nccl and CUDA off: LOCKSTEP_CUDA=OFF)")
else()
  string(REPLACE ";" ", " _m "${_lockstep_cuda_missing}")
  set(LOCKSTEP_CUDA_STATUS " (nccl and CUDA off: ${_m})")
endif()
# The subdirectories test LOCKSTEP_CUDA as a boolean: AUTO resolved to ON or OFF.
set(LOCKSTEP_CUDA ${LOCKSTEP_HAVE_CUDA})

# The codec kernels' flags (src/compress/cuda/): bit-identical to the CPU codec needs every
# float op rounded on its own, as the CPU does (x86-64 baseline has no FMA): no contraction
# into FMAs (--fmad=false), IEEE division and square root (nvcc's defaults, restated), and
# denormals kept (-ftz=false). Never --use_fast_math.
set(LOCKSTEP_CUDA_CODEC_FLAGS --fmad=false -prec-div=true -prec-sqrt=true -ftz=false)
