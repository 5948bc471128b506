#include "train/step_runner.h"

#include <lockstep/parallel/hooks/qsgd_hook.h>

namespace lockstep::train {

LossCallImpl::LossCallImpl(std::shared_ptr<torch::nn::Module> model) {
  register_module("module", std::move(model));
}

StepRunner::StepRunner(const TrainConfig& cfg, Workload& workload,
                       std::shared_ptr<torch::nn::Module> model)
    : cfg_(cfg), workload_(workload), model_(std::move(model)) {
  auto params = model_->parameters();
  const auto& o = cfg_.optim;
  if (o.name == "sgd")
    optimizer_ = std::make_unique<torch::optim::SGD>(
        params, torch::optim::SGDOptions(o.lr).momentum(o.momentum).weight_decay(o.weight_decay));
  else
    optimizer_ = std::make_unique<torch::optim::AdamW>(
        params,
        torch::optim::AdamWOptions(o.lr).betas({o.beta1, o.beta2}).weight_decay(o.weight_decay));
}

void StepRunner::wrap_ddp(std::shared_ptr<comm::ProcessGroup> group) {
  if (cfg_.strategy.kind != "ddp") return;
  DDPOptions d;
  // A model without buffers needs no buffer broadcast: it would cost a collective per forward.
  d.broadcast_buffers = !model_->buffers().empty();
  ddp_ = std::make_unique<ddp::DistributedDataParallel<LossCallImpl>>(
      std::make_shared<LossCallImpl>(model_), std::move(group), d);
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
  if (!ddp_) return workload_.loss(batch);
  return ddp_->forward(std::function<torch::Tensor()>([&] { return workload_.loss(batch); }));
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
  if (cfg_.optim.grad_clip > 0)
    torch::nn::utils::clip_grad_norm_(model_->parameters(), cfg_.optim.grad_clip);
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
