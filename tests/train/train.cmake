# Tests of the trainer, the CTSM model and the event-log format. Included from tests/
# (include(${PROJECT_SOURCE_DIR}/tests/train/train.cmake)) after GoogleTest is found.

# The generic trainer's unit tests: no workload library (test_train_workload.cpp plugs in
# its own), as a user's program would.
file(GLOB TRAIN_UNIT_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/unit/test_train_*.cpp)
add_executable(unit_train ${TRAIN_UNIT_TESTS})
# lockstep_launch: the restart count the launcher writes is read back by the trainer
# (test_train_checkpoint.cpp); src/: the trainer's private headers (train/checkpoint/checkpointer.h).
target_link_libraries(unit_train PRIVATE lockstep_train lockstep_launch ZLIB::ZLIB GTest::gtest_main)
target_include_directories(unit_train PRIVATE ${PROJECT_SOURCE_DIR}/src)
lockstep_unity_torch_first(unit_train)
lockstep_register_gtest(unit_train)

# The CTSM workload's own unit tests (model, event-log format, metrics, config).
file(GLOB CTSM_UNIT_TESTS CONFIGURE_DEPENDS
  ${PROJECT_SOURCE_DIR}/tests/unit/test_events_*.cpp
  ${PROJECT_SOURCE_DIR}/tests/unit/test_ctsm_*.cpp)
add_executable(unit_ctsm ${CTSM_UNIT_TESTS})
target_link_libraries(unit_ctsm PRIVATE lockstep_ctsm GTest::gtest_main)
lockstep_unity_torch_first(unit_ctsm)
# test_ctsm_config.cpp loads the shipped configs/ctsm-*.toml.
target_compile_definitions(unit_ctsm PRIVATE LOCKSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
lockstep_register_gtest(unit_ctsm)

# The language-model workload's unit tests (tokenizer, corpus split, windows, model, config).
file(GLOB LM_UNIT_TESTS CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/tests/unit/test_lm_*.cpp)
add_executable(unit_lm ${LM_UNIT_TESTS})
target_link_libraries(unit_lm PRIVATE lockstep_lm GTest::gtest_main)
lockstep_unity_torch_first(unit_lm)
# test_lm_config.cpp loads the shipped configs/lm-*.toml.
target_compile_definitions(unit_lm PRIVATE LOCKSTEP_SOURCE_DIR="${PROJECT_SOURCE_DIR}")
lockstep_register_gtest(unit_lm)

# Reloads an exported model and scores the backtest period with it (used by train_e2e).
add_executable(ctsm_score_exported ${PROJECT_SOURCE_DIR}/tests/train/score_exported.cpp)
target_link_libraries(ctsm_score_exported PRIVATE lockstep_ctsm)

set(TRAIN_TEST_ARGS $<TARGET_FILE:lockstep-run> $<TARGET_FILE:lockstep-train>
    $<TARGET_FILE:ctsm_score_exported> ${PROJECT_SOURCE_DIR})
# generate -> train on 2 ranks -> gate -> export -> reload and score; gate miss; config
# errors; corrupt shard; TensorBoard files checked by an independent (stdlib) reader.
add_test(NAME train_e2e COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/e2e_test.sh ${TRAIN_TEST_ARGS})
# interrupted + resumed run == uninterrupted run, bit for bit, at 2 ranks.
add_test(NAME train_resume COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/resume_test.sh ${TRAIN_TEST_ARGS})
# strategy.kind = "fsdp" (configs/ctsm-fsdp.toml): trains, exports, resumes bit for bit at
# 2 ranks and from the 2-rank sharded checkpoint on 1 rank; its config and resume errors.
add_test(NAME train_fsdp COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/fsdp_test.sh ${TRAIN_TEST_ARGS})
# sharding = "hybrid_shard" on 2 "nodes" x 2 ranks: trains (4-bit gradients too), follows
# full_shard, the first replica writes the shards, resume bit for bit (slow: 4 ranks).
add_test(NAME train_fsdp_hybrid_2x2
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/hybrid_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_fsdp_hybrid_2x2 PROPERTIES LABELS "train;multiprocess" TIMEOUT 300)
# Checkpoint integrity: a flipped byte and a truncation of every kind of checkpoint file
# (DDP and FSDP) are named, and resume falls back to the previous checkpoint.
add_test(NAME train_integrity COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/integrity_test.sh ${TRAIN_TEST_ARGS})
# Asynchronous checkpoints: async == sync files; a rank killed during the background write
# or the commit leaves the previous checkpoint, and resume follows the uninterrupted run.
add_test(NAME train_async_ckpt
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/async_ckpt_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_async_ckpt PROPERTIES LABELS "train;multiprocess" TIMEOUT 600)
# lockstep-run --max-restarts 1 with rank 1 killed mid-epoch == an uninterrupted run.
add_test(NAME train_restart COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/restart_test.sh ${TRAIN_TEST_ARGS})
# Config and command-line refusals, data-generation estimate, missing shard.
add_test(NAME train_cli COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/cli_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_e2e train_resume train_fsdp train_integrity train_restart train_cli
                     PROPERTIES LABELS "train;multiprocess" TIMEOUT 240)
# strategy.comm_hook = "powersgd": fewer bytes, resume counts on from the checkpoint's step,
# config error (tests/train/powersgd_test.sh).
add_test(NAME train_powersgd
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/powersgd_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_powersgd PROPERTIES LABELS "train;multiprocess" TIMEOUT 240)
# [precision], [memory] and the non-finite guard at 2 ranks (DDP and FSDP).
add_test(NAME train_precision
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/precision_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_precision PROPERTIES LABELS "train;multiprocess" TIMEOUT 300)

# The language model (configs/lm-tiny.toml): FSDP + bf16 + activation checkpointing on 2 ranks
# reaches its perplexity gate and exports with a sample; gate miss; config and corpus errors.
add_test(NAME train_lm COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/lm_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_lm PROPERTIES LABELS "train;multiprocess" TIMEOUT 240)

# strategy.kind = "diloco": bytes against DDP, Streaming DiLoCo resumed mid-round bit for bit
# (async and sync checkpoints), world-size and key errors (tests/train/diloco_test.sh).
add_test(NAME train_diloco
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/diloco_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_diloco PROPERTIES LABELS "train;multiprocess;diloco" TIMEOUT 300)

# fault_tolerance.enable at 3 replicas under lockstep-run --fault-tolerant: == DDP without
# faults (bit for bit); a replica killed at each point of a step, while healing or while
# writing a checkpoint; stop and resume; min_replicas (tests/train/ft_train_test.sh).
add_test(NAME train_fault_tolerance
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/ft_train_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_fault_tolerance PROPERTIES LABELS "train;multiprocess" TIMEOUT 400)

# The same with HSDP replicas: 3 of 2 ranks (strategy.kind = "fsdp", --replica-size 2):
# follows FSDP at 6 ranks, a rank killed (its replica restarts whole and heals), two in a
# row, stop and resume, layouts refused (tests/train/ft_hsdp_train_test.sh).
add_test(NAME train_fault_tolerance_3x2
         COMMAND bash ${PROJECT_SOURCE_DIR}/tests/train/ft_hsdp_train_test.sh ${TRAIN_TEST_ARGS})
set_tests_properties(train_fault_tolerance_3x2 PROPERTIES LABELS "train;multiprocess" TIMEOUT 400)
