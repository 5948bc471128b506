# lockstep: the commands a new user runs. Everything installs itself from Debian's packages.
BUILD ?= build
JOBS  ?= 2
CMAKE_FLAGS ?= -DCMAKE_BUILD_TYPE=Release
CTEST_FLAGS ?=
NPROC ?= 2
# ccache keys on paths relative to the checkout, so a fresh clone elsewhere reuses the cache.
export CCACHE_BASEDIR := $(CURDIR)

.PHONY: all deps deps-bench configure build test demo demo-fashion-mnist bench clean

all: build

deps:
	@bash scripts/install-deps.sh

deps-bench:
	@bash scripts/install-deps.sh --bench

# Always (re)configure: cheap when nothing changed, and a failed first configure is retried.
configure: deps
	cmake -S . -B $(BUILD) $(CMAKE_FLAGS)

build: configure
	cmake --build $(BUILD) -j$(JOBS)

# The whole suite: unit, multi-process (every backend, 1-4 ranks) and fault tests.
test: build
	cd $(BUILD) && ctest --output-on-failure --timeout 600 $(CTEST_FLAGS)

# The main job: the recommender pipeline (generate client event logs, train the client
# time series model with DDP on $(NPROC) local ranks, backtest, quality gate, export).
demo: build
	$(BUILD)/apps/lockstep-run --nproc-per-node $(NPROC) --master-port 0 \
	  $(BUILD)/apps/lockstep-train/lockstep-train configs/ctsm-demo.toml

# The first real job: a convnet trained on Fashion-MNIST with DDP.
demo-fashion-mnist: build
	$(BUILD)/apps/lockstep-run --nproc-per-node $(NPROC) --master-port 0 \
	  $(BUILD)/examples/fashion_mnist/fashion-mnist-ddp

# Benchmarks against the peers (c10d Gloo, OpenMPI, PyTorch DDP), side by side.
bench: deps-bench build
	$(BUILD)/bench/lockstep-bench collectives
	$(BUILD)/bench/lockstep-bench ddp
	$(BUILD)/bench/lockstep-bench compression
	$(BUILD)/bench/lockstep-bench train

clean:
	rm -rf $(BUILD)
