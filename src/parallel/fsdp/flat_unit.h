// One FSDP unit's parameters as one flat buffer, sharded over the ranks (docs/fsdp.md).
//
// The unit's parameters stay the user's leaf tensors; their data become views into one
// flat buffer `full` of `padded` elements (the sum of their sizes rounded up to a multiple
// of the world size). Each rank owns the slice [rank * n, (rank + 1) * n) of it as `shard`
// (n = padded / P): the optimizer's parameter and the master copy. Gathering all-gathers
// the shards into `full`; freeing resizes full's storage to 0 bytes, so the parameters
// (and any view autograd saved of them) keep their shapes and see the data again after
// the next gather. A parameter read while freed raises libtorch's "data is not allocated"
// error instead of returning stale values.
//
// Gradients: autograd accumulates a full gradient into each parameter's .grad(); the unit
// copies it into a flat gradient buffer and drops it, and once all have arrived (or at the
// end of backward) reduce-scatters the buffer (average) into the shard's .grad().
//
// The gathered parameters' memory and the flat gradient buffers come from the FSDP
// object's BufferPool (buffer_pool.h): the same blocks every step, no heap fragmentation.
//
// Compression (FSDPOptions::compression, sharded strategies only): the gather sends the
// shard quantized (compress::QuantizedAllgather) and the reduction goes through the QSGD
// reduce-scatter (compress::CompressedReduceScatter); a non-finite gradient stays in the
// shard's gradient as NaN, as with the plain reduce-scatter, for the scaler or the guard.
//
// Mixed precision: `full` and the parameters are in param_dtype, the shard (the master)
// keeps the parameters' own dtype; gathers cast the shard first, gradients are reduced in
// reduce_dtype and cast to the master's dtype. Under NoShard `full` is then a cast copy of
// the shard, refreshed at each gather.
#pragma once
#include <lockstep/comm/process_group.h>
#include <lockstep/compress/compressed_reduce_scatter.h>
#include <lockstep/compress/quantized_allgather.h>
#include <lockstep/parallel/fsdp/options.h>

#include "buffer_pool.h"

#include <ATen/core/Tensor.h>

#include <string>
#include <vector>

namespace lockstep::fsdp {

class FlatUnit {
 public:
  FlatUnit(std::string name, std::vector<std::string> param_names, std::vector<at::Tensor> params,
           comm::ProcessGroup& group, ShardingStrategy strategy, const MixedPrecision& mp,
           BufferPool& pool, comm::ProcessGroup* replicate = nullptr,
           const Compression& compression = {}, comm::ProcessGroup* secondary = nullptr);

  const std::string& name() const { return name_; }
  const std::vector<std::string>& param_names() const { return names_; }
  const std::vector<at::Tensor>& params() const { return params_; }
  const at::Tensor& shard() const { return shard_; }
  int64_t numel() const { return numel_; }  // without the padding
  // Where this rank's shard starts in the unit's flat (unpadded) order.
  int64_t shard_offset() const { return sharded() ? group_.rank() * shard_numel_ : 0; }
  bool sharded() const { return strategy_ != ShardingStrategy::NoShard; }

  // Parameters: start an all-gather of the shards (no-op if gathered or under way), wait
  // for it, release the full parameters (waits for a gather under way first).
  void begin_gather();
  void wait_gathered();
  void free_full();
  // After the unit's forward: free, keeping the hpZ secondary shard (if any) for the
  // backward's gather; drop_secondary() forgets it (a forward without backward).
  void free_after_forward();
  void drop_secondary() { secondary_shard_ = at::Tensor(); }
  int64_t secondary_bytes() const;
  bool gathered() const { return state_ == State::Gathered; }
  int64_t gathered_bytes() const;
  // Collective: the unit's master parameters (the shards' dtype), flat and padded, on every
  // rank; a temporary (the shard itself for NoShard).
  at::Tensor gather_master();
  // Collective: the parameters hold the full master values (in the master dtype even under
  // mixed precision, and exact under qwZ) until release_summoned(). Returns whether they
  // view a separate gathered copy of the masters (under a cast or qwZ) instead of full_.
  bool summon();
  // Whether a training gather yields the master values themselves (no cast, no qwZ).
  bool gathers_master() const { return !cast_ && !qgather_; }
  void release_summoned();

  // Gradients. param_grad_ready(i) moves parameter i's .grad() into the flat gradient and
  // returns true when every parameter of the unit that requires grad has reported.
  bool param_grad_ready(size_t i);
  bool expects_grads() const { return expected_grads_ > 0; }
  void set_reduce_calls(uint64_t calls) {
    if (qreduce_) qreduce_->set_steps(calls);
  }
  // Bytes this rank sent in the unit's gathers and reductions, and uncompressed equivalents.
  int64_t bytes_sent() const { return bytes_sent_; }
  int64_t bytes_uncompressed() const { return bytes_plain_; }
  void begin_reduce();   // zeros stand in for the gradients that never came
  void finish_reduce();  // waits; accumulates the averaged shard into shard().grad()

 private:
  enum class State { Free, Gathering, Gathered };
  void set_storage_bytes(int64_t bytes);
  at::Tensor zeroed_grad_buffer();  // [padded] in reduce_dtype, from the pool

  const std::string name_;
  const std::vector<std::string> names_;
  const std::vector<at::Tensor> params_;
  comm::ProcessGroup& group_;
  BufferPool& pool_;                     // the gathered parameters' and the flat gradients' memory
  comm::ProcessGroup* const replicate_;  // HybridShard: gradients are averaged across it too
  const ShardingStrategy strategy_;
  std::vector<int64_t> offsets_;
  int64_t numel_ = 0;
  int64_t padded_ = 0;
  int64_t shard_numel_ = 0;
  at::Tensor full_;    // [padded], param dtype; storage 0 bytes while freed (sharded)
  at::Tensor shard_;   // [padded / P], master dtype, leaf, requires grad; NoShard: full_
                       // itself unless cast_
  bool cast_ = false;  // mixed precision: full_ is in another dtype than shard_
  at::ScalarType reduce_dtype_ = at::kFloat;
  at::Tensor gather_in_;        // the cast shard an all-gather reads from
  at::Tensor summoned_master_;  // summon() under mixed precision: the full master values
  void point_params_at(const at::Tensor& flat);
  void make_codecs(const Compression& cz, at::ScalarType param_dtype);
  std::unique_ptr<compress::QuantizedAllgather> qgather_;       // gather_bits
  std::unique_ptr<compress::CompressedReduceScatter> qreduce_;  // reduce_bits
  comm::ProcessGroup* const secondary_;                         // hpZ: the node's ranks
  at::Tensor secondary_shard_;  // [padded / L] in param dtype between forward and backward
  State state_ = State::Gathered;
  comm::WorkPtr gather_work_;

  size_t expected_grads_ = 0;
  size_t arrived_grads_ = 0;
  at::Tensor grad_full_;   // [padded] while gradients arrive and reduce
  at::Tensor grad_shard_;  // the reduction's output
  comm::WorkPtr reduce_work_;
  int64_t bytes_sent_ = 0, bytes_plain_ = 0;
};

}  // namespace lockstep::fsdp
