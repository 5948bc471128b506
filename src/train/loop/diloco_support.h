// What the trainer adds around lockstep::diloco::DiLoCo (strategy.kind = "diloco",
// docs/thin-links.md): the options from [strategy], and the per-rank checkpoint file that
// holds a replica's state (docs/checkpoint-format.md).
#pragma once

#include <lockstep/parallel/diloco/diloco.h>
#include <lockstep/train/config.h>

#include <torch/serialize/input-archive.h>
#include <torch/serialize/output-archive.h>

#include <map>
#include <string>

namespace lockstep::train {

// [strategy]'s diloco_* keys (and qsgd_bits, qsgd_bucket_size) as DiLoCoOptions.
diloco::DiLoCoOptions diloco_options(const StrategyConfig& s, uint64_t seed);

// "diloco-rank-RRRRR.pt": DiLoCo::state() of rank `rank` (under kind = "diloco" every rank
// also writes its replica's model-rank-RRRRR.pt and optimizer-rank-RRRRR.pt).
std::string diloco_file_name(int rank);
std::string rank_file_name(const std::string& stem, int rank);

void write_named(torch::serialize::OutputArchive& ar, const std::map<std::string, at::Tensor>& m);
std::map<std::string, at::Tensor> read_named(torch::serialize::InputArchive& ar);

}  // namespace lockstep::train
