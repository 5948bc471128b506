// One FSDP unit's flat, sharded parameters; see flat_unit.h.
#include "flat_unit.h"

#include <lockstep/compat.h>
#include <lockstep/error.h>

#include <ATen/ATen.h>
#include <torch/csrc/autograd/generated/variable_factories.h>

#include <utility>

namespace lockstep::fsdp {

FlatUnit::FlatUnit(std::string name, std::vector<std::string> param_names,
                   std::vector<at::Tensor> params, comm::ProcessGroup& group,
                   ShardingStrategy strategy, const MixedPrecision& mp, BufferPool& pool,
                   comm::ProcessGroup* replicate, const Compression& compression,
                   comm::ProcessGroup* secondary)
    : name_(std::move(name)),
      names_(std::move(param_names)),
      params_(std::move(params)),
      group_(group),
      pool_(pool),
      replicate_(replicate),
      strategy_(strategy),
      secondary_(secondary) {
  LOCKSTEP_CHECK(!params_.empty(), "FSDP unit '", name_, "' has no parameters");
  const auto dtype = params_[0].scalar_type();
  const auto device = params_[0].device();
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (p.scalar_type() != dtype || p.device() != device)
      throw InvalidArgument(lockstep::detail::concat(
          "FSDP unit '", name_, "': parameter '", names_[i], "' is ",
          comm::dtype_name(p.scalar_type()), " on ", p.device(), ", but '", names_[0], "' is ",
          comm::dtype_name(dtype), " on ", device,
          "; a unit's parameters must share one dtype and one device (wrap the odd ones in a "
          "unit of their own, or move the module with module->to(device) first)"));
    offsets_.push_back(total);
    total += p.numel();
    if (p.requires_grad()) ++expected_grads_;
  }
  const int P = sharded() ? group_.size() : 1;
  numel_ = total;
  padded_ = (total + P - 1) / P * P;
  shard_numel_ = padded_ / P;

  const auto param_dtype = mp.param_dtype.value_or(dtype);
  reduce_dtype_ = mp.reduce_dtype.value_or(param_dtype);
  cast_ = param_dtype != dtype;

  at::NoGradGuard no_grad;
  at::Tensor master = at::zeros({padded_}, params_[0].options().requires_grad(false));
  for (size_t i = 0; i < params_.size(); ++i)
    master.narrow(0, offsets_[i], params_[i].numel()).copy_(params_[i].detach().reshape(-1));
  full_ = cast_ ? master.to(param_dtype) : master;
  point_params_at(full_);  // same leaf tensors, now views into full_
  if (sharded())
    shard_ = master.narrow(0, group_.rank() * shard_numel_, shard_numel_).clone();
  else  // NoShard: the parameters are views of the shard itself, unless they are cast
    shard_ = cast_ ? master : full_.detach();
  free_full();
  shard_.requires_grad_(true);
  make_codecs(compression, param_dtype);
}

void FlatUnit::make_codecs(const Compression& cz, at::ScalarType param_dtype) {
  if (!sharded() || !cz.enabled() || group_.size() == 1 || (cz.units && !cz.units(name_))) return;
  if (!shard_.device().is_cpu())
    throw InvalidArgument(lockstep::detail::concat(
        "FSDP compression (gather_bits / reduce_bits) runs on CPU parameters only; unit '", name_,
        "' is on ", shard_.device(), ": leave compression off for a CUDA model (docs/gpu.md)"));
  std::vector<compress::LayerSpan> layers;
  for (size_t i = 0; i < params_.size(); ++i)
    layers.push_back({names_[i], offsets_[i], params_[i].numel()});
  auto check = [&](const char* key, at::ScalarType dt, const char* which) {
    if (dt != at::kFloat && dt != at::kBFloat16 && dt != at::kHalf)
      throw InvalidArgument(lockstep::detail::concat(
          "FSDP compression.", key, " needs a ", which,
          " dtype of float32, bfloat16 or float16; unit '", name_, "' has ", comm::dtype_name(dt),
          " (set MixedPrecision::", which, "_dtype, or leave ", key, " at 0)"));
  };
  compress::QsgdOptions o = cz.codec;
  if (cz.gather_bits != 0) {
    check("gather_bits", param_dtype, "param");
    check("gather_bits", shard_.scalar_type(), "param");  // the master is what is encoded
    o.bits = cz.gather_bits;
    qgather_ =
        std::make_unique<compress::QuantizedAllgather>(o, layers, shard_numel_, group_.size());
  }
  if (cz.reduce_bits != 0) {
    check("reduce_bits", reduce_dtype_, "reduce");
    o.bits = cz.reduce_bits;
    o.stochastic = true;
    qreduce_ = std::make_unique<compress::CompressedReduceScatter>(o, std::move(layers),
                                                                   shard_numel_, group_.size());
  }
}

void FlatUnit::point_params_at(const at::Tensor& flat) {
  for (size_t i = 0; i < params_.size(); ++i)
    params_[i].set_data(flat.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes()));
}

bool FlatUnit::summon() {
  if (gathers_master()) {
    wait_gathered();
    return false;
  }
  summoned_master_ = gather_master();
  point_params_at(summoned_master_);
  return true;
}

void FlatUnit::release_summoned() {
  free_full();
  if (!summoned_master_.defined()) return;
  // Views need their storage's bytes to exist: allocate full_ for the moment it takes.
  const int64_t bytes = gathered_bytes();
  set_storage_bytes(padded_ * static_cast<int64_t>(full_.element_size()));
  point_params_at(full_);
  set_storage_bytes(bytes);
  summoned_master_ = at::Tensor();
}

