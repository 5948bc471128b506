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

# Two levels (hier, 2 "nodes" x 2 ranks on this host): full precision inside each node,
# QSGD only between nodes (QsgdOptions::across_nodes_only); same bounds and checks.
add_test(NAME compress_hier_2x2
         COMMAND ${PROJECT_SOURCE_DIR}/tests/multiprocess/nodes.sh $<TARGET_FILE:lockstep-run> 2 2
                 $<TARGET_FILE:compress_check>)
set_tests_properties(compress_hier_2x2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS multiprocess)

# FSDP's compressed collectives (QSGD reduce-scatter, quantized all-gather): every backend,
# 1-4 ranks, and two levels on hier (tests/multiprocess/shard_compress_check.cpp).
add_executable(shard_compress_check ${CMAKE_CURRENT_LIST_DIR}/shard_compress_check.cpp)
target_link_libraries(shard_compress_check PRIVATE lockstep_parallel)
foreach(np 1 2 3 4)
  foreach(backend shm gloo)
    add_test(NAME shard_compress_${backend}_np${np}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:shard_compress_check>)
    set_tests_properties(shard_compress_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
      LABELS multiprocess)
  endforeach()
endforeach()
if(LOCKSTEP_HAVE_MPI)
  add_test(NAME shard_compress_mpi_np3
           COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np 3 $<TARGET_FILE:shard_compress_check>)
  set_tests_properties(shard_compress_mpi_np3 PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS multiprocess)
endif()
add_test(NAME shard_compress_hier_2x2
         COMMAND ${PROJECT_SOURCE_DIR}/tests/multiprocess/nodes.sh $<TARGET_FILE:lockstep-run> 2 2
                 $<TARGET_FILE:shard_compress_check>)
set_tests_properties(shard_compress_hier_2x2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS multiprocess)
