#include "collectives_impls.h"

#include "bench_util.h"

#include <lockstep/lockstep.h>

#include <ATen/ATen.h>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#ifdef LOCKSTEP_HAVE_MPI
#include <mpi.h>
#endif

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <sstream>
#include <stdexcept>

namespace lockstep::bench {
namespace {

constexpr int kWarmup = 2;
constexpr int kMinIters = 5;
constexpr int kMaxIters = 50;
constexpr double kMinSeconds = 0.3;

// Buffers of one size for every op; rank r contributes r+1 everywhere.
struct Buffers {
  at::Tensor a, b;
};

class Base : public CollectiveImpl {
 public:
  explicit Base(comm::ProcessGroup& control) : control_(control) {}
  double time(const std::string& op, int64_t n) override {
    const int p = control_.size(), r = control_.rank();
    const int64_t part = n / p;
    at::Tensor in, out;
    if (op == "allreduce") in = out = allreduce_buffer(n);
    if (op == "allgather") in = at::empty({part}, at::kFloat), out = at::empty({n}, at::kFloat);
    if (op == "reduce_scatter") in = at::empty({n}, at::kFloat), out = at::empty({part}, at::kFloat);
    in.fill_(r + 1);
    auto times = time_runs([&] { run(op, out, in); }, [&] { control_.barrier()->wait(); },
                           kWarmup, kMinIters, kMaxIters, kMinSeconds);
    in.fill_(r + 1);
    run(op, out, in);
    verify(op, out, p);
    // Every rank reports rank 0's median; the slowest rank sets the pace anyway.
    auto t = at::full({1}, median(times), at::kDouble);
    control_.allreduce(t, {comm::ReduceOp::Max})->wait();
    return t.item<double>();
  }

 protected:
  virtual void run(const std::string& op, at::Tensor& out, at::Tensor& in) = 0;
  virtual at::Tensor allreduce_buffer(int64_t n) { return at::empty({n}, at::kFloat); }

  static void verify(const std::string& op, const at::Tensor& out, int p) {
    if (out.numel() == 0) return;
    if (op == "allgather") {
      const int64_t part = out.numel() / p;
      for (int q = 0; q < p; ++q)
        if (!at::all(out.narrow(0, q * part, part) == float(q + 1)).item<bool>())
          throw std::runtime_error("allgather result is wrong");
      return;
    }
    const float want = p * (p + 1) / 2.0f;
    if (!at::all(out == want).item<bool>()) throw std::runtime_error(op + " result is wrong");
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
    if (op == "allreduce") pg_->allreduce(in)->wait();
    else if (op == "allgather") pg_->allgather(out, in)->wait();
    else pg_->reduce_scatter(out, in)->wait();
  }
  std::shared_ptr<comm::ProcessGroup> pg_;
};

// lockstep shm with the tensor in ProcessGroup::alloc_shared memory (where DDP keeps its
// buckets): the zero-copy allreduce.
class LockstepShared : public Lockstep {
 public:
  explicit LockstepShared(comm::ProcessGroup& control) : Lockstep("shm", control) {}
  std::string name() const override { return "shm-shared"; }
  bool supports(const std::string& op) const override { return op == "allreduce"; }

 protected:
  at::Tensor allreduce_buffer(int64_t n) override {
    at::Tensor t = pg_->alloc_shared(n, at::kFloat);
    if (!t.defined()) throw std::runtime_error("shm-shared: alloc_shared gave no memory");
    return t;
  }
};

int free_port() {
  int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  a.sin_port = 0;
  socklen_t len = sizeof a;
  ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a);
  ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len);
  ::close(fd);
  return ntohs(a.sin_port);
}

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

std::vector<std::unique_ptr<CollectiveImpl>> make_impls(const std::string& impls,
                                                         comm::ProcessGroup& control) {
  std::vector<std::unique_ptr<CollectiveImpl>> out;
  std::stringstream ss(impls);
  std::string name;
  while (std::getline(ss, name, ',')) {
    if (name == "shm" || name == "gloo" || name == "mpi") out.push_back(std::make_unique<Lockstep>(name, control));
    else if (name == "shm-shared") out.push_back(std::make_unique<LockstepShared>(control));
    else if (name == "c10d-gloo") out.push_back(std::make_unique<C10dGloo>(control));
#ifdef LOCKSTEP_HAVE_MPI
    else if (name == "mpi-raw") out.push_back(std::make_unique<MpiRaw>(control));
#endif
    else throw std::invalid_argument("unknown implementation '" + name + "'");
  }
  return out;
}

}  // namespace lockstep::bench
