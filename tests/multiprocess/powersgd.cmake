# The PowerSGD communication hook: shm, gloo and mpi at 1-3 ranks, hier at 2x2; with LOCKSTEP_TEST_PYTHON (a
# Python with torch 2.x: make test-torch2) also against PyTorch's own powerSGD_hook on the
# same inputs. Included from tests/multiprocess.
add_executable(powersgd_check ${CMAKE_CURRENT_LIST_DIR}/powersgd_check.cpp)
target_link_libraries(powersgd_check PRIVATE lockstep_parallel)
foreach(np 1 2 3)
  foreach(backend shm gloo)
    add_test(NAME powersgd_${backend}_np${np}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node ${np} --master-port 0
                     $<TARGET_FILE:powersgd_check>)
    set_tests_properties(powersgd_${backend}_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
      LABELS "multiprocess;ddp")
  endforeach()
  if(LOCKSTEP_HAVE_MPI)
    add_test(NAME powersgd_mpi_np${np}
             COMMAND ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np ${np} $<TARGET_FILE:powersgd_check>)
    set_tests_properties(powersgd_mpi_np${np} PROPERTIES
      ENVIRONMENT "LOCKSTEP_BACKEND=mpi;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120 LABELS "multiprocess;ddp")
  endif()
endforeach()
# Two levels (hier, 2 "nodes" x 2 ranks on this host).
add_test(NAME powersgd_hier_2x2
         COMMAND ${PROJECT_SOURCE_DIR}/tests/multiprocess/nodes.sh $<TARGET_FILE:lockstep-run> 2 2
                 $<TARGET_FILE:powersgd_check>)
set_tests_properties(powersgd_hier_2x2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS "multiprocess;ddp")
foreach(backend shm gloo)
  add_test(NAME powersgd_mismatch_${backend}
           COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node 2 --master-port 0
                   $<TARGET_FILE:powersgd_check> --mismatch)
  set_tests_properties(powersgd_mismatch_${backend} PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=30" TIMEOUT 120
    LABELS "multiprocess;ddp")
endforeach()

if(LOCKSTEP_TEST_PYTHON)
  set(PSGD_REF_DIR ${CMAKE_CURRENT_BINARY_DIR}/powersgd_torch_ref)
  add_test(NAME powersgd_torch_reference
           COMMAND ${LOCKSTEP_TEST_PYTHON} ${CMAKE_CURRENT_LIST_DIR}/powersgd_torch_ref.py
                   ${PSGD_REF_DIR})
  set_tests_properties(powersgd_torch_reference PROPERTIES FIXTURES_SETUP powersgd_torch_ref
    TIMEOUT 120 LABELS "multiprocess;ddp")
  foreach(backend shm gloo)
    add_test(NAME powersgd_torch_${backend}
             COMMAND $<TARGET_FILE:lockstep-run> --nproc-per-node 2 --master-port 0
                     $<TARGET_FILE:powersgd_check> --torch-ref ${PSGD_REF_DIR})
    set_tests_properties(powersgd_torch_${backend} PROPERTIES
      FIXTURES_REQUIRED powersgd_torch_ref
      ENVIRONMENT "LOCKSTEP_BACKEND=${backend};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
      LABELS "multiprocess;ddp")
  endforeach()
endif()
