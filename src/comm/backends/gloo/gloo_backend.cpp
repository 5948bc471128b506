// The gloo backend: c10d's ProcessGroupGloo (TCP, multi-node) behind our Backend contract.
//
// Gloo in libtorch 1.13 has no reduce_scatter and no bfloat16 arithmetic, so those are
// composed here: reduce_scatter = alltoall + a local sum (the bandwidth-optimal
// decomposition: each rank sends (P-1)/P of its input once), bfloat16 reductions go
// through float32, and bfloat16 data movement is a bit-copy typed as float16.
#include "comm/backends/factories.h"

#include <lockstep/error.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <cstdlib>

namespace lockstep::comm {
namespace {

c10d::ReduceOp to_c10d(ReduceOp op) {
  switch (op) {
    case ReduceOp::Max:
      return c10d::ReduceOp::MAX;
    case ReduceOp::Min:
      return c10d::ReduceOp::MIN;
    default:
      return c10d::ReduceOp::SUM;
  }
}

// Gloo moves bytes for these ops; bfloat16 travels as float16 of the same bits.
at::Tensor movable(const at::Tensor& t) {
  return t.scalar_type() == at::kBFloat16 ? t.view(at::kHalf) : t;
}

std::shared_ptr<::gloo::transport::Device> make_device(const LaunchEnv& env) {
  for (const char* var : {"LOCKSTEP_GLOO_IFNAME", "GLOO_SOCKET_IFNAME"}) {
    if (const char* ifname = std::getenv(var); ifname && *ifname)
      return c10d::ProcessGroupGloo::createDeviceForInterface(ifname);
  }
  // One node: loopback, which is also what a shaped private namespace offers.
  if (env.single_node()) return c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1");
  return c10d::ProcessGroupGloo::createDefaultDevice();
}

class GlooBackend final : public Backend {
 public:
  GlooBackend(const StorePtr& store, const std::string& prefix, const LaunchEnv& env,
              Millis timeout)
      : rank_(env.rank), size_(env.world_size) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(make_device(env));
    opts->threads = 2;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix + "gloo/", store);
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank_, size_, opts);
  }

  std::string name() const override { return "gloo"; }
  int rank() const override { return rank_; }
  int size() const override { return size_; }

  void allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) override {
    if (t.numel() == 0) return;
    if (t.scalar_type() == at::kBFloat16) {
      auto f = t.to(at::kFloat);
      allreduce(f, op, ctx);
      t.copy_(f);
      return;
    }
    std::vector<at::Tensor> v{t};
    c10d::AllreduceOptions o;
    o.reduceOp = to_c10d(op);
    finish(pg_->allreduce(v, o), ctx);
  }

  void broadcast(at::Tensor& t, int root, const OpContext& ctx) override {
    if (t.numel() == 0) return;
    std::vector<at::Tensor> v{movable(t)};
    c10d::BroadcastOptions o;
    o.rootRank = root;
    finish(pg_->broadcast(v, o), ctx);
  }

  void allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override {
    if (in.numel() == 0) return;
    // libtorch 1.13's Gloo has no _allgather_base: gather into views of the flat output.
    auto o = movable(out);
    std::vector<std::vector<at::Tensor>> outs(1);
    for (int r = 0; r < size_; ++r) outs[0].push_back(o.narrow(0, r * in.numel(), in.numel()));
    std::vector<at::Tensor> ins{movable(in)};
    finish(pg_->allgather(outs, ins), ctx);
  }

  void reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                      const OpContext& ctx) override {
    if (out.numel() == 0) return;
    auto parts = at::empty_like(in);
    alltoall(parts, in, ctx);
    // parts row r = rank r's contribution to my slice; combine in rank order.
    auto rows = parts.view({size_, out.numel()});
    const bool low = in.scalar_type() == at::kBFloat16 || in.scalar_type() == at::kHalf;
    auto src = low ? rows.to(at::kFloat) : rows;
    at::Tensor r;
    if (op == ReduceOp::Max)
      r = std::get<0>(src.max(0));
    else if (op == ReduceOp::Min)
      r = std::get<0>(src.min(0));
    else
      r = src.sum(0, false, src.scalar_type());
    out.copy_(r);
  }

  void alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) override {
    if (in.numel() == 0) return;
    auto o = movable(out);
    auto i = movable(in);
    std::vector<int64_t> counts;  // empty: equal splits
    finish(pg_->alltoall_base(o, i, counts, counts), ctx);
  }

  void send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) override {
    if (t.numel() == 0) return;
    std::vector<at::Tensor> v{movable(t)};
    finish(pg_->send(v, dst, tag), ctx);
  }

  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override {
    if (t.numel() == 0) return;
    std::vector<at::Tensor> v{movable(t)};
    finish(pg_->recv(v, src, tag), ctx);
  }

  void barrier(const OpContext& ctx) override { finish(pg_->barrier(), ctx); }

 private:
  // Waits for the c10d work within the op's remaining time; gloo's own errors
  // (a closed connection when a peer died) become CommErrors.
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const OpContext& ctx) {
    const auto left = std::chrono::duration_cast<Millis>(ctx.deadline - Clock::now()) + Millis(1);
    try {
      work->wait(std::max(left, Millis(1)));
    } catch (const std::exception& e) {
      CommContext c = op_context(*this, ctx.desc, &ctx);
      const std::string msg = e.what();
      auto kind = CommError::Kind::Failed;
      if (msg.find("Timed out") != std::string::npos ||
          msg.find("timed out") != std::string::npos || msg.find("Timeout") != std::string::npos)
        kind = CommError::Kind::Timeout;
      else if (msg.find("closed") != std::string::npos || msg.find("reset") != std::string::npos ||
               msg.find("Broken pipe") != std::string::npos)
        kind = CommError::Kind::PeerGone;
      throw CommError(kind, c, first_line(msg));
    }
  }

  static std::string first_line(const std::string& s) {
    auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  int rank_;
  int size_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout) {
  return std::make_unique<GlooBackend>(store, prefix, env, timeout);
}

}  // namespace lockstep::comm
