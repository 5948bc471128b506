// fashion-mnist-ddp: train a small ConvNet on Fashion-MNIST with data parallelism.
//
//   lockstep-run --nproc-per-node 2 --master-port 0 fashion-mnist-ddp --epochs 3
//
// Every rank holds a replica of the model and trains on its own share of each epoch
// (DistributedSampler); DistributedDataParallel averages the gradients during
// backward, so the replicas take identical optimizer steps. Rank 0 prints.
#include <lockstep/data/data.h>
#include <lockstep/lockstep.h>
#include <lockstep/models/convnet.h>
#include <lockstep/parallel/ddp/ddp.h>
#include <lockstep/parallel/ddp/hooks/default_hooks.h>
#include <lockstep/parallel/ddp/hooks/qsgd_hook.h>
#include <lockstep/train/progress_bar.h>

#include <torch/torch.h>

#include <lockstep/launch/cli.h>

#include <unistd.h>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <memory>
#include <string>

namespace {

struct Flags {
  int epochs = 3;
  int64_t batch_size = 64;        // per rank; the global batch is world_size times larger
  double lr = 0.05;               // peak learning rate (cosine decay to 0 over the run)
  std::string optimizer = "sgd";  // "sgd" (momentum 0.9, nesterov) or "adamw"
  std::string data_dir;           // empty: /usr/share/datasets/fashion-mnist
  uint64_t seed = 0;
  int progress_every = 10;           // percent, when stderr is not a terminal
  std::string compression = "none";  // gradient compression: none | qsgd4 | qsgd2 | bf16
  std::string loss_csv;              // rank 0 writes "step,epoch,loss" per step here (empty: off)
};

// Binds every flag to `flags`; "--epochs 3" and "--epochs=3" both work.
void add_flags(CLI::App& app, Flags& flags) {
  app.add_option("--epochs", flags.epochs, "passes over the training set")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--batch-size", flags.batch_size,
                 "per rank; the global batch is world size times larger")
      ->check(CLI::Range(int64_t(1), int64_t(65536)))
      ->capture_default_str();
  app.add_option("--lr", flags.lr, "peak learning rate, cosine-decayed to 0 over the run")
      ->check(CLI::Range(1e-8, 10.0))
      ->capture_default_str();
  app.add_option("--optimizer", flags.optimizer, "sgd (momentum 0.9, Nesterov) or adamw")
      ->check(CLI::IsMember({"sgd", "adamw"}))
      ->capture_default_str();
  app.add_option("--data-dir", flags.data_dir,
                 "the idx files (default: /usr/share/datasets/fashion-mnist)");
  app.add_option("--seed", flags.seed, "shuffling (and dropout) seed")
      ->check(CLI::Range(uint64_t(0), uint64_t(1e15)))
      ->capture_default_str();
  app.add_option("--progress-every", flags.progress_every,
                 "without a terminal, print progress every P percent (below 10: every 10%)")
      ->check(CLI::Range(1, 100))
      ->capture_default_str();
  app.add_option("--compression", flags.compression,
                 "qsgd4/qsgd2: QSGD 4/2-bit gradients, bucket 128 (LOCKSTEP_COMPRESSION_* "
                 "variables still apply); bf16: bfloat16 allreduce")
      ->check(CLI::IsMember({"none", "qsgd4", "qsgd2", "bf16"}))
      ->capture_default_str();
  app.add_option(
      "--loss-csv", flags.loss_csv,
      "rank 0 writes the global (all-rank mean) loss of every step as CSV (step,epoch,loss)");
}

