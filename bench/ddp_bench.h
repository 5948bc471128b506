// lockstep-bench ddp: the options shared by the driver (bench/ddp.cpp) and the worker
// (bench/ddp_worker.cpp).
#pragma once

#include <string>

namespace lockstep::bench {

struct DdpArgs {
  bool worker = false;
  // worker
  std::string backend = "shm";
  bool view = false;             // DDPOptions::gradient_as_bucket_view
  bool private_buckets = false;  // DDPOptions::shared_buckets = false
  bool profile = false;          // also time the step's components in isolation
  // both
  int steps = 30, warmup = 5, batch = 64;
  bool bf16 = false;  // forward and loss under CPU bf16 autocast (oneDNN), on every side
  // driver
  std::string nprocs = "1,2";
  std::string configs = "shm,gloo,mpi";
  int rounds = 1;
  bool skip_peer = false;
  std::string out = "bench-results/ddp.csv";
  std::string python = "/usr/bin/python3";  // Debian's interpreter, which has python3-torch
  std::string peer_script;                  // default: <source>/bench/peers/pytorch_ddp.py
};

// One rank of a lockstep DDP job; rank 0 prints "RESULT key seconds" lines.
int ddp_worker(const DdpArgs& a);

}  // namespace lockstep::bench
