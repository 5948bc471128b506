// Quantized all-gather (see quantized_allgather.h).
#include <lockstep/compress/quantized_allgather.h>

#include "compress/inflight.h"
#include "compress/shard_plan.h"

#include <ATen/ATen.h>

namespace lockstep::compress {
namespace {

bool gather_dtype_ok(at::ScalarType dt) {
  return dt == at::kFloat || dt == at::kBFloat16 || dt == at::kHalf;
}

}  // namespace

QuantizedAllgather::QuantizedAllgather(QsgdOptions options, std::vector<LayerSpan> layers,
                                       int64_t part_numel, int world_size)
    : opts_(std::move(options)), n_(part_numel), world_(world_size) {
  opts_.stochastic = false;
  validate(opts_);
  LOCKSTEP_CHECK(world_ >= 1 && n_ >= 0, "quantized all-gather: bad size");
  plan_ = std::make_unique<ShardPlan>(ShardPlan::flat(opts_, std::move(layers), n_, world_));
}

QuantizedAllgather::~QuantizedAllgather() { wait_quietly(inflight_); }

int64_t QuantizedAllgather::bytes_sent() const { return (world_ - 1) * plan_->max_part_bytes(); }

int64_t QuantizedAllgather::bytes_uncompressed(at::ScalarType dtype) const {
  return (world_ - 1) * n_ * int64_t(c10::elementSize(dtype));
}

comm::WorkPtr QuantizedAllgather::run_async(comm::ProcessGroup& group, at::Tensor out,
                                            const at::Tensor& in) {
  LOCKSTEP_CHECK_EQ(group.size(), world_, "the plan was made for another world size");
  LOCKSTEP_CHECK(gather_dtype_ok(in.scalar_type()) && gather_dtype_ok(out.scalar_type()),
                 "quantized all-gather takes float32, bfloat16 or float16, not ",
                 c10::toString(in.scalar_type()), " -> ", c10::toString(out.scalar_type()));
  LOCKSTEP_CHECK(in.device().is_cpu() && in.is_contiguous() && out.is_contiguous() &&
                     in.numel() == n_ && out.numel() == world_ * n_,
                 "quantized all-gather: in must hold part_numel values and out world_size * "
                 "part_numel, contiguous on the CPU");
  wait_quietly(inflight_);  // one call in flight per plan
  const int64_t slot = (plan_->max_part_bytes() + 7) / 8 * 8;
  if (!send_.defined() || send_.numel() != slot) {
    send_ = at::zeros({slot}, at::TensorOptions().dtype(at::kByte));
    recv_ = at::empty({world_ * slot}, at::TensorOptions().dtype(at::kByte));
  }
  const CodecOptions codec = opts_.codec();
  inflight_ = group.run_composite(
      world_ * n_, out.scalar_type(),
      [this, out, in, slot, codec](comm::Backend& be, const comm::OpContext& ctx) mutable {
        const int me = be.rank();
        plan_->encode(me, in, 0, codec, StreamKey{}, send_.data_ptr<uint8_t>());
        be.allgather(recv_, send_,
                     comm::step_context(ctx, comm::OpKind::Allgather, slot, at::kByte));
        const uint8_t* recv = recv_.data_ptr<uint8_t>();
        for (int p = 0; p < world_; ++p) plan_->decode(p, recv + p * slot, codec, out, p * n_);
      },
      comm::Millis(0), plan_->fingerprint(codec));
  return inflight_;
}

}  // namespace lockstep::compress
