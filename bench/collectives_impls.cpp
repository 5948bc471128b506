#include "collectives_impls.h"

#include "bench_util.h"
#include "jobs.h"

#include <lockstep/lockstep.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef LOCKSTEP_HAVE_MPI
#include <mpi.h>
#endif

#include <algorithm>
#include <stdexcept>

namespace lockstep::bench {
namespace {

// Warm-up, then at least 5 samples and 0.3 s (rank 0's clock decides for every rank).
constexpr RunCount kRuns{.warmup = 2, .min_iters = 5, .max_iters = 100, .min_seconds = 0.3};

// Ops per timed sample: one for large buffers; for small ones a batch back to back (up
// to 200 ops of 8 B, 32 of 64 KiB), so a sample is far longer than the barrier and clock
// reads around it and small-message latency is the median of thousands of ops.
int ops_per_sample(int64_t bytes) {
  return static_cast<int>(
      std::clamp<int64_t>((int64_t{2} << 20) / std::max<int64_t>(bytes, 1), 1, 200));
}

class Base : public CollectiveImpl {
 public:
  explicit Base(comm::ProcessGroup& control) : control_(control) {}
  double time(const std::string& op, int64_t n) override {
    const int p = control_.size(), r = control_.rank();
    const int64_t part = n / p;
    at::Tensor in, out;
    if (op == "allreduce") in = out = input_buffer(n);
    if (op == "allgather") in = at::empty({part}, at::kFloat), out = at::empty({n}, at::kFloat);
    if (op == "reduce_scatter") in = input_buffer(n), out = at::empty({part}, at::kFloat);
    // Timed on zeros (sums stay 0: no overflow to inf over a batch), checked on r+1.
    in.zero_();
    const int reps = ops_per_sample(in.numel() * 4);
    auto times = time_runs(
        [&] {
          for (int i = 0; i < reps; ++i) run(op, out, in);
        },
        &control_, kRuns);
    for (double& t : times) t /= reps;
    in.fill_(r + 1);  // rank r contributes r+1 everywhere
    run(op, out, in);
    // Every rank learns whether any rank got a wrong result, so all throw together
    // instead of the others waiting in the next collective for the one that threw.
    const std::string wrong = check(op, out, p);
    if (!true_on_all_ranks(control_, wrong.empty()))
      throw std::runtime_error(name() + " " + op + ": " +
                               (wrong.empty() ? "wrong result on another rank" : wrong));
    // Every rank reports the largest median (and best): the slowest rank sets the pace.
    auto t =
        at::tensor({median(times), *std::min_element(times.begin(), times.end())}, at::kDouble);
    control_.allreduce(t, {comm::ReduceOp::Max})->wait();
    best_ = t[1].item<double>();
    return t[0].item<double>();
  }

 protected:
  virtual void run(const std::string& op, at::Tensor& out, at::Tensor& in) = 0;
  // The allreduce's buffer and the reduce_scatter's input.
  virtual at::Tensor input_buffer(int64_t n) { return at::empty({n}, at::kFloat); }

  // Against the closed form; returns what is wrong, or "" if nothing.
  static std::string check(const std::string& op, const at::Tensor& out, int p) {
    if (out.numel() == 0) return "";
    if (op == "allgather") {
      const int64_t part = out.numel() / p;
      for (int q = 0; q < p; ++q)
        if (!at::all(out.narrow(0, q * part, part) == float(q + 1)).item<bool>())
          return "allgather result is wrong (part of rank " + std::to_string(q) + ")";
      return "";
    }
    const float want = p * (p + 1) / 2.0f;
    if (!at::all(out == want).item<bool>()) return op + " result is wrong";
    return "";
  }

  comm::ProcessGroup& control_;
};

class Lockstep : public Base {
 public:
  Lockstep(const std::string& backend, comm::ProcessGroup& control) : Base(control) {
    comm::InitOptions o;
    o.backend = backend;
    o.check_collectives = true;  // what users run by default
    pg_ = lockstep::init(o);
  }
  std::string name() const override { return pg_->backend_name(); }
  bool supports(const std::string&) const override { return true; }

 protected:
  void run(const std::string& op, at::Tensor& out, at::Tensor& in) override {
    if (op == "allreduce")
      pg_->allreduce(in)->wait();
    else if (op == "allgather")
      pg_->allgather(out, in)->wait();
    else
      pg_->reduce_scatter(out, in)->wait();
  }
  std::shared_ptr<comm::ProcessGroup> pg_;
};

// lockstep shm with the input in ProcessGroup::alloc_shared memory (where DDP keeps its
// buckets): the zero-copy allreduce and reduce_scatter.
class LockstepShared : public Lockstep {
 public:
  explicit LockstepShared(comm::ProcessGroup& control) : Lockstep("shm", control) {}
  std::string name() const override { return "shm-shared"; }
  bool supports(const std::string& op) const override { return op != "allgather"; }

