# lockstep: the commands a new user runs. Everything installs itself from Debian's packages.
BUILD ?= build
JOBS  ?= 2
# CI (CI=true) turns warnings into errors; a user's build only warns.
# Otherwise a build folder keeps the setting it was configured with (passing OFF after a CI
# run would recompile everything); WERROR=OFF or ON on the command line sets it.
WERROR ?= $(if $(filter true 1,$(CI)),ON,)
WERROR_FLAG = $(if $(WERROR),-DLOCKSTEP_WERROR=$(WERROR))
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
CTEST_FLAGS ?=
NPROC ?= 2
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR := $(CURDIR)

# What the sanitizer runs build and run: the unit tests of the library's lower layers and
# the multi-process comm, compression, DDP and FSDP tests on shm and gloo (docs/development.md).
SAN_TARGETS := unit_launch unit_comm unit_data unit_ddp unit_compress unit_numerics lockstep-run \
               collectives_check ddp_equivalence compress_check fsdp_equivalence grad_scaler_check \
               activation_checkpoint_check diloco_check
SAN_TESTS   := ^(unit_(launch|comm|data|ddp|compress|numerics)$$|(collectives|compress|ddp_equivalence|fsdp_equivalence|mismatch_detected|grad_scaler|activation_checkpoint|diloco)_(shm|gloo)_)
SAN_FLAGS   := -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLOCKSTEP_BUILD_BENCH=OFF -DLOCKSTEP_WITH_MPI=OFF
export ASAN_OPTIONS  ?= detect_leaks=0:abort_on_error=1:strict_string_checks=1
export UBSAN_OPTIONS ?= print_stacktrace=1:halt_on_error=1
export TSAN_OPTIONS  ?= halt_on_error=1:second_deadlock_stack=1:suppressions=$(CURDIR)/scripts/tsan.supp

# libtorch 2.x: the libtorch inside the torch wheel of .venv-bench (scripts/install-deps.sh
# --torch2; shared with make bench), C++20, the CXX11 ABI like Debian's gloo/OpenMPI/gtest.
# Builds and runs the unit, comm, DDP and FSDP tests, the install + consumer tests and
# TensorBoard's own reader over the trainer's events and the PowerSGD hook against PyTorch's
# own powerSGD_hook (docs/install.md, docs/development.md).
TORCH2_PY      := $(CURDIR)/.venv-bench/bin/python
# With the CUDA parts (LOCKSTEP_CUDA=ON: nvcc needed; NCCL comes with the wheel): the codec
# kernels and the NCCL backend compile and link, and their tests run (they skip without a
# GPU; docs/gpu.md).
TORCH2_TARGETS := unit_launch unit_comm unit_data unit_ddp unit_compress unit_numerics \
                  unit_cuda unit_cuda_stream gpu_training_check \
                  lockstep-run collectives_check ddp_equivalence fsdp_equivalence powersgd_check diloco_check \
                  lockstep_models lockstep_train lockstep-train ctsm_score_exported
TORCH2_TESTS   := ^(unit_(launch|comm|data|ddp|compress|numerics|cuda|cuda_stream)$$|(collectives|ddp_equivalence|fsdp_equivalence|powersgd|diloco)_(shm|gloo)_np2|mismatch_detected_(shm|gloo)|packaging_(install|consumer_cmake)|tensorboard_reader|train_(resume|async_ckpt|diloco)$$|powersgd_torch_(reference|shm|gloo))

.PHONY: all deps deps-bench deps-torch2 configure build test test-slow test-hosts test-asan test-tsan test-nompi \
        test-torch2 test-python package lint format demo demo-lm demo-fashion-mnist bench clean

all: build

deps:
	@bash scripts/install-deps.sh

deps-bench:
	@bash scripts/install-deps.sh --bench

deps-torch2:
	@bash scripts/install-deps.sh --torch2

# Always (re)configure: cheap when nothing changed, and a failed first configure is retried.
configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS) $(WERROR_FLAG)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The suite, in parts (tests/CMakeLists.txt): `make test` runs the unit tests, the layer check
# and every feature on 1-2 ranks (every backend), two tests at a time; `make test-slow` the
# label `slow`: 3-4 ranks, the fault tests, the packaging builds, the longer trainer runs; the
# multi-host tests (network namespaces, a real Slurm) are `make test-hosts`. CI runs all three.
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -j$(JOBS) \
	  -LE '^(multihost|unit_case|slow)$$' $(CTEST_FLAGS)

test-slow: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -L '^slow$$' -LE '^multihost$$' \
	  $(CTEST_FLAGS)

test-hosts: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 -L '^multihost$$' $(CTEST_FLAGS)

# AddressSanitizer + UndefinedBehaviorSanitizer, and ThreadSanitizer, over SAN_TESTS.
test-asan: deps
	cmake -S . -B build-asan $(SAN_FLAGS) -DLOCKSTEP_SANITIZE=address,undefined $(WERROR_FLAG)
	cmake --build build-asan -j$(JOBS) --target $(SAN_TARGETS)
	cd build-asan && ctest --output-on-failure -R '$(SAN_TESTS)' $(CTEST_FLAGS)

test-tsan: deps
	cmake -S . -B build-tsan $(SAN_FLAGS) -DLOCKSTEP_SANITIZE=thread $(WERROR_FLAG)
	cmake --build build-tsan -j$(JOBS) --target $(SAN_TARGETS)
	cd build-tsan && ctest --output-on-failure -R '$(SAN_TESTS)' $(CTEST_FLAGS)