void FlatUnit::set_storage_bytes(int64_t bytes) { pool_.set_storage(full_, bytes); }

int64_t FlatUnit::gathered_bytes() const { return static_cast<int64_t>(full_.storage().nbytes()); }

void FlatUnit::begin_gather() {
  if (state_ != State::Free) return;
  at::NoGradGuard no_grad;
  if (!sharded()) {  // only when cast: the compute copy of the master
    full_.copy_(shard_);
    state_ = State::Gathered;
    return;
  }
  set_storage_bytes(padded_ * static_cast<int64_t>(full_.element_size()));
  const int64_t plain = (group_.size() - 1) * shard_numel_ * int64_t(full_.element_size());
  bytes_plain_ += plain;
  if (secondary_shard_.defined()) {  // hpZ: the backward's gather, inside the node
    bytes_sent_ += (secondary_->size() - 1) * int64_t(secondary_shard_.nbytes());
    gather_in_ = secondary_shard_;
    secondary_shard_ = at::Tensor();
    gather_work_ = secondary_->allgather(full_, gather_in_);
  } else if (qgather_) {  // the master shard itself is encoded, whatever param_dtype is
    bytes_sent_ += qgather_->bytes_sent();
    gather_in_ = shard_.detach();
    gather_work_ = qgather_->run_async(group_, full_, gather_in_);
  } else {
    bytes_sent_ += plain;
    gather_in_ = cast_ ? shard_.detach().to(full_.scalar_type()) : shard_.detach();
    gather_work_ = group_.allgather(full_, gather_in_);
  }
  state_ = State::Gathering;
}

at::Tensor FlatUnit::gather_master() {
  if (!sharded()) return shard_.detach();
  at::Tensor out = at::empty({padded_}, shard_.options().requires_grad(false));
  at::Tensor in = shard_.detach();
  group_.allgather(out, in)->wait();
  return out;
}

void FlatUnit::wait_gathered() {
  begin_gather();
  if (state_ == State::Gathering) {
    gather_work_->wait();
    gather_work_.reset();
    gather_in_ = at::Tensor();
    state_ = State::Gathered;
  }
}

void FlatUnit::free_full() {
  if (state_ == State::Free || (!sharded() && !cast_)) return;
  wait_gathered();                      // never free memory a transfer is writing
  if (sharded()) set_storage_bytes(0);  // NoShard keeps its cast copy's memory
  state_ = State::Free;
}

void FlatUnit::free_after_forward() {
  if (secondary_ != nullptr && sharded() && state_ != State::Free) {
    wait_gathered();
    const int64_t n = padded_ / secondary_->size();
    at::NoGradGuard no_grad;
    secondary_shard_ = pool_.empty(n, full_.options());  // pooled, as every unit-sized buffer
    secondary_shard_.copy_(full_.narrow(0, secondary_->rank() * n, n));
  }
  free_full();
}

int64_t FlatUnit::secondary_bytes() const {
  return secondary_shard_.defined() ? int64_t(secondary_shard_.nbytes()) : 0;
}

bool FlatUnit::param_grad_ready(size_t i) {
  auto& p = params_[i];
  at::Tensor& g = p.mutable_grad();
  if (g.defined()) {
    if (!grad_full_.defined()) grad_full_ = zeroed_grad_buffer();
    at::NoGradGuard no_grad;
    grad_full_.narrow(0, offsets_[i], p.numel()).view(p.sizes()).add_(g);
    g = at::Tensor();  // the full gradient lives on only in the flat buffer
  }
  return ++arrived_grads_ == expected_grads_;
}

at::Tensor FlatUnit::zeroed_grad_buffer() {
  at::NoGradGuard no_grad;
  return pool_.empty(padded_, full_.options().dtype(reduce_dtype_)).zero_();
}

void FlatUnit::begin_reduce() {
  LOCKSTEP_CHECK(reduce_work_ == nullptr, "FSDP unit '", name_, "': reduction launched twice");
  if (!grad_full_.defined()) grad_full_ = zeroed_grad_buffer();
  if (sharded()) {
    grad_shard_ = pool_.empty(shard_numel_, grad_full_.options());
    reduce_work_ = qreduce_ ? qreduce_->run_async(group_, grad_shard_, grad_full_, /*average=*/true)
                            : group_.reduce_scatter(grad_shard_, grad_full_,
                                                    {comm::ReduceOp::Avg, comm::Millis(0)});
  } else {
    grad_shard_ = grad_full_;
    reduce_work_ = group_.allreduce(grad_shard_, {comm::ReduceOp::Avg, comm::Millis(0)});
  }
}

void FlatUnit::finish_reduce() {
  if (reduce_work_ == nullptr) return;
  reduce_work_->wait();
  reduce_work_.reset();
  if (sharded()) {
    const int64_t plain = (group_.size() - 1) * shard_numel_ * int64_t(grad_full_.element_size());
    bytes_plain_ += plain;
    bytes_sent_ += qreduce_ ? qreduce_->bytes_sent() : plain;
  }
  if (replicate_ != nullptr && replicate_->size() > 1)  // the shard's copies elsewhere
    replicate_->allreduce(grad_shard_, {comm::ReduceOp::Avg, comm::Millis(0)})->wait();
  at::Tensor& g = shard_.mutable_grad();
  at::Tensor reduced = grad_shard_.to(shard_.scalar_type());  // the master's dtype
  if (g.defined()) {
    at::NoGradGuard no_grad;
    g.add_(reduced);
  } else {
    g = reduced;
  }
  grad_full_ = at::Tensor();
  grad_shard_ = at::Tensor();
  arrived_grads_ = 0;
}

}  // namespace lockstep::fsdp
