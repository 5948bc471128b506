# Mixed-precision multi-process tests (included from tests/multiprocess/CMakeLists.txt):
# the distributed gradient scaler under DDP and FSDP, an inf on one rank only.
add_executable(grad_scaler_check ${CMAKE_CURRENT_LIST_DIR}/grad_scaler_check.cpp)
target_link_libraries(grad_scaler_check PRIVATE lockstep_parallel lockstep_numerics)

foreach(np 1 2 3)
  foreach(backend shm gloo)
    add_test(NAME grad_scaler_${backend}_np${np}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:grad_scaler_check>)
    set_tests_properties(grad_scaler_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
      LABELS "multiprocess;numerics")
  endforeach()
endforeach()
if(LOCKSTEP_HAVE_MPI)
  add_test(NAME grad_scaler_mpi_np2
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np 2 $<TARGET_FILE:grad_scaler_check>)
  set_tests_properties(grad_scaler_mpi_np2 PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
    LABELS "multiprocess;numerics")
endif()
