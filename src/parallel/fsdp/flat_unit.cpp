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
                   ShardingStrategy strategy)
    : name_(std::move(name)),
      names_(std::move(param_names)),
      params_(std::move(params)),
      group_(group),
      strategy_(strategy) {
  LOCKSTEP_CHECK(!params_.empty(), "FSDP unit '", name_, "' has no parameters");
  const auto dtype = params_[0].scalar_type();
  int64_t total = 0;
  for (size_t i = 0; i < params_.size(); ++i) {
    const auto& p = params_[i];
    if (p.scalar_type() != dtype || !p.device().is_cpu())
      throw InvalidArgument(
          detail::concat("FSDP unit '", name_, "': parameter '", names_[i], "' is ",
                         comm::dtype_name(p.scalar_type()), " on ", p.device(), ", but '",
                         names_[0], "' is ", comm::dtype_name(dtype),
                         " on cpu; a unit's parameters must share one dtype and be "
                         "on the CPU (wrap the odd ones in a unit of their own)"));
    offsets_.push_back(total);
    total += p.numel();
    if (p.requires_grad()) ++expected_grads_;
  }
  const int P = sharded() ? group_.size() : 1;
  numel_ = total;
  padded_ = (total + P - 1) / P * P;
  shard_numel_ = padded_ / P;

  at::NoGradGuard no_grad;
  full_ = at::zeros({padded_}, params_[0].options().requires_grad(false));
  for (size_t i = 0; i < params_.size(); ++i) {
    auto slot = full_.narrow(0, offsets_[i], params_[i].numel()).view(params_[i].sizes());
    slot.copy_(params_[i].detach());
    params_[i].set_data(slot);  // same leaf tensor, its data now a view into full_
  }
  if (sharded()) {
    shard_ = full_.narrow(0, group_.rank() * shard_numel_, shard_numel_).clone();
    free_full();
  } else {
    shard_ = full_.detach();  // NoShard: the parameters are views of the shard itself
  }
  shard_.requires_grad_(true);
}

void FlatUnit::set_storage_bytes(int64_t bytes) { compat::resize_storage_bytes(full_, bytes); }

int64_t FlatUnit::gathered_bytes() const { return static_cast<int64_t>(full_.storage().nbytes()); }

void FlatUnit::begin_gather() {
  if (state_ != State::Free) return;
  set_storage_bytes(padded_ * static_cast<int64_t>(full_.element_size()));
  at::Tensor in = shard_.detach();
  gather_work_ = group_.allgather(full_, in);
  state_ = State::Gathering;
}

void FlatUnit::wait_gathered() {
  begin_gather();
  if (state_ == State::Gathering) {
    gather_work_->wait();
    gather_work_.reset();
    state_ = State::Gathered;
  }
}

void FlatUnit::free_full() {
  if (!sharded() || state_ == State::Free) return;
  if (state_ == State::Gathering) {  // never free memory a transfer is writing
    gather_work_->wait();
    gather_work_.reset();
  }
  set_storage_bytes(0);
  state_ = State::Free;
}

bool FlatUnit::param_grad_ready(size_t i) {
  auto& p = params_[i];
  at::Tensor& g = p.mutable_grad();
  if (g.defined()) {
    if (!grad_full_.defined()) grad_full_ = at::zeros({padded_}, full_.options());
    at::NoGradGuard no_grad;
    grad_full_.narrow(0, offsets_[i], p.numel()).view(p.sizes()).add_(g);
    g = at::Tensor();  // the full gradient lives on only in the flat buffer
  }
  return ++arrived_grads_ == expected_grads_;
}

void FlatUnit::begin_reduce() {
  LOCKSTEP_CHECK(reduce_work_ == nullptr, "FSDP unit '", name_, "': reduction launched twice");
  if (!grad_full_.defined()) grad_full_ = at::zeros({padded_}, full_.options());
  if (sharded()) {
    grad_shard_ = at::empty({shard_numel_}, full_.options());
    reduce_work_ =
        group_.reduce_scatter(grad_shard_, grad_full_, {comm::ReduceOp::Avg, comm::Millis(0)});
  } else {
    grad_shard_ = grad_full_;
    reduce_work_ = group_.allreduce(grad_shard_, {comm::ReduceOp::Avg, comm::Millis(0)});
  }
}

void FlatUnit::finish_reduce() {
  if (reduce_work_ == nullptr) return;
  reduce_work_->wait();
  reduce_work_.reset();
  at::Tensor& g = shard_.mutable_grad();
  if (g.defined()) {
    at::NoGradGuard no_grad;
    g.add_(grad_shard_);
  } else {
    g = grad_shard_;
  }
  grad_full_ = at::Tensor();
  grad_shard_ = at::Tensor();
  arrived_grads_ = 0;
}

}  // namespace lockstep::fsdp
