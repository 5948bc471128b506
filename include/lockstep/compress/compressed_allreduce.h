// lockstep/compress/compressed_allreduce.h: QSGD scatter-reduce-allgather on any backend.
//
// Algorithm (P ranks; one composite op whose steps are the Backend's alltoall / allgather /
// allreduce, so it runs on shm, gloo and mpi alike):
//   1. The compressed layers' buckets are split into P contiguous parts of about equal
//      element count, on bucket boundaries; rank r owns part r.
//   2. Each rank encodes every part it does not own (quantization #1) and an alltoall
//      delivers to each owner the P-1 compressed copies of its part.
//   3. The owner adds the decoded copies to its own EXACT values (float32 accumulation),
//      divides by P when averaging, encodes the result once (quantization #2), and decodes
//      those bytes into its own buffer as well.
//   4. An allgather sends the owner's bytes to all; every rank decodes every part with the
//      same code on the same bytes, so all replicas end bit-identical.
// Every value is thus quantized exactly twice whatever P is. Layers the policy leaves
// uncompressed go in one plain allreduce of their concatenation, the first step. World
// size 1 moves nothing and changes nothing (beyond the NaN/Inf check and averaging by 1).
//
// Asynchrony: run_async() issues the whole exchange (plain allreduce, encode, alltoall,
// owner sum, re-encode, allgather, decode) as ONE ProcessGroup::run_composite operation,
// which runs on the group's comm thread and calls the backend directly. The caller's
// thread (e.g. autograd) goes on at once; the steps keep the same order on every rank
// however other threads interleave their collectives, since the composite holds one
// sequence number and one descriptor check (numel, dtype) for all of them. run() is
// run_async() + wait() + finish().
//
// Pipelining (QsgdOptions::pipeline_chunk, rounds() > 1): the thread running the composite
// makes only the backend calls, in the same fixed order on every rank (alltoall of rounds
// 0..K-1, then allgather of rounds 0..K-1); the plan's helper thread does the codec work
// of the rounds in dependency order meanwhile, so the encoding and decoding of one round
// overlap the transfer of another. The helper never calls the backend (Backends are
// single-threaded by contract) and the order of backend calls does not depend on codec
// timing, so ranks cannot deadlock on it whatever the backend's blocking behaviour. The
// helper is started on the plan's first pipelined call, sleeps between calls and is
// joined by the destructor; a one-round plan has none.
//
// Bytes a rank sends per call, n compressed values, b bits, bucket B:
//   about 2 (P-1)/P * n * (b/8 + 8/B)   vs   2 (P-1)/P * 4 n uncompressed float32.
//
// Two levels (QsgdOptions::across_nodes_only, on a backend with levels(): hier): a
// reduce-scatter inside the node in the buffer's own precision leaves each local rank 1/L
// of the node's sum; the algorithm above runs on that share among the N ranks of its
// cross-node group (a plan of the share's pieces of the compressed layers, made on the
// first call); an allgather inside the node puts the shares together. Every value is
// still quantized exactly twice, now of N node sums rather than P rank inputs, and only
// the bytes between nodes shrink (the shm hops carry full precision). AllreduceStats keep
// describing the flat plan. NaN/Inf as below, agreed on inside each node.
//
// NaN/Inf: a non-finite value anywhere makes run() (finish() after run_async()) throw
// NonFiniteGradient naming the (first) affected layer on EVERY rank, after all collectives
// completed, so no rank is left waiting and the group stays usable (the composite itself
// completes normally; the finding is raised on the caller's thread). The buffer then holds
// NaNs in that layer.
//
// Error feedback (QsgdOptions::error_feedback): the residual of both quantizations a rank
// performs is kept (float32, one per element) and added to the next call's input, so the
// error does not accumulate over steps: phase-1 residual x - Q1(x) for the parts sent away;
// for the owned part the phase-2 residual of the sum, scaled by P when averaging.
//
// CUDA tensors (a CUDA build, P > 1, no error feedback, not two levels): the CUDA codec
// on the GPU and one allgather of its bytes instead (src/compress/device_exchange.h): each
// value quantized once, every rank summing every rank's decoded bytes in rank order; the
// decode runs in finish(), on the stream wait() ordered. Otherwise a CUDA buffer takes the
// algorithm above through pinned host memory (ProcessGroup::run_composite_on).
//
// Thread safety: one instance per buffer layout; one call in flight per instance (a second
// run_async() before the first completed waits for the first). Issue calls on
// different instances from one thread in the same order on every rank (as any collective).
#pragma once

