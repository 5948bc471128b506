# DiLoCo, Streaming DiLoCo and local SGD against a single-process simulation of every
# replica: shm and gloo at 1-3 ranks, mpi at 2, hier at 2x2. Included from tests/multiprocess.
add_executable(diloco_check ${CMAKE_CURRENT_LIST_DIR}/diloco_check.cpp)
target_link_libraries(diloco_check PRIVATE lockstep_parallel)
foreach(np 1 2 3)
  foreach(backend shm gloo)
    add_test(NAME diloco_${backend}_np${np}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:diloco_check>)
    set_tests_properties(diloco_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
      LABELS "multiprocess;diloco")
  endforeach()
endforeach()
if(LOCKSTEP_HAVE_MPI)
  add_test(NAME diloco_mpi_np2
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np 2 $<TARGET_FILE:diloco_check>)
  set_tests_properties(diloco_mpi_np2 PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
    LABELS "multiprocess;diloco")
endif()
add_test(NAME diloco_hier_2x2
         COMMAND ${PROJECT_SOURCE_DIR}/tests/multiprocess/nodes.sh $<TARGET_FILE:lockstep-run> 2 2
                 $<TARGET_FILE:diloco_check>)
set_tests_properties(diloco_hier_2x2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
  LABELS "multiprocess;diloco")