 protected:
  at::Tensor input_buffer(int64_t n) override {
    at::Tensor t = pg_->alloc_shared(n, at::kFloat);
    if (!t.defined()) throw std::runtime_error("shm-shared: alloc_shared gave no memory");
    return t;
  }
};

// c10d's ProcessGroupGloo exactly as PyTorch users get it (loopback device, 2 threads).
class C10dGloo : public Base {
 public:
  explicit C10dGloo(comm::ProcessGroup& control) : Base(control) {
    auto port = at::full({1}, control.rank() == 0 ? free_port() : 0, at::kInt);
    control.broadcast(port)->wait();
    c10d::TCPStoreOptions so;
    so.port = static_cast<uint16_t>(port.item<int>());
    so.isServer = control.rank() == 0;
    so.waitWorkers = false;
    store_ = c10::make_intrusive<c10d::TCPStore>("127.0.0.1", so);
    auto opts = c10d::ProcessGroupGloo::Options::create();
    opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(store_, control.rank(), control.size(), opts);
  }
  std::string name() const override { return "c10d-gloo"; }
  // Gloo in libtorch 1.13 has no reduce_scatter.
  bool supports(const std::string& op) const override { return op != "reduce_scatter"; }

 protected:
  void run(const std::string& op, at::Tensor& out, at::Tensor& in) override {
    if (op == "allreduce") {
      std::vector<at::Tensor> v{in};
      pg_->allreduce(v)->wait();
    } else {
      // torch.distributed.all_gather: Gloo in 1.13 has no all_gather_into_tensor.
      const int p = control_.size();
      std::vector<std::vector<at::Tensor>> outs(1);
      for (int r = 0; r < p; ++r) outs[0].push_back(out.narrow(0, r * in.numel(), in.numel()));
      std::vector<at::Tensor> ins{in};
      pg_->allgather(outs, ins)->wait();
    }
  }
  c10::intrusive_ptr<c10d::Store> store_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

#ifdef LOCKSTEP_HAVE_MPI
// OpenMPI's own collectives on MPI_COMM_WORLD (vader shared memory on one node).
class MpiRaw : public Base {
 public:
  using Base::Base;
  std::string name() const override { return "mpi-raw"; }
  bool supports(const std::string&) const override { return true; }

 protected:
  void run(const std::string& op, at::Tensor& out, at::Tensor& in) override {
    const int n = static_cast<int>(in.numel());
    if (op == "allreduce")
      MPI_Allreduce(MPI_IN_PLACE, in.data_ptr(), n, MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
    else if (op == "allgather")
      MPI_Allgather(in.data_ptr(), n, MPI_FLOAT, out.data_ptr(), n, MPI_FLOAT, MPI_COMM_WORLD);
    else
      MPI_Reduce_scatter_block(in.data_ptr(), out.data_ptr(), static_cast<int>(out.numel()),
                               MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
  }
};
#endif

}  // namespace

// A backend's allreduce through the QSGD compressed allreduce (name "BACKEND-qsgdB", e.g.
// hier-qsgd4: on hier, quantized between nodes only; "BACKEND-qsgdB-flat": the flat
// algorithm, QsgdOptions::across_nodes_only off). Constant inputs (zeros timed, r+1
// checked) quantize exactly, so the closed-form check holds.
class Qsgd : public Lockstep {
 public:
  Qsgd(const std::string& backend, int bits, bool flat, comm::ProcessGroup& control)
      : Lockstep(backend, control), bits_(bits), flat_(flat) {}
  std::string name() const override {
    return pg_->backend_name() + "-qsgd" + std::to_string(bits_) + (flat_ ? "-flat" : "");
  }
  bool supports(const std::string& op) const override { return op == "allreduce"; }

 protected:
  void run(const std::string&, at::Tensor&, at::Tensor& in) override {
    if (!plan_ || plan_->numel() != in.numel()) {
      compress::QsgdOptions o;
      o.bits = bits_;
      o.min_layer = 0;
      o.across_nodes_only = !flat_;
      plan_ = std::make_unique<compress::CompressedAllreduce>(
          o, std::vector<compress::LayerSpan>{{"w", 0, in.numel()}}, in.numel(), pg_->size());
    }
    plan_->run(*pg_, in, false);
  }

 private:
  int bits_;
  bool flat_;
  std::unique_ptr<compress::CompressedAllreduce> plan_;
};

std::vector<std::unique_ptr<CollectiveImpl>> make_impls(const std::string& impls,
                                                        comm::ProcessGroup& control) {
  std::vector<std::unique_ptr<CollectiveImpl>> out;
  for (const std::string& name : split_csv(impls)) {
    if (name == "shm" || name == "gloo" || name == "mpi" || name == "hier")
      out.push_back(std::make_unique<Lockstep>(name, control));
    else if (auto q = name.find("-qsgd"); q != std::string::npos)
      out.push_back(std::make_unique<Qsgd>(name.substr(0, q), std::stoi(name.substr(q + 5)),
                                           name.find("-flat") != std::string::npos, control));
    else if (name == "shm-shared")
      out.push_back(std::make_unique<LockstepShared>(control));
    else if (name == "c10d-gloo")
      out.push_back(std::make_unique<C10dGloo>(control));
#ifdef LOCKSTEP_HAVE_MPI
    else if (name == "mpi-raw")
      out.push_back(std::make_unique<MpiRaw>(control));
#endif
    else
      throw std::invalid_argument("unknown implementation '" + name + "'");
  }
  return out;
}

}  // namespace lockstep::bench
