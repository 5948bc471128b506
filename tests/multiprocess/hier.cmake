# The hierarchical backend (shm inside each node, gloo across) on one host: each "node" is
# its own lockstep-run --nnodes N --node-rank i (nodes.sh). Across real hosts:
# tests/multihost/.
set(NODES ${CMAKE_CURRENT_LIST_DIR}/nodes.sh)
set(HIER_RUN $<TARGET_FILE:lockstep-run>)
# nodes x ranks per node; 2x1 asks for hier with one rank per node (auto would pick gloo).
foreach(shape 2x2 2x1 3x2 2x3)
  string(REPLACE "x" ";" dims ${shape})
  list(GET dims 0 nnodes)
  list(GET dims 1 nproc)
  add_test(NAME collectives_hier_${shape}
           COMMAND ${NODES} ${HIER_RUN} ${nnodes} ${nproc} $<TARGET_FILE:collectives_check>)
  set_tests_properties(collectives_hier_${shape} PROPERTIES
    ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 300
    LABELS multiprocess PASS_REGULAR_EXPRESSION "rank 0/[0-9]+ \\[hier\\]: [0-9]+ passed, 0 failed")
endforeach()
# auto: a multi-node job with several ranks per node is hierarchical.
add_test(NAME collectives_auto_multinode
         COMMAND ${NODES} ${HIER_RUN} 2 2 $<TARGET_FILE:collectives_check>)
set_tests_properties(collectives_auto_multinode PROPERTIES
  ENVIRONMENT "LOCKSTEP_TIMEOUT_S=60" TIMEOUT 300 LABELS multiprocess
  PASS_REGULAR_EXPRESSION "rank 0/4 \\[hier\\]: [0-9]+ passed, 0 failed")
add_test(NAME ddp_equivalence_hier_2x2
         COMMAND ${NODES} ${HIER_RUN} 2 2 $<TARGET_FILE:ddp_equivalence>)
set_tests_properties(ddp_equivalence_hier_2x2 PROPERTIES
  ENVIRONMENT "LOCKSTEP_BACKEND=hier;LOCKSTEP_TIMEOUT_S=60" TIMEOUT 180 LABELS "multiprocess;ddp")
