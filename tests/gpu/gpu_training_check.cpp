// GPU checks of training on CUDA tensors (docs/gpu.md, "The device run"). Run under
// lockstep-run: 2 ranks sharing one GPU on shm or gloo (the group stages CUDA tensors
// through pinned host memory), or 1 rank on nccl (NCCL takes one GPU per rank).
//   1. every collective on CUDA tensors, including a tensor still being produced by a
//      kernel when the op is issued (the stream order), and a mixed-device call refused;
//   2. DDP of a CUDA model equal to one process on the concatenated batch (fp32 within
//      1e-5 after 10 steps, float64 AdamW within 1e-9), fp16 hook on device buckets;
//   3. QSGD (4 bits, buckets of 128) on CUDA buffers: the compressed allreduce within its
//      rounding of the exact mean, replicas bit-identical, a NaN raised on every rank
//      naming its layer; DDP's QSGD hook on CUDA buckets;
//   4. FSDP of a CUDA model (full_shard, shard_grad_op, no_shard) equal to one process
//      (fp32 within 1e-5 after 10 steps, float64 AdamW within 1e-9);
//   5. the gradient scaler with fp16 autocast on CUDA: an inf injected on the last rank
//      skips the step on every rank;
//   --bench: the CUDA codec's GB/s against a device-to-device copy, and a DDP step of a
//      67M-parameter MLP with and without QSGD (rank 0 prints; figures, not checks), the
//      workload of torch_ddp_peer.py (PyTorch's DDP over gloo).
// Without a GPU it prints "needs a CUDA GPU: none visible" and passes (CI builds it only).
#include <lockstep/compress/cuda_codec.h>
#include <lockstep/lockstep.h>
#include <lockstep/numerics/autocast.h>
#include <lockstep/numerics/grad_scaler.h>
#include <lockstep/parallel/ddp/ddp.h>

#include <lockstep/launch/cli.h>
#include <torch/torch.h>

#include "../multiprocess/tally.h"

#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <limits>
#include <string>