#include <lockstep/comm/process_group.h>
#include <lockstep/compress/policy.h>

#include <ATen/core/Tensor.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace lockstep::compress {

class ProgressThread;  // private helper (src/compress/progress_thread.h)
class DeviceExchange;  // private: CUDA tensors (src/compress/device_exchange.h)

// One layer (parameter) of a flat buffer: elements [offset, offset + numel).
struct LayerSpan {
  std::string name;
  int64_t offset = 0;
  int64_t numel = 0;
};

struct AllreduceStats {
  int64_t compressed_elems = 0;    // values that went through the codec
  int64_t plain_elems = 0;         // values sent uncompressed
  int64_t bytes_sent = 0;          // bytes this rank put on the wire (payload, both phases)
  int64_t bytes_uncompressed = 0;  // what a ring allreduce of the same buffer would send
  // Where the time of the call went (seconds, this rank; filled in by finish()). Codec phases:
  // encode (#1), reduce (decode-add of the others' copies, averaging), reencode (#2),
  // decode; transfers: plain (allreduce of the uncompressed layers), alltoall, allgather
  // (each includes waiting for the slowest peer); transfer_wait: the transfers waiting for
  // the codec. Pipelined, the codec runs on the helper thread while the transfers run, so
  // the phases overlap and add up to more than the call took.
  struct Phases {
    double encode = 0, reduce = 0, reencode = 0, decode = 0;
    double plain = 0, alltoall = 0, allgather = 0, transfer_wait = 0;
  } seconds;
};

class CompressedAllreduce {
 public:
  // `layers` must be disjoint and lie within [0, numel); elements covered by no layer are
  // treated as one unnamed plain layer. Applies the policy of `options` per layer (does NOT
  // read the environment; qsgd() and callers do that with apply_env()).
  CompressedAllreduce(QsgdOptions options, std::vector<LayerSpan> layers, int64_t numel,
                      int world_size);
  // Waits for a call still running on the comm thread, then stops the helper thread.
  ~CompressedAllreduce();
  CompressedAllreduce(const CompressedAllreduce&) = delete;
  CompressedAllreduce& operator=(const CompressedAllreduce&) = delete;

  // flat: contiguous float32/bfloat16/float16 tensor (CPU or CUDA) with numel() == numel. Blocking;
  // leaves the sum over ranks (the mean if `average`) in `flat`, identical on all ranks.
  AllreduceStats run(comm::ProcessGroup& group, at::Tensor& flat, bool average);

  // Asynchronous form: validates and numbers the call on the calling thread, queues the
  // exchange as one composite op and returns its work. Until the work completed, `flat`
  // must not be read or written and this plan must stay alive. Then call finish() (on any
  // one thread): it raises NonFiniteGradient if the call met NaN/Inf (on every rank alike)
  // and returns the call's statistics. A failed work (CommError from wait()) needs no finish().
  comm::WorkPtr run_async(comm::ProcessGroup& group, at::Tensor flat, bool average);
  AllreduceStats finish();
  // Statistics of the latest run_async() (known at issue time: they follow from the plan).
  const AllreduceStats& last_stats() const { return last_stats_; }

  int64_t numel() const { return numel_; }
  int world_size() const { return world_; }
  const QsgdOptions& options() const { return opts_; }
  uint64_t steps() const { return step_; }
  // Resume: the next call counts as call `steps` (the rounding decisions follow the count).
  void set_steps(uint64_t steps) { step_ = steps; }
  // Digest of the options and plan that shape the messages (compared across ranks).
  int64_t fingerprint() const;

  // A contiguous piece of one compressed layer, starting on one of its bucket boundaries.
  struct Run {
    int64_t offset;  // in the flat buffer
    int64_t numel;
    int layer;              // index into layers_
    uint64_t first_bucket;  // global bucket index (the RNG counter)
  };
  const std::vector<Run>& part(int r) const { return parts_[size_t(r)]; }
  // Bytes of part r summed over the pipeline rounds.
  int64_t part_bytes(int r) const { return part_bytes_[size_t(r)]; }
  // Pipeline rounds (QsgdOptions::pipeline_chunk): each part cut into rounds() chunks.
  int rounds() const { return int(chunks_.size()); }

