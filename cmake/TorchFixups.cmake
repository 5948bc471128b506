# Corrections to what TorchConfig.cmake gives for a libtorch from a pip wheel, applied right
# after find_package(Torch) by lockstep's build (cmake/Dependencies.cmake) and by
# lockstep-config.cmake (so a user's program links the same way). Nothing changes for
# Debian's libtorch.
#  - c10: TorchConfig's find_library(c10) searches the system directories before the
#    wheel's lib/, so next to Debian's libtorch it takes /usr/lib/<arch>/libc10.so: two
#    c10s in one program. The one beside the libtorch found is used instead.
#  - CUDA: a CUDA wheel links torch::cudart and nvrtc from the CUDA toolkit that Caffe2's
#    cuda.cmake finds on the machine, whose version need not be the wheel's; its lib
#    directory then leads the RPATH and the linker resolves libtorch_cuda's NCCL there
#    (undefined ncclComm* symbols with a 13.0 toolkit and a cu132 wheel). The CUDA runtime
#    the wheel ships (site-packages/nvidia/*/lib) is used instead, and nvrtc is left to
#    libtorch_cuda, which loads its own (lockstep's CUDA parts use only the runtime).
if(NOT DEFINED TORCH_INSTALL_PREFIX)
  return()
endif()
# Caffe2 (libtorch's targets) must come from the same libtorch as Torch: TorchConfig finds
# it on CMAKE_PREFIX_PATH and the system paths before its own directory, so -DTorch_DIR=<a
# wheel> alone, next to Debian's libtorch, mixes the two.
if(Caffe2_DIR)
  get_filename_component(_lockstep_caffe2 "${Caffe2_DIR}/../../.." REALPATH)
  get_filename_component(_lockstep_torch "${TORCH_INSTALL_PREFIX}" REALPATH)
  if(NOT _lockstep_caffe2 STREQUAL _lockstep_torch AND EXISTS "${TORCH_INSTALL_PREFIX}/share/cmake/Caffe2")
    message(FATAL_ERROR "libtorch: Torch_DIR is ${Torch_DIR} but Caffe2 came from ${Caffe2_DIR}: "
            "configure with -DCMAKE_PREFIX_PATH=<torch.utils.cmake_prefix_path> (or set Caffe2_DIR "
            "to ${TORCH_INSTALL_PREFIX}/share/cmake/Caffe2 as well)")
  endif()
endif()
set(_lockstep_torch_lib "${TORCH_INSTALL_PREFIX}/lib")
if(c10_LIBRARY AND EXISTS "${_lockstep_torch_lib}/libc10.so")
  get_filename_component(_lockstep_c10_dir "${c10_LIBRARY}" DIRECTORY)
  get_filename_component(_lockstep_c10_dir "${_lockstep_c10_dir}" REALPATH)
  get_filename_component(_lockstep_real_lib "${_lockstep_torch_lib}" REALPATH)
  if(NOT _lockstep_c10_dir STREQUAL _lockstep_real_lib)
    list(REMOVE_ITEM TORCH_LIBRARIES "${c10_LIBRARY}")
    list(APPEND TORCH_LIBRARIES "${_lockstep_torch_lib}/libc10.so")
  endif()
endif()
if(TARGET torch::cudart)
  file(GLOB _lockstep_cudart "${TORCH_INSTALL_PREFIX}/../nvidia/*/lib/libcudart.so.*")
  if(_lockstep_cudart)
    list(GET _lockstep_cudart 0 _lockstep_cudart)
    set_property(TARGET torch::cudart PROPERTY INTERFACE_LINK_LIBRARIES "${_lockstep_cudart}")
    if(CUDA_NVRTC_LIB)
      list(REMOVE_ITEM TORCH_LIBRARIES ${CUDA_NVRTC_LIB})
    endif()
  endif()
endif()
