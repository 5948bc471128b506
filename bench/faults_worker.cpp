// lockstep-bench faults' workers: the same small job (fp32 regression, momentum SGD, an
// emulated step time, gradients reduced with a ballast so a reduction takes a while) made
// fault tolerant (lockstep::ft::Manager) or the way it is without (one job-wide group,
// checkpoints every --checkpoint-every steps, a resume after the launcher restarts the job).
#include "faults_bench.h"

#include <lockstep/comm/init.h>
#include <lockstep/parallel/ft/manager.h>

#include <torch/torch.h>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <thread>

namespace lockstep::bench {
namespace {

constexpr int64_t kDim = 256, kBatch = 64;

double wall() {
  return std::chrono::duration<double>(std::chrono::system_clock::now().time_since_epoch()).count();
}

// One line per event, written with one write() so a SIGKILL never leaves half a line.
class EventLog {
 public:
  EventLog(const std::string& dir, int id) {
    fd_ = ::open((dir + "/log_" + std::to_string(id)).c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    std::ofstream(dir + "/pid_" + std::to_string(id) + ".tmp") << ::getpid() << "\n";
    std::filesystem::rename(dir + "/pid_" + std::to_string(id) + ".tmp",
                            dir + "/pid_" + std::to_string(id));
  }
  ~EventLog() { ::close(fd_); }
  void line(const std::string& what) const {
    char buf[256];
    const int n = std::snprintf(buf, sizeof buf, "%.6f %s\n", wall(), what.c_str());
    (void)!::write(fd_, buf, size_t(n));
  }

 private:
  int fd_ = -1;
};

struct Job {
  torch::nn::Linear model{nullptr};
  std::unique_ptr<torch::optim::SGD> opt;
  at::Tensor ballast;

  explicit Job(int64_t ballast_values) {
    torch::manual_seed(3);
    model = torch::nn::Linear(kDim, 1);
    opt = std::make_unique<torch::optim::SGD>(model->parameters(),
                                              torch::optim::SGDOptions(0.01).momentum(0.9));
    ballast = at::zeros({ballast_values});
  }
  // Forward and backward on this replica's batch of `step`, then the emulated compute.
  std::vector<at::Tensor> gradients(int64_t step, int id, double step_ms) {
    opt->zero_grad();
    auto gen = at::make_generator<at::CPUGeneratorImpl>(uint64_t(step) * 7919u + uint64_t(id));
    at::Tensor x = at::randn({kBatch, kDim}, gen, at::TensorOptions().dtype(at::kFloat));
    torch::mse_loss(model->forward(x), x.sum(1, true) * 0.01).backward();
    std::this_thread::sleep_for(std::chrono::duration<double, std::milli>(step_ms));
    std::vector<at::Tensor> g;
    for (auto& p : model->parameters()) g.push_back(p.grad());
    g.push_back(ballast);
    return g;
  }
};

int replica_id() {
  const char* v = std::getenv("LOCKSTEP_REPLICA_ID");
  return std::atoi(v ? v : std::getenv("RANK") ? std::getenv("RANK") : "0");
}

}  // namespace

int faults_ft_worker(const FaultsOptions& o) {
  Job job(o.ballast);
  const int id = replica_id();
  EventLog log(o.dir, id);
  log.line("start");
  ft::Manager ft({}, {[&](torch::serialize::OutputArchive& ar) {
                        job.model->save(ar);
                        job.opt->save(ar);
                      },
                      [&](torch::serialize::InputArchive& ar) {
                        job.model->load(ar);
                        job.opt->load(ar);
                      }});
  int64_t heals = 0;
  while (ft.step() < o.steps) {
    if (!ft.start_step()) break;
    if (ft.stats().heals > heals) {
      heals = ft.stats().heals;
      log.line("heal " + std::to_string(ft.stats().heal_s) + " " +
               std::to_string(ft.stats().heal_bytes));
    }
    const int64_t step = ft.step();
    ft.allreduce(job.gradients(step, id, o.step_ms));
    const bool commit = ft.should_commit();
    if (commit) job.opt->step();
    log.line((commit ? "commit " : "discard ") + std::to_string(step) + " " +
             std::to_string(ft.replicas()));
  }
  log.line("done");
  return 0;
}

// Today's path: a failure ends every rank; lockstep-run --max-restarts starts them all
// again and they resume from the newest checkpoint (written atomically by rank 0).
int faults_restart_worker(const FaultsOptions& o) {
  Job job(o.ballast);
  auto group = comm::init();
  const int id = group->rank();
  EventLog log(o.dir, id);
  log.line("start");
  const std::string ckpt = o.dir + "/checkpoint.pt";
  int64_t step = 0;
  if (std::filesystem::exists(ckpt)) {
    torch::serialize::InputArchive ar;
    ar.load_from(ckpt);
    job.model->load(ar);
    job.opt->load(ar);
    at::Tensor s;
    ar.read("step", s);
    step = s.item<int64_t>();
    log.line("resume " + std::to_string(step));
  }
  for (; step < o.steps; ++step) {
    auto g = job.gradients(step, id, o.step_ms);
    group->allreduce_coalesced(g, {comm::ReduceOp::Avg})->wait();
    job.opt->step();
    log.line("commit " + std::to_string(step) + " " + std::to_string(group->size()));
    if ((step + 1) % o.checkpoint_every == 0 && id == 0) {
      torch::serialize::OutputArchive ar;
      job.model->save(ar);
      job.opt->save(ar);
      ar.write("step", at::full({1}, step + 1, at::kLong));
      ar.save_to(ckpt + ".tmp");
      std::filesystem::rename(ckpt + ".tmp", ckpt);
    }
  }
  group->barrier()->wait();
  log.line("done");
  return 0;
}

}  // namespace lockstep::bench
