#include "train/step_runner.h"

#include "train/fsdp_support.h"

#include <lockstep/parallel/hooks/qsgd_hook.h>

namespace lockstep::train {

LossCallImpl::LossCallImpl(std::shared_ptr<torch::nn::Module> model) {
  register_module("module", std::move(model));
}

StepRunner::StepRunner(const TrainConfig& cfg, Workload& workload,
                       std::shared_ptr<torch::nn::Module> model,
                       std::shared_ptr<comm::ProcessGroup> group)
    : cfg_(cfg), workload_(workload), model_(std::move(model)), group_(std::move(group)) {
  if (cfg_.strategy.kind == "fsdp") {
    LOCKSTEP_CHECK(group_, "strategy.kind = \"fsdp\" needs a process group");
    fsdp_ = std::make_unique<fsdp::FullyShardedDataParallel<LossCallImpl>>(
        std::make_shared<LossCallImpl>(model_), group_, fsdp_options(cfg_.strategy));
    build_optimizer(fsdp_->parameters());  // the local shards: optimizer state is 1/P
  } else {
    build_optimizer(model_->parameters());
  }
}

void StepRunner::build_optimizer(const std::vector<torch::Tensor>& params) {
  const auto& o = cfg_.optim;
  if (o.name == "sgd")
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  else
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        params,
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay));
}

void StepRunner::wrap_ddp() {
  if (cfg_.strategy.kind != "ddp") return;
  DDPOptions d;
  // A model without buffers needs no buffer broadcast: it would cost a collective per forward.
  d.broadcast_buffers = !model_->buffers().empty();
  ddp_ = std::make_unique<ddp::DistributedDataParallel<LossCallImpl>>(
      std::make_shared<LossCallImpl>(model_), group_, d);
  if (cfg_.strategy.comm_hook == "bf16") ddp_->register_comm_hook(ddp::hooks::bf16_compress_hook());
  if (cfg_.strategy.comm_hook == "qsgd") {
    compress::QsgdOptions q;
    q.bits = int(cfg_.strategy.qsgd_bits);
    q.bucket_size = cfg_.strategy.qsgd_bucket_size;
    q.seed = uint64_t(cfg_.run.seed);
    ddp_->register_comm_hook(compress::qsgd(q));
  }
}

torch::Tensor StepRunner::forward_loss(const Batch& batch) {
  const std::function<torch::Tensor()> loss = [&] { return workload_.loss(batch); };
  if (ddp_) return ddp_->forward(loss);
  if (fsdp_) return fsdp_->forward(loss);
  return loss();
}

// The global L2 norm over all gradients: under DDP every rank holds all of them (identical);
// under FSDP each rank holds a shard, so the norm is a collective (every rank calls it).
void StepRunner::clip_gradients() {
  if (cfg_.optim.grad_clip <= 0) return;
  if (fsdp_)
    fsdp_->clip_grad_norm(cfg_.optim.grad_clip);
  else
    torch::nn::utils::clip_grad_norm_(model_->parameters(), cfg_.optim.grad_clip);
}

double StepRunner::step(BatchStream& batches, double lr, int64_t accum) {
  for (auto& g : optimizer_->param_groups()) g.options().set_lr(lr);
  optimizer_->zero_grad();
  double loss_sum = 0;
  for (int64_t m = 0; m < accum; ++m) {
    const auto batch = batches.next(cfg_.train.batch_size);
    auto run = [&] {
      auto loss = forward_loss(*batch) / double(accum);
      loss.backward();
      loss_sum += loss.item<double>();
    };
    if (ddp_ && m + 1 < accum) {
      auto guard = ddp_->no_sync();  // gradients accumulate locally until the last micro-step
      run();
    } else {
      run();
    }
  }
  clip_gradients();
  optimizer_->step();
  if (ddp_) {
    const auto& s = ddp_->last_step_stats();
    stats_.exposed_comm_s += s.exposed_comm_s;
    stats_.bytes_sent += s.bytes_sent;
    ++stats_.sync_steps;
  }
  return loss_sum;
}

}  // namespace lockstep::train