namespace {

using tally::check;
using tally::report;

// max |a - b| over the tensors, in float64 on the CPU.
double max_diff(const std::vector<at::Tensor>& a, const std::vector<at::Tensor>& b) {
  double d = 0;
  for (size_t i = 0; i < a.size(); ++i)
    d = std::max(d, (a[i].detach().cpu().to(at::kDouble) - b[i].detach().cpu().to(at::kDouble))
                        .abs()
                        .max()
                        .item<double>());
  return a.size() == b.size() ? d : std::numeric_limits<double>::infinity();
}

// max over ranks of |this rank's tensors - rank 0's| (0: the replicas are bit-identical).
double spread_across_ranks(lockstep::ProcessGroup& pg, const std::vector<at::Tensor>& ts) {
  std::vector<at::Tensor> flat;
  for (const auto& t : ts) flat.push_back(t.detach().cpu().to(at::kDouble).reshape(-1));
  at::Tensor mine = at::cat(flat), root = mine.clone();
  pg.broadcast(root, {0})->wait();
  at::Tensor d = (mine - root).abs().max().reshape({1});
  pg.allreduce(d, {lockstep::comm::ReduceOp::Max})->wait();
  return d.item<double>();
}

// --- 1. collectives ----------------------------------------------------------------

void check_collectives(lockstep::ProcessGroup& pg, const at::Device dev) {
  const int P = pg.size(), r = pg.rank();
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  const std::string be = pg.backend_name();
  {  // produced by a kernel that may still run when the op is issued: the stream order
    auto produce = [&](int q) {
      at::manual_seed(100 + q);
      auto a = at::randn({2048, 2048}, f32);
      return a.matmul(a).sum(1);
    };
    at::Tensor t = produce(r);
    pg.allreduce(t)->wait();
    at::Tensor expected = at::zeros({2048}, f32);
    for (int q = 0; q < P; ++q) expected += produce(q);
    const double rel = ((t - expected).abs().max() / expected.abs().max()).item<double>();
    report(be + " allreduce of a tensor still being computed (relative)", rel, 1e-5);
  }
  {
    at::Tensor t = at::full({1000}, float(r + 1), f32);
    pg.allreduce(t, {lockstep::comm::ReduceOp::Avg})->wait();
    t.mul_(2);  // queued on the caller's stream after wait(): sees the result
    report(be + " allreduce avg then a kernel", (t - float(P + 1)).abs().max().item<double>(), 0);
  }
  {
    std::vector<at::Tensor> ts{at::full({3}, float(r), f32), at::full({5, 7}, float(2 * r), f32)};
    pg.allreduce_coalesced(ts)->wait();
    const float s = float(P * (P - 1) / 2);
    report(be + " allreduce_coalesced",
           std::max((ts[0] - s).abs().max().item<double>(),
                    (ts[1] - 2 * s).abs().max().item<double>()),
           0);
  }
  {
    at::Tensor t = at::full({257}, float(r + 10), f32);
    const int root = P - 1;
    pg.broadcast(t, {root})->wait();
    report(be + " broadcast", (t - float(root + 10)).abs().max().item<double>(), 0);
  }
  {
    at::Tensor in = at::full({33}, float(r), f32), out = at::empty({33 * P}, f32);
    pg.allgather(out, in)->wait();
    at::Tensor expected = at::arange(P, f32).repeat_interleave(33);
    report(be + " allgather", (out - expected).abs().max().item<double>(), 0);
  }
  {
    at::Tensor in = at::arange(16 * P, f32) + r, out = at::empty({16}, f32);
    pg.reduce_scatter(out, in)->wait();
    at::Tensor expected = (at::arange(16, f32) + 16 * r) * P + float(P * (P - 1) / 2);
    report(be + " reduce_scatter", (out - expected).abs().max().item<double>(), 0);
  }
  {
    at::Tensor in = at::arange(4 * P, f32) + 100 * r, out = at::empty({4 * P}, f32);
    pg.alltoall(out, in)->wait();
    double d = 0;  // slice q of out = rank q's slice r
    for (int q = 0; q < P; ++q)
      d = std::max(d, (out.narrow(0, 4 * q, 4) - (at::arange(4, f32) + 4 * r + 100 * q))
                          .abs()
                          .max()
                          .item<double>());
    report(be + " alltoall", d, 0);
  }
  if (P >= 2 && r < 2) {
    at::Tensor t = r == 0 ? at::full({99}, 7.0f, f32) : at::zeros({99}, f32);
    if (r == 0)
      pg.send(t, 1)->wait();
    else
      pg.recv(t, 0)->wait();
    report(be + " send/recv", (t - 7.0f).abs().max().item<double>(), 0);
  }
  try {
    at::Tensor out = at::empty({4 * P}, f32), in = at::zeros({4});
    pg.allgather(out, in);
    check(be + " mixed devices refused", false, "no error");
  } catch (const lockstep::InvalidArgument& e) {
    const std::string m = e.what();
    check(be + " mixed devices refused, naming both",
          m.find("cpu") != std::string::npos && m.find("cuda") != std::string::npos, m);
  }
}

// The compressed allreduce of a CUDA buffer (the CUDA codec and an allgather of its bytes
// at P > 1): the mean within 4-bit rounding of the exact one, replicas bit-identical, and a
// NaN on the last rank raised on every rank naming its layer.
void check_compressed(lockstep::ProcessGroup& pg, const at::Device dev) {
  const int P = pg.size(), r = pg.rank();
  const std::string tag =
      "qsgd allreduce of a CUDA buffer P=" + std::to_string(P) + " " + pg.backend_name();
  // {name, offset, numel}: "small" [0, 500), "a" [500, 3000), a hole, "b" [3500, 8500).
  std::vector<lockstep::compress::LayerSpan> layers{
      {"small", 0, 500}, {"a", 500, 2500}, {"b", 3500, 5000}};
  lockstep::compress::QsgdOptions o;
  o.min_layer = 1024;  // "small" and the hole after "a" plain
  lockstep::compress::CompressedAllreduce plan(o, layers, 8500, P);
  at::manual_seed(40 + r);
  const at::Tensor x = at::randn({8500}, at::TensorOptions().device(dev));
  at::Tensor exact = x.clone(), y = x.clone();
  pg.allreduce(exact, {lockstep::comm::ReduceOp::Avg})->wait();
  plan.run(pg, y, /*average=*/true);
  // 4 bits over a bucket of 128 normal values: a unit of about 6/15 per value, halved by
  // the mean of 2 ranks and unbiased; the plain layers are exact.
  report(tag + " mean", (y - exact).abs().max().item<double>(), 0.45);
  report(tag + " plain layers exact",
         std::max((y.narrow(0, 0, 500) - exact.narrow(0, 0, 500)).abs().max().item<double>(),
                  (y.narrow(0, 3000, 500) - exact.narrow(0, 3000, 500)).abs().max().item<double>()),
         P == 1 ? 0 : 1e-6);
  report(tag + " replicas bit-identical", spread_across_ranks(pg, {y}), 0);
  at::Tensor bad = x.clone();
  if (r == P - 1) bad[4000] = std::numeric_limits<float>::quiet_NaN();
  try {
    plan.run(pg, bad, true);
    check(tag + " a NaN on rank " + std::to_string(P - 1) + " is raised", false, "no error");
  } catch (const lockstep::compress::NonFiniteGradient& e) {
    check(tag + " a NaN on rank " + std::to_string(P - 1) + " is raised naming layer 'b'",
          e.layer() == "b", e.what());
  }
}

// --- 2, 3. DDP --------------------------------------------------------------------

struct Mlp : torch::nn::Module {
  explicit Mlp(int64_t width = 64) {
    fc1 = register_module("fc1", torch::nn::Linear(16, width));
    fc2 = register_module("fc2", torch::nn::Linear(width, width));
    fc3 = register_module("fc3", torch::nn::Linear(width, 4));
  }
  torch::Tensor forward(const torch::Tensor& x) {
    return fc3(torch::tanh(fc2(torch::relu(fc1(x)))));
  }
  torch::nn::Linear fc1{nullptr}, fc2{nullptr}, fc3{nullptr};
};

struct Case {
  std::string name;
  at::ScalarType dtype = at::kFloat;
  bool adamw = false;
  int steps = 10;
  double tol = 1e-5;
  lockstep::DDPOptions options;
  lockstep::ddp::CommHook hook;
  bool replicas_identical = false;  // check the replicas' bits too
};

std::unique_ptr<torch::optim::Optimizer> make_opt(const Case& c, std::vector<at::Tensor> ps) {
  if (c.adamw)
    return std::make_unique<torch::optim::AdamW>(
        std::move(ps), torch::optim::AdamWOptions(1e-2).weight_decay(0.05));
  return std::make_unique<torch::optim::SGD>(std::move(ps),
                                             torch::optim::SGDOptions(0.1).momentum(0.9));
}

// `steps` steps of `parallel` on this rank's slice of a batch of 8 samples a rank, and of
// `ref` (one process) on the whole batch, the same on every rank (seeds seed, seed + 1, ...).
template <class Parallel, class Ref>
void train_beside_reference(Parallel& parallel, Ref& ref, torch::optim::Optimizer& opt,
                            torch::optim::Optimizer& ref_opt, const at::TensorOptions& o,
                            lockstep::ProcessGroup& pg, int steps, uint64_t seed) {
  const int P = pg.size(), r = pg.rank();
  const int64_t B = 8;
  for (int s = 0; s < steps; ++s) {
    torch::manual_seed(seed + uint64_t(s));
    auto x = torch::randn({P * B, 16}, o), y = torch::randn({P * B, 4}, o);
    torch::mse_loss(parallel(x.narrow(0, r * B, B)), y.narrow(0, r * B, B)).backward();
    torch::mse_loss(ref.forward(x), y).backward();
    opt.step();
    ref_opt.step();
    opt.zero_grad();
    ref_opt.zero_grad();
  }
}

void run_ddp(const std::shared_ptr<lockstep::ProcessGroup>& pg, const at::Device dev,
             const Case& c) {
  const int P = pg->size(), r = pg->rank();
  torch::manual_seed(1000 + r);  // different weights: DDP's broadcast must fix that
  auto model = std::make_shared<Mlp>();
  model->to(dev, c.dtype);
  lockstep::DistributedDataParallel<Mlp> ddp(model, pg, c.options);
  if (c.hook) ddp.register_comm_hook(c.hook);
  torch::manual_seed(1000);  // the reference: rank 0's initial weights
  auto ref = std::make_shared<Mlp>();
  ref->to(dev, c.dtype);
  auto opt = make_opt(c, ddp.parameters());
  auto ref_opt = make_opt(c, ref->parameters());
  train_beside_reference(ddp, *ref, *opt, *ref_opt, at::TensorOptions().dtype(c.dtype).device(dev),
                         *pg, c.steps, 77);
  const std::string tag = c.name + " P=" + std::to_string(P) + " " + pg->backend_name();
  check(tag + " buckets on " + dev.str(), ddp.reducer().buckets().front().buffer.device() == dev);
  report(tag + " params", max_diff(model->parameters(), ref->parameters()), c.tol);
  if (c.replicas_identical)
    report(tag + " replicas bit-identical", spread_across_ranks(*pg, model->parameters()), 0);
}

// FSDP of a CUDA model (each Linear a unit) against one process on the whole batch.
struct SeqNet : torch::nn::Module {
  explicit SeqNet(bool wrapped) {
    torch::nn::Sequential s(torch::nn::Linear(16, 48), torch::nn::Tanh(), torch::nn::Linear(48, 40),
                            torch::nn::ReLU(), torch::nn::Linear(40, 4));
    seq = register_module("seq", wrapped ? lockstep::fsdp::wrap_children(s) : s);
  }
  torch::Tensor forward(const torch::Tensor& x) { return seq->forward(x); }
  torch::nn::Sequential seq{nullptr};
};

void run_fsdp(const std::shared_ptr<lockstep::ProcessGroup>& pg, const at::Device dev,
              lockstep::fsdp::ShardingStrategy strategy, at::ScalarType dtype, bool adamw,
              double tol) {
  const int P = pg->size(), r = pg->rank();
  torch::manual_seed(21 + r);
  auto model = std::make_shared<SeqNet>(true);
  model->to(dev, dtype);
  lockstep::fsdp::FSDPOptions o;
  o.strategy = strategy;
  lockstep::FullyShardedDataParallel f(model, pg, o);
  torch::manual_seed(21);
  auto ref = std::make_shared<SeqNet>(false);
  ref->to(dev, dtype);
  Case c;
  c.adamw = adamw;
  auto opt = make_opt(c, f.parameters());
  auto ref_opt = make_opt(c, ref->parameters());
  train_beside_reference(f, *ref, *opt, *ref_opt, at::TensorOptions().dtype(dtype).device(dev), *pg,
                         10, 300);
  const std::string tag = tally::format(
      "fsdp %s %s %s P=%d %s", lockstep::fsdp::strategy_name(strategy),
      dtype == at::kDouble ? "f64" : "f32", adamw ? "adamw" : "sgd", P, pg->backend_name().c_str());
  check(tag + " shards on " + dev.str(), f.parameters().front().device() == dev);
  f.summon_full_params();
  report(tag + " params", max_diff(model->parameters(), ref->parameters()), tol);
  f.release_full_params();
}

void check_scaler(const std::shared_ptr<lockstep::ProcessGroup>& pg, const at::Device dev) {
  const int P = pg->size(), r = pg->rank();
  torch::manual_seed(5);
  auto model = std::make_shared<Mlp>();
  model->to(dev);
  lockstep::DistributedDataParallel<Mlp> ddp(model, pg);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.05));
  lockstep::numerics::GradScalerOptions so;
  so.init_scale = 1024;
  lockstep::numerics::GradScaler scaler(so, pg);
  const auto o = at::TensorOptions().device(dev);
  const std::string tag = "fp16 autocast+scaler P=" + std::to_string(P) + " " + pg->backend_name();
  for (int s = 0; s < 4; ++s) {
    torch::manual_seed(300 + s);
    auto x = torch::randn({8, 16}, o), y = torch::randn({8, 4}, o);
    at::Tensor loss;
    {
      lockstep::numerics::Autocast fp16({c10::DeviceType::CUDA, at::kHalf});
      loss = torch::mse_loss(ddp(x).to(at::kFloat), y);
    }
    scaler.scale(loss).backward();
    if (s == 2 && r == P - 1) {  // after DDP averaged: an inf on one rank only
      torch::NoGradGuard ng;
      ddp.parameters()[0].grad().view(-1)[0] = std::numeric_limits<float>::infinity();
    }
    std::vector<at::Tensor> before;
    for (auto& p : ddp.parameters()) before.push_back(p.detach().clone());
    const double scale_before = scaler.get_scale();
    const bool stepped = scaler.step(opt);
    scaler.update();
    opt.zero_grad();
    if (s == 2) {
      check(tag + " the step with an inf on rank " + std::to_string(P - 1) + " is skipped",
            !stepped && max_diff(before, ddp.parameters()) == 0 &&
                scaler.get_scale() == scale_before * 0.5,
            tally::format("stepped %d, scale %g -> %g", int(stepped), scale_before,
                          scaler.get_scale()));
    } else if (s == 1) {
      check(tag + " a finite step steps", stepped);
    }
  }
  report(tag + " replicas identical", spread_across_ranks(*pg, ddp.parameters()), 0);
}

