# DDP multi-process tests (included from tests/multiprocess/CMakeLists.txt).
# Each program computes its single-process reference itself, so it runs
# standalone under lockstep-run or mpirun. Total well under a minute on 2 cores.
add_executable(ddp_equivalence ${CMAKE_CURRENT_LIST_DIR}/ddp_equivalence.cpp)
target_link_libraries(ddp_equivalence PRIVATE lockstep_parallel lockstep_launch CLI11::CLI11)

set(DDP_RUN $<TARGET_FILE:lockstep-run>)
set(DDP_MPIRUN ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh)
set(DDP_BACKENDS shm gloo)
foreach(np 1 2 3)
  foreach(backend ${DDP_BACKENDS})
    add_test(NAME ddp_equivalence_${backend}_np${np}
             COMMAND ${DDP_RUN} --nproc-per-node ${np} --master-port 0 $<TARGET_FILE:ddp_equivalence>)
    set_tests_properties(ddp_equivalence_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
      LABELS "multiprocess;ddp")
  endforeach()
  if(LOCKSTEP_HAVE_MPI)
    add_test(NAME ddp_equivalence_mpi_np${np}
             COMMAND ${DDP_MPIRUN} -np ${np} $<TARGET_FILE:ddp_equivalence>)
    set_tests_properties(ddp_equivalence_mpi_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
      LABELS "multiprocess;ddp")
  endif()
endforeach()

# mpirun on one node with no LOCKSTEP_BACKEND: shm (shared buckets) over an MPI-bootstrapped
# store.
if(LOCKSTEP_HAVE_MPI)
  add_test(NAME ddp_equivalence_mpirun_auto_np2
           COMMAND env -u LOCKSTEP_BACKEND -u MASTER_PORT -u MASTER_ADDR
                   ${DDP_MPIRUN} -np 2 $<TARGET_FILE:ddp_equivalence>)
  set_tests_properties(ddp_equivalence_mpirun_auto_np2 PROPERTIES
    ENVIRONMENT "LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS "multiprocess;ddp")
endif()

foreach(np 2 3)
  foreach(backend ${DDP_BACKENDS})
    add_test(NAME ddp_model_mismatch_${backend}_np${np}
             COMMAND ${DDP_RUN} --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:ddp_equivalence> --mismatch)
    set_tests_properties(ddp_model_mismatch_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=30" TIMEOUT 120
      LABELS "multiprocess;ddp")
  endforeach()
endforeach()
