# Compressed collectives on every backend, 1-4 ranks, and two levels on hier. Included from
# tests/multiprocess. compress_check: the compressed allreduce (DDP's QSGD);
# shard_compress_check: FSDP's QSGD reduce-scatter and quantized all-gather.
foreach(prog compress shard_compress)
  add_executable(${prog}_check ${CMAKE_CURRENT_LIST_DIR}/${prog}_check.cpp)
  target_link_libraries(${prog}_check PRIVATE lockstep_parallel)
  target_include_directories(${prog}_check PRIVATE ${PROJECT_SOURCE_DIR}/src)  # device_exchange.h
  foreach(np 1 2 3 4)
    foreach(backend shm gloo)
      add_test(NAME ${prog}_${backend}_np${np}
               COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                       $<TARGET_FILE:${prog}_check>)
      set_tests_properties(${prog}_${backend}_np${np} PROPERTIES
        ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
        LABELS multiprocess)
    endforeach()
    if(LOCKSTEP_HAVE_MPI)
      add_test(NAME ${prog}_mpi_np${np}
               COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np ${np} $<TARGET_FILE:${prog}_check>)
      set_tests_properties(${prog}_mpi_np${np} PROPERTIES
        ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS multiprocess)
    endif()
  endforeach()

  # Two levels (hier, 2 "nodes" x 2 ranks on this host): full precision inside each node,
  # QSGD only between nodes (QsgdOptions::across_nodes_only); same bounds and checks.
  add_test(NAME ${prog}_hier_2x2
           COMMAND ${PROJECT_SOURCE_DIR}/tests/multiprocess/nodes.sh $<TARGET_FILE:lockstep-run> 2 2
                   $<TARGET_FILE:${prog}_check>)
  set_tests_properties(${prog}_hier_2x2 PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS multiprocess)
endforeach()
