# Multi-process tests of numerics/ (activation checkpointing); included from tests/multiprocess/CMakeLists.txt.
# activation_checkpoint_check trains DDP and FSDP models with and without activation
# checkpointing side by side and compares them (bit-identical expected); a few seconds per run.
add_executable(activation_checkpoint_check ${CMAKE_CURRENT_LIST_DIR}/activation_checkpoint_check.cpp)
target_link_libraries(activation_checkpoint_check PRIVATE lockstep_parallel lockstep_numerics)

foreach(np 2 3)
  foreach(backend shm gloo)
    add_test(NAME activation_checkpoint_${backend}_np${np}
             COMMAND ${RUN} --nproc-per-node ${np} --master-port 0 $<TARGET_FILE:activation_checkpoint_check>)
    set_tests_properties(activation_checkpoint_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180
      LABELS "multiprocess;numerics")
  endforeach()
endforeach()
