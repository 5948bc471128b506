#include "train/loop/diloco_support.h"

#include <cstdio>

namespace lockstep::train {

diloco::DiLoCoOptions diloco_options(const StrategyConfig& s, uint64_t seed) {
  diloco::DiLoCoOptions o;
  o.inner_steps = s.diloco_inner_steps;
  o.outer_lr = s.diloco_outer_lr;
  o.outer_momentum = s.diloco_outer_momentum;
  o.nesterov = s.diloco_nesterov;
  o.fragments = s.diloco_fragments;
  o.overlap_steps = s.diloco_overlap_steps;
  o.mixing = s.diloco_mixing;
  o.compression = s.diloco_compression == "qsgd" ? diloco::OuterCompression::kQsgd
                                                 : diloco::OuterCompression::kNone;
  o.qsgd_bits = int(s.qsgd_bits);
  o.qsgd_bucket_size = s.qsgd_bucket_size;
  o.seed = seed;
  return o;
}

std::string rank_file_name(const std::string& stem, int rank) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%s-rank-%05d.pt", stem.c_str(), rank);
  return buf;
}

std::string diloco_file_name(int rank) { return rank_file_name("diloco", rank); }

void write_named(torch::serialize::OutputArchive& ar, const std::map<std::string, at::Tensor>& m) {
  for (const auto& [k, v] : m) ar.write(k, v);
}

std::map<std::string, at::Tensor> read_named(torch::serialize::InputArchive& ar) {
  std::map<std::string, at::Tensor> m;
  for (const auto& k : ar.keys()) {
    at::Tensor t;
    ar.read(k, t);
    m[k] = t;
  }
  return m;
}

}  // namespace lockstep::train
