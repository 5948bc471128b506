# Op fingerprints and the stall inspector (docs/debugging.md). Included from tests/multiprocess.
# LOCKSTEP_TIMEOUT_S is long on purpose: a mismatch found only by the timeout fails
# op_check's "promptly" check (5 s) instead of passing late.
add_executable(op_check ${CMAKE_CURRENT_LIST_DIR}/op_check.cpp)
target_link_libraries(op_check PRIVATE lockstep_comm lockstep_launch CLI11::CLI11)

set(OP_RUN $<TARGET_FILE:lockstep-run> --master-port 0 --nproc-per-node)
set(OP_MPIRUN ${PROJECT_SOURCE_DIR}/scripts/mpirun.sh -np)
set(OP_DETAIL "LOCKSTEP_DEBUG=DETAIL;LOCKSTEP_CHECK_COLLECTIVES=0")  # the store check alone

function(op_test name env)  # the command follows
  add_test(NAME ${name} COMMAND ${ARGN})
  set_tests_properties(${name} PROPERTIES ENVIRONMENT "${env};LOCKSTEP_TIMEOUT_S=60" TIMEOUT 120
                                          LABELS multiprocess)
endfunction()

# Rank 0 enters allgather #4, the others barrier #4 (kind); or 1024 vs 1000 elements
# (count); or float32 vs float64 (dtype). shm checks in its segment, gloo by default with
# one allgather per op, gloo and mpi with LOCKSTEP_DEBUG=DETAIL through the store (mpi,
# which has none, by the allgather).
foreach(case kind count dtype)
  set(prog $<TARGET_FILE:op_check> --case ${case} --within 5)
  op_test(op_mismatch_${case}_shm "LOCKSTEP_BACKEND=shm" ${OP_RUN} 3 ${prog})
  op_test(op_mismatch_${case}_gloo "LOCKSTEP_BACKEND=gloo" ${OP_RUN} 3 ${prog})
  op_test(op_mismatch_${case}_gloo_detail "LOCKSTEP_BACKEND=gloo;${OP_DETAIL}" ${OP_RUN} 3 ${prog})
  if(LOCKSTEP_HAVE_MPI)
    op_test(op_mismatch_${case}_mpi_detail "LOCKSTEP_BACKEND=mpi;${OP_DETAIL}" ${OP_MPIRUN} 2 ${prog})
    # A broken MPI group ends the job with MPI_Abort (exit status 1) whatever the checks
    # said: both ranks' tallies decide.
    set_tests_properties(op_mismatch_${case}_mpi_detail PROPERTIES
      PASS_REGULAR_EXPRESSION "rank [01]: 5 passed, 0 failed.*rank [01]: 5 passed, 0 failed"
      FAIL_REGULAR_EXPRESSION " FAIL ")
  endif()
endforeach()

# A rank sleeps 3 s before op #4 with LOCKSTEP_STALL_WARN_S=1: rank 0 reports it, the job
# then completes.
set(prog $<TARGET_FILE:op_check> --stall 3)
set(warn "LOCKSTEP_STALL_WARN_S=1")
op_test(op_stall_shm "LOCKSTEP_BACKEND=shm;${warn}" ${OP_RUN} 3 ${prog})
op_test(op_stall_shm_late0 "LOCKSTEP_BACKEND=shm;${warn}" ${OP_RUN} 2 ${prog} --late 0)
op_test(op_stall_gloo "LOCKSTEP_BACKEND=gloo;${warn}" ${OP_RUN} 3 ${prog})
op_test(op_stall_gloo_late0 "LOCKSTEP_BACKEND=gloo;${warn}" ${OP_RUN} 2 ${prog} --late 0)
op_test(op_stall_gloo_detail "LOCKSTEP_BACKEND=gloo;${warn};${OP_DETAIL}" ${OP_RUN} 2 ${prog})
if(LOCKSTEP_HAVE_MPI)
  op_test(op_stall_mpi "LOCKSTEP_BACKEND=mpi;${warn}" ${OP_MPIRUN} 2 ${prog})
endif()
