// fashion-mnist-ddp: train a small ConvNet on Fashion-MNIST with data parallelism.
//
//   lockstep-run --nproc-per-node 2 --master-port 0 fashion-mnist-ddp --epochs 3
//
// Every rank holds a replica of the model and trains on its own share of each epoch
// (DistributedSampler); DistributedDataParallel averages the gradients during
// backward, so the replicas take identical optimizer steps. Rank 0 prints.
#include <lockstep/lockstep.h>
#include <lockstep/compress/ddp_hook.h>
#include <lockstep/data/data.h>
#include <lockstep/ddp/hooks.h>
#include <lockstep/ddp/ddp.h>
#include <lockstep/models/convnet.h>

#include <torch/torch.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>

#include "progress.h"

namespace {

struct Flags {
  int epochs = 3;
  int64_t batch_size = 64;        // per rank; the global batch is world_size times larger
  double lr = 0.05;               // peak learning rate (cosine decay to 0 over the run)
  std::string optimizer = "sgd";  // "sgd" (momentum 0.9, nesterov) or "adamw"
  std::string data_dir;           // empty: /usr/share/datasets/fashion-mnist
  uint64_t seed = 0;
  int progress_every = 10;        // percent, when stdout is not a terminal
  std::string compression = "none";  // gradient compression: none | qsgd4 | qsgd2 | bf16
  std::string loss_csv;           // rank 0 writes "step,epoch,loss" per step here (empty: off)
};

const char* kUsage =
    "usage: fashion-mnist-ddp [--epochs N] [--batch-size N] [--lr X] [--optimizer sgd|adamw]\n"
    "                         [--data-dir DIR] [--seed N] [--progress-every PERCENT]\n"
    "                         [--compression none|qsgd4|qsgd2|bf16] [--loss-csv FILE]\n"
    "--compression: qsgd4/qsgd2 = QSGD 4/2-bit gradients, bucket 128 (LOCKSTEP_COMPRESSION_*\n"
    "  variables still apply); bf16 = bfloat16 allreduce. --loss-csv: rank 0 writes the\n"
    "  global (all-rank mean) loss of every step as CSV (step,epoch,loss).\n"
    "Run it under lockstep-run (or mpirun/Slurm); without a launcher it trains on 1 rank.\n";

// Flag parsing: long flags with a value ("--epochs 3" or "--epochs=3"), strict numbers.
Flags parse_flags(int argc, char** argv) {
  Flags f;
  for (int i = 1; i < argc; ++i) {
    std::string arg = argv[i], value;
    if (arg == "--help" || arg == "-h") {
      std::fputs(kUsage, stdout);
      std::exit(0);
    }
    if (auto eq = arg.find('='); eq != std::string::npos) {
      value = arg.substr(eq + 1);
      arg = arg.substr(0, eq);
    } else if (i + 1 < argc) {
      value = argv[++i];
    } else {
      throw lockstep::InvalidArgument("flag " + arg + " needs a value");
    }
    auto number = [&](double lo, double hi) {
      size_t used = 0;
      double v = 0;
      try { v = std::stod(value, &used); } catch (const std::exception&) { used = 0; }
      if (used != value.size() || !(v >= lo && v <= hi)) {
        std::ostringstream msg;
        msg << arg << ": expected a number in [" << lo << ", " << hi << "], got '" << value << "'";
        throw lockstep::InvalidArgument(msg.str());
      }
      return v;
    };
    auto integer = [&](double lo, double hi) {
      const double v = number(lo, hi);
      if (v != std::floor(v))
        throw lockstep::InvalidArgument(arg + ": expected an integer, got '" + value + "'");
      return static_cast<int64_t>(v);
    };
    if (arg == "--epochs") f.epochs = static_cast<int>(integer(1, 1000));
    else if (arg == "--batch-size") f.batch_size = integer(1, 65536);
    else if (arg == "--lr") f.lr = number(1e-8, 10);
    else if (arg == "--seed") f.seed = static_cast<uint64_t>(integer(0, 1e15));
    else if (arg == "--progress-every") f.progress_every = static_cast<int>(integer(1, 100));
    else if (arg == "--data-dir") f.data_dir = value;
    else if (arg == "--loss-csv") f.loss_csv = value;
    else if (arg == "--compression") {
      if (value != "none" && value != "qsgd4" && value != "qsgd2" && value != "bf16")
        throw lockstep::InvalidArgument("--compression: expected none, qsgd4, qsgd2 or bf16, got '" +
                                        value + "'");
      f.compression = value;
    }
    else if (arg == "--optimizer") {
      if (value != "sgd" && value != "adamw")
        throw lockstep::InvalidArgument("--optimizer: expected sgd or adamw, got '" + value + "'");
      f.optimizer = value;
    } else {
      throw lockstep::InvalidArgument("unknown flag " + arg + "\n" + kUsage);
    }
  }
  return f;
}

// Sum a few doubles over all ranks (one small allreduce).
std::vector<double> sum_over_ranks(lockstep::ProcessGroup& group, std::vector<double> v) {
  auto t = torch::tensor(v, torch::kFloat64);
  group.allreduce(t)->wait();
  return std::vector<double>(t.data_ptr<double>(), t.data_ptr<double>() + t.numel());
}

constexpr double kPi = 3.14159265358979323846;
using Seconds = std::chrono::duration<double>;
double since(std::chrono::steady_clock::time_point t) {
  return Seconds(std::chrono::steady_clock::now() - t).count();
}

// This rank's share of the test set: images rank, rank + world, ... (so the ranks
// together score every image exactly once). Returns {correct, images scored}.
std::pair<double, double> evaluate(lockstep::models::ConvNet& model,
                                   const lockstep::data::FashionMnist& test_set, int rank,
                                   int world) {
  model->eval();  // BatchNorm uses its running statistics, dropout is off
  torch::NoGradGuard no_grad;
  const int64_t n = test_set.images().size(0);
  auto images = test_set.images().slice(0, rank, n, world);
  auto labels = test_set.targets().slice(0, rank, n, world);
  double correct = 0;
  for (int64_t i = 0; i < images.size(0); i += 1000) {
    // model->forward, not ddp(...): evaluation needs no gradient synchronization.
    auto pred = model->forward(images.slice(0, i, i + 1000)).argmax(1);
    correct += pred.eq(labels.slice(0, i, i + 1000)).sum().item<double>();
  }
  return {correct, static_cast<double>(images.size(0))};
}

int train(const Flags& flags) {
  // One compute thread per rank: P ranks on P cores, not P x cores threads fighting.
  if (!std::getenv("OMP_NUM_THREADS")) torch::set_num_threads(1);

  auto group = lockstep::init();  // rank and world from lockstep-run / mpirun / Slurm
  const int rank = group->rank(), world = group->size();
  const bool lead = rank == 0;
  // Dropout masks differ per rank; the initial weights do not matter: DDP copies rank 0's.
  torch::manual_seed(flags.seed * 1000 + rank);

  namespace data = lockstep::data;
  data::FashionMnist train_set(data::Split::Train, {.dir = flags.data_dir});
  data::FashionMnist test_set(data::Split::Test, {.dir = flags.data_dir});

  lockstep::models::ConvNet model;
  lockstep::DistributedDataParallel ddp(model, group);
  if (flags.compression == "bf16") {
    ddp.register_comm_hook(lockstep::ddp::hooks::bf16_compress_hook());
  } else if (flags.compression != "none") {
    lockstep::compress::QsgdOptions q;
    q.bits = flags.compression == "qsgd4" ? 4 : 2;
    q.bucket_size = 128;
    q.seed = flags.seed;
    ddp.register_comm_hook(lockstep::compress::qsgd(q));
  }
  std::unique_ptr<std::ofstream> loss_csv;
  if (lead && !flags.loss_csv.empty()) {
    loss_csv = std::make_unique<std::ofstream>(flags.loss_csv);
    if (!*loss_csv) throw lockstep::InvalidArgument("--loss-csv: cannot write " + flags.loss_csv);
    *loss_csv << "step,epoch,loss\n";
  }

  std::unique_ptr<torch::optim::Optimizer> opt;
  if (flags.optimizer == "sgd")
    opt = std::make_unique<torch::optim::SGD>(
        ddp.parameters(),
        torch::optim::SGDOptions(flags.lr).momentum(0.9).nesterov(true).weight_decay(5e-4));
  else
    opt = std::make_unique<torch::optim::AdamW>(ddp.parameters(),
                                                torch::optim::AdamWOptions(flags.lr));

  // Each rank gets a disjoint 1/world of every epoch, reshuffled per epoch.
  data::DistributedSampler sampler(train_set.size().value(), group, {.seed = flags.seed});
  auto loader = torch::data::make_data_loader(
      train_set.map(torch::data::transforms::Stack<>()), sampler,
      torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(flags.batch_size)));
  const int64_t steps_per_epoch =
      (static_cast<int64_t>(sampler.num_samples()) + flags.batch_size - 1) / flags.batch_size;
  const int64_t total_steps = steps_per_epoch * flags.epochs;

