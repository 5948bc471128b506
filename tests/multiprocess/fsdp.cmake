# FSDP multi-process tests (included from tests/multiprocess/CMakeLists.txt). The program
# computes its single-process reference itself, so it runs standalone under lockstep-run
# or mpirun.
add_executable(fsdp_equivalence ${CMAKE_CURRENT_LIST_DIR}/fsdp_equivalence.cpp)
target_link_libraries(fsdp_equivalence PRIVATE lockstep_parallel lockstep_launch CLI11::CLI11)

foreach(np 1 2 3 4)
  foreach(backend shm gloo)
    add_test(NAME fsdp_equivalence_${backend}_np${np}
             COMMAND ${RUN} --nproc-per-node ${np} --master-port 0 $<TARGET_FILE:fsdp_equivalence>)
    set_tests_properties(fsdp_equivalence_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 300
      LABELS "multiprocess;fsdp")
  endforeach()
endforeach()
if(LOCKSTEP_HAVE_MPI)
  # np 4: hybrid_shard over two "nodes" of two ranks (MPI_Comm_split subgroups).
  foreach(np 3 4)
    add_test(NAME fsdp_equivalence_mpi_np${np}
             COMMAND ${MPIRUN} -np ${np} $<TARGET_FILE:fsdp_equivalence>)
    set_tests_properties(fsdp_equivalence_mpi_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 300
      LABELS "multiprocess;fsdp")
  endforeach()
endif()
foreach(backend shm gloo)
  add_test(NAME fsdp_model_mismatch_${backend}_np2
           COMMAND ${RUN} --nproc-per-node 2 --master-port 0 $<TARGET_FILE:fsdp_equivalence> --mismatch)
  set_tests_properties(fsdp_model_mismatch_${backend}_np2 PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=30" TIMEOUT 120
    LABELS "multiprocess;fsdp")
endforeach()

# Sharded checkpoints: written at 4 ranks, loaded at 1, 2 and 3 (reshard on load).
set(FSDP_CKPT ${CMAKE_CURRENT_BINARY_DIR}/fsdp_ckpt)
add_test(NAME fsdp_sharded_save_np4
         COMMAND ${RUN} --nproc-per-node 4 --master-port 0 $<TARGET_FILE:fsdp_equivalence>
                 --save-sharded ${FSDP_CKPT})
set_tests_properties(fsdp_sharded_save_np4 PROPERTIES FIXTURES_SETUP fsdp_ckpt
  ENVIRONMENT "LOCKSTEP_BACKEND=shm;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS "multiprocess;fsdp")
foreach(np 1 2 3)
  add_test(NAME fsdp_sharded_load_np${np}
           COMMAND ${RUN} --nproc-per-node ${np} --master-port 0 $<TARGET_FILE:fsdp_equivalence>
                   --load-sharded ${FSDP_CKPT})
  set_tests_properties(fsdp_sharded_load_np${np} PROPERTIES FIXTURES_REQUIRED fsdp_ckpt
    ENVIRONMENT "LOCKSTEP_BACKEND=gloo;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS "multiprocess;fsdp")
endforeach()