// --- bench ---------------------------------------------------------------------------

double seconds_of(const std::function<void()>& f, int reps) {
  f();  // warm up
  torch::cuda::synchronize();
  const auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < reps; ++i) f();
  torch::cuda::synchronize();
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
}

void bench_codec(const at::Device dev) {
  const int64_t n = int64_t(1) << 26;  // 64 Mi floats, 256 MiB
  const auto f32 = at::TensorOptions().dtype(at::kFloat).device(dev);
  at::Tensor x = at::randn({n}, f32), y = at::empty({n}, f32);
  lockstep::compress::CodecOptions co{4, 128, true};
  at::Tensor enc = at::empty({lockstep::compress::encoded_bytes(n, co)},
                             at::TensorOptions().dtype(at::kByte).device(dev));
  const double copy_s = seconds_of([&] { y.copy_(x); }, 20);
  lockstep::compress::StreamKey key{};
  const double enc_s = seconds_of(
      [&] {
        lockstep::compress::cuda::encode(x.data_ptr(), at::kFloat, n, co, key, 0,
                                         enc.data_ptr<uint8_t>(), nullptr);
      },
      20);
  const double dec_s = seconds_of(
      [&] {
        lockstep::compress::cuda::decode(enc.data_ptr<uint8_t>(), n, co, y.data_ptr(), at::kFloat,
                                         nullptr);
      },
      20);
  const double gb = double(n) * 4 / 1e9;
  // A copy reads and writes n floats: its rate in input bytes per second is the bound an
  // encoder (reads 4 bytes, writes ~0.56) or decoder approaches.
  std::printf(
      "bench codec 4-bit/128 on %lld floats: copy %.0f GB/s, encode %.0f GB/s (%.0f%% of "
      "copy), decode %.0f GB/s (%.0f%% of copy)\n",
      (long long)n, gb / copy_s, gb / enc_s, 100 * copy_s / enc_s, gb / dec_s,
      100 * copy_s / dec_s);
}