  if (lead)
    std::printf("fashion-mnist-ddp: %d rank(s) on %s, %zu train / %zu test images, batch %lld x %d, "
                "%s lr %g, %d epoch(s), compression %s\n",
                world, group->backend_name().c_str(), train_set.size().value(),
                test_set.size().value(), static_cast<long long>(flags.batch_size), world,
                flags.optimizer.c_str(), flags.lr, flags.epochs, flags.compression.c_str());

  const auto run_start = std::chrono::steady_clock::now();
  int64_t step = 0;
  double accuracy = 0;
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));  // a new permutation, same on every rank
    model->train();
    ProgressBar bar("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(flags.epochs),
                    steps_per_epoch, flags.progress_every);
    double loss_sum = 0, samples = 0, step_s = 0, exposed_s = 0;
    const auto epoch_start = std::chrono::steady_clock::now();
    int64_t epoch_step = 0;
    for (auto& batch : *loader) {
      // Cosine decay of the learning rate: large steps early, small ones to settle at the end.
      opt->param_groups()[0].options().set_lr(
          flags.lr * 0.5 * (1 + std::cos(kPi * static_cast<double>(step) / total_steps)));
      const auto t0 = std::chrono::steady_clock::now();
      opt->zero_grad();
      auto loss = torch::nn::functional::cross_entropy(ddp(batch.data), batch.target);
      loss.backward();  // returns with the gradients averaged over the ranks
      opt->step();
      step_s += since(t0);
      exposed_s += ddp.last_step_stats().exposed_comm_s;
      const double n = static_cast<double>(batch.data.size(0));
      const double step_loss = loss.item<double>();
      loss_sum += step_loss * n;
      if (loss_csv) {
        // The all-rank mean: one tiny allreduce per step, only when a CSV is asked for
        // (every rank must issue it, so the flag is needed on every rank).
        auto l = sum_over_ranks(*group, {step_loss})[0] / world;
        *loss_csv << step << ',' << epoch + 1 << ',' << l << '\n';
      } else if (!flags.loss_csv.empty()) {
        sum_over_ranks(*group, {step_loss});
      }
      samples += n;
      ++step, ++epoch_step;
      if (lead) bar.update(epoch_step, loss_sum / samples, static_cast<int64_t>(samples) * world);
    }
    const double epoch_s = since(epoch_start);
    if (lead) bar.finish();

    const auto [correct, tested] = evaluate(model, test_set, rank, world);
    auto s = sum_over_ranks(*group, {loss_sum, samples, correct, tested, step_s, exposed_s});
    accuracy = s[2] / s[3];
    if (lead)
      std::printf("epoch %d/%d: train loss %.4f | test accuracy %.2f%% (%.0f images) | %.1f s, "
                  "%.0f samples/s | exposed comm %.1f%% of step time\n",
                  epoch + 1, flags.epochs, s[0] / s[1], 100 * accuracy, s[3], epoch_s,
                  s[1] / epoch_s, 100 * s[5] / s[4]);
  }
  if (lead)
    std::printf("done: test accuracy %.2f%% after %d epoch(s) in %.1f s on %d rank(s)\n",
                100 * accuracy, flags.epochs, since(run_start), world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Flags flags;
  try {
    flags = parse_flags(argc, argv);
  } catch (const lockstep::Error& e) {
    std::fprintf(stderr, "fashion-mnist-ddp: %s\n", e.what());
    return 2;  // usage error
  }
  try {
    return train(flags);
  } catch (const std::exception& e) {  // lockstep::Error (data, comm) or a torch error
    std::fprintf(stderr, "fashion-mnist-ddp: %s\n", e.what());
    return 1;
  }
}