# The build without MPI (LOCKSTEP_WITH_MPI=OFF): comm and its tests, and the clear error
# a user gets when asking for the mpi backend.
test-nompi: deps
	cmake -S . -B build-nompi -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_WITH_MPI=OFF \
	  -DLOCKSTEP_CODEC_SIMD=OFF -DLOCKSTEP_BUILD_BENCH=OFF $(WERROR_FLAG)
	cmake --build build-nompi -j$(JOBS) --target unit_comm unit_compress lockstep-run collectives_check
	cd build-nompi && ctest --output-on-failure \
	  -R '^(unit_(comm|compress)$$|collectives_(shm|gloo)_np2|no_mpi_)' $(CTEST_FLAGS)

test-torch2: deps deps-torch2
	cmake -S . -B build-torch2 -DCMAKE_BUILD_TYPE=Release -DLOCKSTEP_BUILD_BENCH=OFF \
	  $(WERROR_FLAG) -DLOCKSTEP_TEST_PYTHON=$(TORCH2_PY) -DLOCKSTEP_CUDA=ON \
	  -DCMAKE_PREFIX_PATH="$$($(TORCH2_PY) -c 'import torch; print(torch.utils.cmake_prefix_path)')"
	cmake --build build-torch2 -j$(JOBS) --target $(TORCH2_TARGETS)
	cd build-torch2 && ctest --output-on-failure --timeout 600 -R '$(TORCH2_TESTS)' \
	  $(CTEST_FLAGS)

# The Python package (python/, docs/python.md) in .venv-bench's torch: pip builds the
# extension there (scikit-build-core, build dir python/build/, ccache), then pytest runs the
# "lockstep" torch.distributed backend under torchrun against gloo.
test-python: deps-torch2
	$(TORCH2_PY) -m pip install -q scikit-build-core pytest
	$(TORCH2_PY) -m pip install -q --no-build-isolation --no-deps ./python
	cd python && $(TORCH2_PY) -m pytest -v -s tests

# build/lockstep_<version>_<arch>.deb (cmake/Package.cmake), from the Debian-libtorch build.
package: build
	cd $(BUILD) && cpack -G DEB

# clang-format (check only) and clang-tidy (.clang-tidy) over the library, apps and tests.
# clang-tidy reads each source's own compile command: build-lint/ is configured (not built)
# without unity batches.
lint: deps
	cmake -S . -B build-lint $(CMAKE_FLAGS) -DCMAKE_UNITY_BUILD=OFF > /dev/null
	bash scripts/lint.sh build-lint

format:
	git ls-files '*.cpp' '*.h' | xargs clang-format -i

# The main job: the recommender pipeline (generate client event logs, train the client
# time series model with DDP on $(NPROC) local ranks, backtest, quality gate, export).
# Builds only what it runs (the launcher, the trainer and the CTSM workload), so the first
# step comes minutes sooner on a fresh machine; make test builds the rest.
demo: configure
	cmake --build $(BUILD) -j$(JOBS) --target lockstep-run lockstep-train
	$(BUILD)/apps/lockstep-run --nproc-per-node $(NPROC) --master-port 0 \
	  $(BUILD)/apps/lockstep-train/lockstep-train configs/ctsm-demo.toml

# The language model: a byte-level decoder-only transformer trained on the King James Bible
# (Debian's bible-kjv-text) on $(NPROC) local ranks with FSDP, bf16 parameters and activation
# checkpointing; prints the held-out perplexity (its quality gate) and a generated sample.
demo-lm: configure
	cmake --build $(BUILD) -j$(JOBS) --target lockstep-run lockstep-train
	$(BUILD)/apps/lockstep-run --nproc-per-node $(NPROC) --master-port 0 \
	  $(BUILD)/apps/lockstep-train/lockstep-train configs/lm-fsdp.toml

# The first real job: a convnet trained on Fashion-MNIST with DDP.
demo-fashion-mnist: configure
	cmake --build $(BUILD) -j$(JOBS) --target lockstep-run fashion-mnist-ddp
	$(BUILD)/apps/lockstep-run --nproc-per-node $(NPROC) --master-port 0 \
	  $(BUILD)/examples/fashion_mnist/fashion-mnist-ddp

# Benchmarks against the peers (c10d Gloo, OpenMPI, PyTorch DDP and FSDP), side by side.
# deps-bench also makes .venv-bench/ (torch 2.x from PyPI, ~5 GB) for the PyTorch FSDP peer.
bench: deps-bench build
	$(BUILD)/bench/lockstep-bench collectives
	$(BUILD)/bench/lockstep-bench ddp
	$(BUILD)/bench/lockstep-bench compression
	$(BUILD)/bench/lockstep-bench train
	$(BUILD)/bench/lockstep-bench fsdp

# Short runs of the benchmarks above (~3 min on 2 cores), compared with bench/baseline.json:
# flags a figure worse than its noise band (docs/development.md). Needs no download; a
# missing peer (python3-torch, OpenMPI) or no root for the shaped link skips its figure.
# QUICK_FLAGS: --strict (exit 1 on a regression), --update (write the new baseline).
.PHONY: bench-quick
bench-quick: build
	python3 bench/quick.py --build $(BUILD) $(QUICK_FLAGS)

clean:
	rm -rf $(BUILD) build-asan build-tsan build-nompi build-torch2