// Sum a few doubles over all ranks (one small allreduce).
std::vector<double> sum_over_ranks(lockstep::ProcessGroup& group, const std::vector<double>& v) {
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

template <class DDP>
void register_compression(DDP& ddp, const Flags& flags) {
  if (flags.compression == "bf16") {
    ddp.register_comm_hook(lockstep::ddp::hooks::bf16_compress_hook());
  } else if (flags.compression != "none") {
    lockstep::compress::QsgdOptions q;
    q.bits = flags.compression == "qsgd4" ? 4 : 2;
    q.bucket_size = 128;
    q.seed = flags.seed;
    ddp.register_comm_hook(lockstep::ddp::hooks::qsgd(q));
  }
}

std::unique_ptr<torch::optim::Optimizer> make_optimizer(const Flags& flags,
                                                        std::vector<at::Tensor> params) {
  if (flags.optimizer == "sgd")
    return std::make_unique<torch::optim::SGD>(
        std::move(params),
        torch::optim::SGDOptions(flags.lr).momentum(0.9).nesterov(true).weight_decay(5e-4));
  return std::make_unique<torch::optim::AdamW>(std::move(params),
                                               torch::optim::AdamWOptions(flags.lr));
}

// What the phases of a run share.
struct Run {
  Run(const Flags& f, std::shared_ptr<lockstep::ProcessGroup> g)
      : flags(f), group(std::move(g)), rank(group->rank()), world(group->size()), lead(rank == 0) {}
  const Flags& flags;
  std::shared_ptr<lockstep::ProcessGroup> group;
  const int rank, world;
  const bool lead;  // rank 0 prints
  int64_t steps_per_epoch = 0, total_steps = 0;
  int64_t step = 0;                         // optimizer steps so far
  std::unique_ptr<std::ofstream> loss_csv;  // rank 0, with --loss-csv
};

// The all-rank mean loss of the step into --loss-csv: one tiny allreduce per step, only
// when a CSV is asked for (every rank must issue it, so the flag is needed on every rank).
void log_step_loss(Run& run, int epoch, double step_loss) {
  if (run.flags.loss_csv.empty()) return;
  const double mean = sum_over_ranks(*run.group, {step_loss})[0] / run.world;
  if (run.loss_csv) *run.loss_csv << run.step << ',' << epoch + 1 << ',' << mean << '\n';
}

// Rank 0's progress line: every step on a terminal (the bar redraws at most 5 times a
// second), else every --progress-every percent (the bar prints at most every 10%).
class EpochProgress {
 public:
  EpochProgress(const Run& run, int epoch)
      : bar_(run.steps_per_epoch, 0, run.lead),
        label_("epoch " + std::to_string(epoch + 1) + "/" + std::to_string(run.flags.epochs)),
        every_(std::max<int64_t>(1, run.steps_per_epoch * run.flags.progress_every / 100)),
        total_(run.steps_per_epoch),
        world_(run.world),
        tty_(isatty(STDERR_FILENO) == 1),
        start_(std::chrono::steady_clock::now()) {}
  void update(int64_t epoch_step, double mean_loss, double samples) {
    if (!tty_ && epoch_step % every_ != 0 && epoch_step < total_) return;
    char note[128];
    std::snprintf(note, sizeof note, "%s loss %.4f %.0f samples/s", label_.c_str(), mean_loss,
                  samples * world_ / since(start_));
    bar_.update(epoch_step, note);
  }
  void finish() { bar_.finish(); }

 private:
  lockstep::train::ProgressBar bar_;
  std::string label_;
  int64_t every_, total_;
  int world_;
  bool tty_;
  std::chrono::steady_clock::time_point start_;
};

// This rank's sums over an epoch.
struct EpochStats {
  double loss_sum = 0, samples = 0, step_s = 0, exposed_s = 0, seconds = 0;
};

// One pass over this rank's share of the training set.
template <class DDP, class Loader>
EpochStats train_epoch(Run& run, int epoch, DDP& ddp, torch::optim::Optimizer& opt,
                       Loader& loader) {
  const Flags& flags = run.flags;
  EpochProgress progress(run, epoch);
  EpochStats s;
  const auto epoch_start = std::chrono::steady_clock::now();
  int64_t epoch_step = 0;
  for (auto& batch : loader) {
    // Cosine decay of the learning rate: large steps early, small ones to settle at the end.
    opt.param_groups()[0].options().set_lr(
        flags.lr * 0.5 * (1 + std::cos(kPi * static_cast<double>(run.step) / run.total_steps)));
    const auto t0 = std::chrono::steady_clock::now();
    opt.zero_grad();
    torch::Tensor loss = torch::nn::functional::cross_entropy(ddp(batch.data), batch.target);
    loss.backward();  // returns with the gradients averaged over the ranks
    opt.step();
    s.step_s += since(t0);
    s.exposed_s += ddp.last_step_stats().exposed_comm_s;
    const double n = static_cast<double>(batch.data.size(0));
    const double step_loss = loss.item<double>();
    s.loss_sum += step_loss * n;
    log_step_loss(run, epoch, step_loss);
    s.samples += n;
    ++run.step, ++epoch_step;
    progress.update(epoch_step, s.loss_sum / s.samples, s.samples);
  }
  s.seconds = since(epoch_start);
  progress.finish();
  return s;
}

// Scores the test set and prints the epoch's line; returns the test accuracy.
double finish_epoch(const Run& run, int epoch, const EpochStats& e,
                    lockstep::models::ConvNet& model,
                    const lockstep::data::FashionMnist& test_set) {
  const auto [correct, tested] = evaluate(model, test_set, run.rank, run.world);
  auto s =
      sum_over_ranks(*run.group, {e.loss_sum, e.samples, correct, tested, e.step_s, e.exposed_s});
  const double accuracy = s[2] / s[3];
  if (run.lead)
    std::printf(
        "epoch %d/%d: train loss %.4f | test accuracy %.2f%% (%.0f images) | %.1f s, "
        "%.0f samples/s | exposed comm %.1f%% of step time\n",
        epoch + 1, run.flags.epochs, s[0] / s[1], 100 * accuracy, s[3], e.seconds, s[1] / e.seconds,
        100 * s[5] / s[4]);
  return accuracy;
}

std::unique_ptr<std::ofstream> open_loss_csv(const Flags& flags, bool lead) {
  if (!lead || flags.loss_csv.empty()) return nullptr;
  auto csv = std::make_unique<std::ofstream>(flags.loss_csv);
  if (!*csv) throw lockstep::InvalidArgument("--loss-csv: cannot write " + flags.loss_csv);
  *csv << "step,epoch,loss\n";
  return csv;
}

int train(const Flags& flags) {
  // One compute thread per rank: P ranks on P cores, not P x cores threads fighting.
  if (!std::getenv("OMP_NUM_THREADS")) torch::set_num_threads(1);

  auto group = lockstep::init();  // rank and world from lockstep-run / mpirun / Slurm
  Run run(flags, group);
  // Dropout masks differ per rank; the initial weights do not matter: DDP copies rank 0's.
  torch::manual_seed(flags.seed * 1000 + run.rank);

  namespace data = lockstep::data;
  data::FashionMnist train_set(data::Split::Train, {.dir = flags.data_dir});
  data::FashionMnist test_set(data::Split::Test, {.dir = flags.data_dir});

  lockstep::models::ConvNet model;
  lockstep::DistributedDataParallel ddp(model, group);
  register_compression(ddp, flags);
  run.loss_csv = open_loss_csv(flags, run.lead);
  auto opt = make_optimizer(flags, ddp.parameters());

  // Each rank gets a disjoint 1/world of every epoch, reshuffled per epoch.
  data::DistributedSampler sampler(train_set.size().value(), group->size(), group->rank(),
                                   {.seed = flags.seed});
  auto loader = torch::data::make_data_loader(
      train_set.map(torch::data::transforms::Stack<>()), sampler,
      torch::data::DataLoaderOptions().batch_size(static_cast<size_t>(flags.batch_size)));
  run.steps_per_epoch =
      (static_cast<int64_t>(sampler.num_samples()) + flags.batch_size - 1) / flags.batch_size;
  run.total_steps = run.steps_per_epoch * flags.epochs;

  if (run.lead)
    std::printf(
        "fashion-mnist-ddp: %d rank(s) on %s, %zu train / %zu test images, batch %lld x %d, "
        "%s lr %g, %d epoch(s), compression %s\n",
        run.world, group->backend_name().c_str(), train_set.size().value(), test_set.size().value(),
        static_cast<long long>(flags.batch_size), run.world, flags.optimizer.c_str(), flags.lr,
        flags.epochs, flags.compression.c_str());

  const auto run_start = std::chrono::steady_clock::now();
  double accuracy = 0;
  for (int epoch = 0; epoch < flags.epochs; ++epoch) {
    sampler.set_epoch(static_cast<uint64_t>(epoch));  // a new permutation, same on every rank
    model->train();
    const EpochStats stats = train_epoch(run, epoch, ddp, *opt, *loader);
    accuracy = finish_epoch(run, epoch, stats, model, test_set);
  }
  if (run.lead)
    std::printf("done: test accuracy %.2f%% after %d epoch(s) in %.1f s on %d rank(s)\n",
                100 * accuracy, flags.epochs, since(run_start), run.world);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"fashion-mnist-ddp: a ConvNet trained on Fashion-MNIST with DistributedDataParallel",
               "fashion-mnist-ddp"};
  app.footer(
      "Run it under lockstep-run (or mpirun/Slurm); without a launcher it trains on 1 rank.");
  Flags flags;
  add_flags(app, flags);
  if (auto rc = lockstep::launch::parse_command_line(app, argc, argv, std::cout, std::cerr))
    return *rc;  // --help: 0; a usage error (the nearest flag, the usage line): 2
  // Line by line even into a pipe, so rank 0's lines keep their order beside the progress
  // bar's on stderr (lockstep-run reads both).
  std::setvbuf(stdout, nullptr, _IOLBF, 0);
  try {
    return train(flags);
  } catch (const std::exception& e) {  // lockstep::Error (data, comm) or a torch error
    std::fprintf(stderr, "fashion-mnist-ddp: %s\n", e.what());
    return 1;
  }
}
