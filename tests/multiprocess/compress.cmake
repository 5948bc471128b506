# Compressed allreduce: every backend, 1-4 ranks. Included from tests/multiprocess.
add_executable(compress_check ${CMAKE_CURRENT_LIST_DIR}/compress_check.cpp)
target_link_libraries(compress_check PRIVATE lockstep_parallel)
foreach(np 1 2 3 4)
  foreach(backend shm gloo)
    add_test(NAME compress_${backend}_np${np}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:compress_check>)
    set_tests_properties(compress_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
      LABELS multiprocess)
  endforeach()
  if(LOCKSTEP_HAVE_MPI)
    add_test(NAME compress_mpi_np${np}
             COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np ${np} $<TARGET_FILE:compress_check>)
    set_tests_properties(compress_mpi_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS multiprocess)
  endif()
endforeach()