void bench_ddp(const std::shared_ptr<lockstep::ProcessGroup>& pg, const at::Device dev,
               lockstep::ddp::CommHook hook, const char* what) {
  torch::manual_seed(9);
  auto model = std::make_shared<Mlp>(8192);  // 67M parameters, 270 MB of fp32 gradients
  model->to(dev);
  lockstep::DistributedDataParallel<Mlp> ddp(model, pg);
  if (hook) ddp.register_comm_hook(hook);
  torch::optim::SGD opt(ddp.parameters(), torch::optim::SGDOptions(0.01));
  const auto o = at::TensorOptions().device(dev);
  auto x = torch::randn({256, 16}, o), y = torch::randn({256, 4}, o);
  const double s = seconds_of(
      [&] {
        torch::mse_loss(ddp(x), y).backward();
        opt.step();
        opt.zero_grad();
      },
      10);
  if (pg->rank() == 0)
    std::printf("bench lockstep ddp step (67M params, %d ranks, %s, %s): %.1f ms\n", pg->size(),
                pg->backend_name().c_str(), what, s * 1e3);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{
      "gpu_training_check: collectives, DDP, QSGD and the gradient scaler on CUDA "
      "tensors (run under lockstep-run)",
      "gpu_training_check"};
  bool bench = false;
  app.add_flag("--bench", bench, "also time the CUDA codec and a DDP step (rank 0 prints)");
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;
  if (!torch::cuda::is_available()) {
    std::printf("gpu_training_check: needs a CUDA GPU: none visible\n");
    return 0;
  }
  try {
    auto pg = lockstep::init();
    tally::rank = pg->rank();
    tally::subject = "result";
    const char* lr = std::getenv("LOCAL_RANK");
    const int local = lr ? std::atoi(lr) : 0;
    const at::Device dev(at::kCUDA, static_cast<c10::DeviceIndex>(
                                        local % static_cast<int>(torch::cuda::device_count())));
    c10::DeviceGuard device_guard(dev);
    check_collectives(*pg, dev);
    check_compressed(*pg, dev);
    Case c;
    c.name = "ddp mlp f32 sgd";
    c.options.first_bucket_bytes = 1024;  // several buckets
    c.options.bucket_cap_bytes = 8192;
    run_ddp(pg, dev, c);
    c.name = "ddp mlp f32 sgd bucket-views";
    c.options.gradient_as_bucket_view = true;
    run_ddp(pg, dev, c);
    c.name = "ddp mlp f64 adamw";
    c.dtype = at::kDouble;
    c.adamw = true;
    c.tol = 1e-9;
    c.options.gradient_as_bucket_view = false;
    run_ddp(pg, dev, c);
    c = Case{};
    c.name = "ddp mlp f32 sgd fp16-hook";
    c.hook = lockstep::ddp::hooks::fp16_compress_hook();
    c.tol = 1e-3;
    run_ddp(pg, dev, c);
    c.name = "ddp mlp f32 sgd qsgd-4bit";
    lockstep::compress::QsgdOptions q;
    q.min_layer = 256;  // fc2 (64x64) and fc1 compressed, the biases plain
    c.hook = lockstep::ddp::hooks::qsgd(q);
    c.tol = 0.05;  // 4-bit stochastic rounding: unbiased, not exact
    c.replicas_identical = true;
    run_ddp(pg, dev, c);
    for (auto st :
         {lockstep::fsdp::ShardingStrategy::FullShard,
          lockstep::fsdp::ShardingStrategy::ShardGradOp, lockstep::fsdp::ShardingStrategy::NoShard})
      run_fsdp(pg, dev, st, at::kFloat, false, 1e-5);
    run_fsdp(pg, dev, lockstep::fsdp::ShardingStrategy::FullShard, at::kDouble, true, 1e-9);
    check_scaler(pg, dev);
    if (bench) {
      if (pg->rank() == 0) bench_codec(dev);
      bench_ddp(pg, dev, nullptr, "fp32 allreduce");
      bench_ddp(pg, dev, lockstep::ddp::hooks::qsgd({}), "qsgd 4-bit");
    }
    pg->barrier()->wait();
  } catch (const std::exception& e) {
    check("no unexpected error", false, e.what());
  }
  return tally::finish();
}
