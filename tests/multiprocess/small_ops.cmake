# Small collectives back to back, checked exactly by every rank (small_ops_check.cpp):
# the shm latency paths and the ProcessGroup's run-by-the-waiter path. gloo as a reference.
add_executable(small_ops_check ${CMAKE_CURRENT_LIST_DIR}/small_ops_check.cpp)
target_link_libraries(small_ops_check PRIVATE lockstep_comm)
foreach(np 2 3 4)
  add_test(NAME collectives_small_ops_shm_np${np}
           COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                   $<TARGET_FILE:small_ops_check>)
  set_tests_properties(collectives_small_ops_shm_np${np} PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=shm;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS multiprocess)
endforeach()
add_test(NAME collectives_small_ops_gloo_np2
         COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node 2 --master-port 0
                 $<TARGET_FILE:small_ops_check>)
set_tests_properties(collectives_small_ops_gloo_np2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=gloo;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS multiprocess)
