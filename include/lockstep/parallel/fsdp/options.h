// lockstep/parallel/fsdp/options.h: how FullyShardedDataParallel shards, wraps and prefetches.
#pragma once
#include <lockstep/compress/policy.h>

#include <c10/core/ScalarType.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace torch::nn {
class Module;
}
namespace lockstep::comm {
class ProcessGroup;
}

namespace lockstep::fsdp {

// What each rank keeps of a unit's parameters between uses (docs/fsdp.md, "Strategies").
enum class ShardingStrategy {
  FullShard,    // ZeRO-3: gathered for forward, freed, gathered again for backward, freed.
  ShardGradOp,  // ZeRO-2: gathered for forward and kept until the unit's backward is done.
  NoShard,      // DDP: every rank keeps all parameters; gradients are all-reduced.
  HybridShard,  // FullShard inside the group FSDP is given (e.g. one node), replicated
                // across FSDPOptions::replicate_group (one rank per node).
};
const char* strategy_name(ShardingStrategy s);
// "full_shard", "shard_grad_op", "no_shard", "hybrid_shard" (as strategy_name prints them); throws
// InvalidArgument listing the valid names otherwise.
ShardingStrategy parse_strategy(const std::string& name);

// Which fsdp::wrap() candidates become units of their own. A candidate that does not stays
// part of the unit that encloses it (in the end the root). `name` is the candidate's path
// in the model ("layers.3"); `num_params` counts the elements of the parameters it holds
// that no nested unit takes.
using WrapPolicy = std::function<bool(const std::string& name, const torch::nn::Module& module,
                                      int64_t num_params)>;
// Every candidate (the default).
WrapPolicy wrap_all();
// Candidates holding at least `min_num_params` parameter elements (PyTorch's size_based policy).
WrapPolicy wrap_by_size(int64_t min_num_params);
// Candidates whose inner module's name() (e.g. "torch::nn::LinearImpl") is one of `types`.
WrapPolicy wrap_by_type(std::vector<std::string> types);

// Mixed precision (docs/fsdp.md, "Mixed precision"). Unset fields keep the parameters' own
// dtype. The fp32 (or whatever the model was built in) shard stays the master copy that
// the optimizer updates; the gathered parameters the forward and backward see are in
// param_dtype, gradients are reduced in reduce_dtype and arrive in the shard's dtype.
struct MixedPrecision {
  std::optional<at::ScalarType> param_dtype;   // compute and all-gather, e.g. at::kBFloat16
  std::optional<at::ScalarType> reduce_dtype;  // gradient reduction (default: param_dtype)
  std::optional<at::ScalarType> buffer_dtype;  // buffers (default: unchanged, e.g. BatchNorm
                                               // statistics stay fp32)
};

// Compressed traffic, after DeepSpeed's ZeRO++ (docs/fsdp.md, "Compressed traffic"). Off by
// default; only sharded strategies gather and reduce-scatter, so NoShard ignores it.
struct Compression {
  // Quantized weight all-gather (qwZ): each gather sends the shard in this many bits (8, or
  // 4; 1..8), min/max buckets, round to nearest: every rank decodes the same parameters, the
  // master shard stays exact. 0: gathered in param_dtype. Error per value <= half the
  // bucket's range / (2^bits - 1) (compress/quantized_allgather.h).
  int gather_bits = 0;
  // Quantized gradient reduce-scatter (qgZ): the QSGD codec, stochastic and unbiased, 1..8
  // bits (4 is the usual); on hier only the bytes between nodes are quantized
  // (compress/compressed_reduce_scatter.h). 0: reduced in reduce_dtype.
  int reduce_bits = 0;
  // The codec's other settings: bucket_size, min_layer and exclude (layers sent as float32),
  // seed, across_nodes_only. `bits` and `stochastic` are set from the fields above.
  compress::QsgdOptions codec;
  // Which units compress, by name ("layers.3"; "" is the root unit). Empty: every unit.
  std::function<bool(const std::string& unit)> units;

  bool enabled() const { return gather_bits != 0 || reduce_bits != 0; }
};

struct FSDPOptions {
  ShardingStrategy strategy = ShardingStrategy::FullShard;
  WrapPolicy wrap_policy;  // empty: wrap_all()
  MixedPrecision mixed_precision;
  // HybridShard only: the ranks holding the same shard as this one (the others of its
  // column), e.g. init_split(local_rank) beside a shard group init_split(node).
  std::shared_ptr<comm::ProcessGroup> replicate_group;
  // Gather the next unit's parameters (in reverse forward order) while the current unit's
  // gradients are computed. Prefetching is one unit deep, which is also the limit on
  // gathers in flight: at most the unit computing, the one prefetched and the root hold
  // gathered parameters at any time.
  bool backward_prefetch = true;
  // Gather the next unit (in the previous iteration's forward order) while the current
  // unit computes its forward.
  bool forward_prefetch = false;
  Compression compression;
  // ZeRO++'s hpZ, FullShard only: a secondary shard inside this subgroup of the FSDP group
  // (the ranks of one node: init_split(node), ranks numbered node * L + local), taken from
  // each unit's gathered parameters when its forward ends and kept until its backward
  // gathers it again, from this group, so the backward all-gather never crosses nodes. Costs
  // 1/L of each unit's gathered size per rank, for the units between forward and backward
  // (MemoryStats::secondary_bytes). Null: the backward gathers over the FSDP group.
  std::shared_ptr<comm::ProcessGroup> secondary_group;
};

}  // namespace lockstep::fsdp
