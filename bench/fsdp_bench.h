// lockstep-bench fsdp: the options shared by the driver (bench/fsdp.cpp), the memory-cap
// search (bench/fsdp_cap.cpp) and the worker (bench/fsdp_worker.cpp).
#pragma once

#include <cstdint>
#include <string>

namespace lockstep::comm {
class ProcessGroup;
}

namespace lockstep::bench {

// The transformer of the benchmark (bench/fsdp_model.h): the same on both sides (the
// Python peer takes the same flags).
struct ModelShape {
  int64_t d_model = 512;
  int64_t layers = 4;
  int64_t seq = 64;
  int64_t vocab = 1024;
  int64_t batch = 2;  // sequences per rank and step

  int64_t heads() const { return d_model / 64 > 0 ? d_model / 64 : 1; }
  // Parameters of one transformer block (the largest FSDP unit) and of the whole model.
  int64_t block_params() const;
  int64_t total_params() const;
  // The flags that describe it, for a worker's or the peer's command line.
  std::string flags() const;
};

struct FsdpArgs {
  bool worker = false;
  ModelShape shape;
  int steps = 5, warmup = 2;
  // worker
  std::string strategy = "full_shard";   // ddp, no_shard, shard_grad_op, full_shard
  bool private_buckets = false;          // DDP: DDPOptions::shared_buckets = false
  int64_t cap_bytes = 0;                 // RLIMIT_DATA of each rank (0: none)
  bool profile = false;                  // also time FSDP's per-unit costs in isolation
  int gather_bits = 0, reduce_bits = 0;  // FSDPOptions::compression (qwZ, qgZ)
  bool hpz = false;  // FSDPOptions::secondary_group: this rank's node (LOCAL_WORLD_SIZE)
  // driver
  std::string nprocs = "2";
  std::string strategies = "ddp,shard_grad_op,full_shard";
  int rounds = 1;
  bool skip_peer = false;
  std::string python;  // default: <source>/.venv-bench/bin/python
  std::string cap = "1GiB";
  std::string cap_nprocs = "2";
  std::string cap_malloc = "heap,nocache";  // malloc settings of the cap search (fsdp_driver.h)
  int cap_max_layers = 64;
  int cap_steps = 5;  // steps an attempt of the cap search must complete
  bool skip_cap = false;
  int job_timeout_s = 900;
  std::string out = "bench-results/fsdp.csv";
};

// One rank of a lockstep job; rank 0 prints "RESULT key value" lines.
int fsdp_worker(const FsdpArgs& a);
// --profile: FSDP's per-unit costs in isolation (bench/fsdp_profile.cpp).
void fsdp_profile(comm::ProcessGroup& g, const FsdpArgs& a);

// The source tree (for the peer script and the venv).
std::string source_dir();

}  // namespace lockstep::bench