 private:
  QsgdOptions opts_;
  std::vector<LayerSpan> layers_;
  int64_t numel_;
  int world_;
  std::vector<std::vector<Run>> parts_;  // per owner rank
  std::vector<int64_t> part_elems_, part_bytes_;
  int64_t slot_bytes_ = 0;  // max part bytes (0: nothing compressed)
  struct Chunk {            // one pipeline round: a slice of every part
    std::vector<std::vector<Run>> parts;
    std::vector<int64_t> part_elems, part_bytes;
    int64_t slot = 0;  // this round's alltoall/allgather slot bytes
  };
  std::vector<Chunk> chunks_;
  std::vector<int> plain_layers_;
  int64_t plain_elems_ = 0;
  uint64_t step_ = 0;
  // The call in flight (or the latest): written on the issuing thread before the work is
  // queued, bad_ written by the comm thread before the work completes (Work's lock orders it).
  comm::WorkPtr inflight_;
  AllreduceStats last_stats_;
  int bad_ = -1;  // first non-finite layer (buffer order) of the latest call
  uint64_t last_step_ = 0;
  int last_rank_ = 0;
  std::vector<float> residual_;  // error feedback, one per element (lazily sized)
  at::Tensor send_, recv_, gather_in_, gather_out_, plain_;
  std::vector<float> acc_, tmp_, ef_x_, ef_q_;
  std::unique_ptr<ProgressThread> helper_;  // codec work of pipelined calls (lazily started)
  std::unique_ptr<DeviceExchange> device_;  // CUDA flat buffers (lazily made)
  bool device_call_ = false, device_average_ = false;  // the call in flight took it

  // The plan, made by the constructor.
  void fill_holes();
  void split_parts();
  void cut_rounds();
  // The exchange, run by the composite op, in its phases (compressed_allreduce.cpp).
  struct Call;           // one call's constants: rank, dtype, codec, offsets of the rounds
  struct RoundProgress;  // how far the rounds got, shared by the two threads of a pipelined call
  void exchange(comm::Backend& be, const comm::OpContext& ctx, at::Tensor& flat, bool average,
                uint64_t step);
  void exchange_levels(comm::Backend& node, comm::Backend& across, const comm::OpContext& ctx,
                       at::Tensor& flat, bool average, uint64_t step);
  void make_share_plan(int per_node, int local, int nodes);
  std::unique_ptr<CompressedAllreduce> share_plan_;  // two levels: this local rank's share
  int64_t share_ = 0;
  at::Tensor share_buf_, padded_;
  Call start_call(const comm::Backend& be, const comm::OpContext& ctx, at::Tensor& flat,
                  bool average, uint64_t step);
  void check_finite_local(const Call& call);
  void allreduce_plain(comm::Backend& be, const Call& call);
  void place_plain(const Call& call);
  void exchange_compressed(comm::Backend& be, const Call& call);
  void run_pipelined(comm::Backend& be, const Call& call);
  void transfer_rounds(comm::Backend& be, const Call& call, RoundProgress& progress);
  void codec_rounds(const Call& call, RoundProgress& progress);
  void encode_round(const Call& call, int c);
  void encode_with_feedback(const Call& call, const Run& run, uint8_t* out);
  void alltoall_round(comm::Backend& be, const Call& call, int c);
  void sum_round(const Call& call, int c);
  void reencode_round(const Call& call, int c);
  void allgather_round(comm::Backend& be, const Call& call, int c);
  void decode_round(const Call& call, int c);
  void note_bad(int layer);
  bool await_codec(RoundProgress& progress, const int& done, int target);
  // Phase times of the call in flight: written by the composite's thread and the helper
  // (disjoint fields), copied into last_stats_ by finish().
  AllreduceStats::Phases phases_;
};

// One-shot convenience: plans, runs, and throws away the plan (tests, benchmarks).
AllreduceStats compressed_allreduce(comm::ProcessGroup& group, at::Tensor& flat,
                                    const std::vector<LayerSpan>& layers,
                                    const QsgdOptions& options, bool average = false);

}  // namespace lockstep::compress
