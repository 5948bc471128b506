// The gloo backend: c10d's ProcessGroupGloo (TCP, multi-node) behind our Backend contract.
//
// Gloo in libtorch 1.13 has no reduce_scatter and no bfloat16 arithmetic, so those are
// composed here: reduce_scatter = alltoall + a local sum (the bandwidth-optimal
// decomposition: each rank sends (P-1)/P of its input once), bfloat16 reductions go
// through float32, and bfloat16 data movement is a bit-copy typed as float16.
//
// Failures: every op is waited for in slices, and between slices the group's StoreHeartbeat
// (store_heartbeat.h) is asked whether a rank died or stopped; a transport error is
// attributed to the rank StoreHeartbeat names. So a dead or stopped peer fails every rank
// within seconds, naming it, instead of a socket error that names an address or a
// timeout that names no one. An op given up on may still be running inside gloo: the
// c10d group is then leaked at destruction rather than joined (its threads would wait
// out gloo's own timeout).
#include "comm/backend_factories.h"
#include "comm/backends/gloo/store_heartbeat.h"

#include <lockstep/error.h>

#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>

#include <atomic>
#include <cstdlib>
#include <string>

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
              Millis timeout, ExternalNotice notice)
      : rank_(env.rank), size_(env.world_size) {
    auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
    opts->devices.push_back(make_device(env));
    opts->threads = 2;
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>(prefix + "gloo/", store);
    pg_ = c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, rank_, size_, opts);
    heartbeat_ = std::make_unique<StoreHeartbeat>(
        c10::make_intrusive<c10d::PrefixStore>(prefix + "live/", store), rank_, size_,
        std::move(notice));
  }

  ~GlooBackend() override {
    heartbeat_.reset();
    // A gloo op still blocked on a dead peer would keep ~ProcessGroupGloo joining its
    // worker threads until gloo's own timeout: a broken group is left to process exit.
    if (broken_) (void)pg_.release();
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
    finish(pg_->send(v, dst, tag), ctx, /*p2p=*/true);
  }

  void recv(at::Tensor& t, int src, int tag, const OpContext& ctx) override {
    if (t.numel() == 0) return;
    std::vector<at::Tensor> v{movable(t)};
    finish(pg_->recv(v, src, tag), ctx, /*p2p=*/true);
  }

  void barrier(const OpContext& ctx) override { finish(pg_->barrier(), ctx); }

  void abort() noexcept override {
    aborted_ = true;
    broken_ = true;
  }

 private:
  // How long one wait lasts before StoreHeartbeat is asked again: the detection delay it adds.
  static constexpr Millis kSlice{200};

  // Waits for the c10d work in slices until it completes, the op's deadline passes, the
  // group is aborted, or StoreHeartbeat reports a failed rank (-> PeerGone naming it). gloo's
  // own errors become CommErrors, attributed to the failed rank when one is known.
  //
  // Send and recv (`p2p`) wait in one piece until the deadline: gloo closes the pair of a
  // send or recv whose wait times out ("Application timeout caused pair closure"), so a
  // slice running out would break the connection. A dead peer still shows at once (the
  // socket fails and StoreHeartbeat names the rank); a stopped one only at the deadline.
  void finish(const c10::intrusive_ptr<c10d::Work>& work, const OpContext& ctx, bool p2p = false) {
    for (;;) {
      const auto now = Clock::now();
      if (aborted_) raise(ctx, CommError::Kind::Aborted, -1, "the group is being torn down");
      if (now >= ctx.deadline) {
        if (auto f = heartbeat_->failure()) raise(ctx, CommError::Kind::PeerGone, f->peer, f->what);
        raise(ctx, CommError::Kind::Timeout, -1,
              "not every rank took part in time; every rank's heartbeat is current, so a rank "
              "is busy elsewhere or issued other collectives");
      }
      const auto left = std::chrono::duration_cast<Millis>(ctx.deadline - now) + Millis(1);
      try {
        work->wait(p2p ? left : std::min(left, kSlice));
        return;
      } catch (const std::exception& e) {
        if (!work->isCompleted()) {  // our slice ran out: is everyone still there?
          if (auto f = heartbeat_->failure()) {
            // A lost store may only mean rank 0 finished first: give the op a moment.
            if (!f->store_lost || !wait_quietly(work, Millis(1000)))
              raise(ctx, CommError::Kind::PeerGone, f->peer, f->what);
          }
          continue;
        }
        // The work may complete, successfully, between the slice's timeout and the check
        // above (c10d builds its timeout error, backtrace and all, in the meantime).
        if (work->isSuccess()) return;
        transport_error(ctx, e.what());
      }
    }
  }

  bool wait_quietly(const c10::intrusive_ptr<c10d::Work>& work, Millis t) {
    try {
      work->wait(t);
      return true;
    } catch (const std::exception&) {
      return false;
    }
  }

  [[noreturn]] void transport_error(const OpContext& ctx, const std::string& msg) {
    auto kind = CommError::Kind::Failed;
    if (msg.find("Timed out") != std::string::npos || msg.find("timed out") != std::string::npos ||
        msg.find("Timeout") != std::string::npos)
      kind = CommError::Kind::Timeout;
    else if (msg.find("closed") != std::string::npos || msg.find("reset") != std::string::npos ||
             msg.find("Broken pipe") != std::string::npos)
      kind = CommError::Kind::PeerGone;
    // A socket error names an address; the rank behind it is found by StoreHeartbeat: at once
    // on this machine, within a moment when another node's rank publishes it, within
    // kStale when a whole node is gone (rank 0 sees the heartbeats stop).
    const Millis patience =
        kind == CommError::Kind::PeerGone ? StoreHeartbeat::kStale + Millis(1000) : Millis(0);
    if (auto f = heartbeat_->failure_within(patience))
      raise(ctx, CommError::Kind::PeerGone, f->peer,
            lockstep::detail::concat(f->what, " (gloo: ", first_line(msg), ")"));
    raise(ctx, kind, -1, first_line(msg));
  }

  [[noreturn]] void raise(const OpContext& ctx, CommError::Kind kind, int peer,
                          const std::string& what) {
    broken_ = true;
    CommContext c = op_context(*this, ctx.desc, &ctx);
    if (peer >= 0) c.peer = peer;
    throw CommError(kind, c, what);
  }

  static std::string first_line(const std::string& s) {
    auto nl = s.find('\n');
    return nl == std::string::npos ? s : s.substr(0, nl);
  }

  int rank_;
  int size_;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> pg_;
  std::unique_ptr<StoreHeartbeat> heartbeat_;
  std::atomic<bool> aborted_{false};
  std::atomic<bool> broken_{false};  // an op was given up on or failed
};

}  // namespace

std::unique_ptr<Backend> make_gloo_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, Millis timeout,
                                           ExternalNotice notice) {
  return std::make_unique<GlooBackend>(store, prefix, env, timeout, std::move(notice));
}

}  // namespace lockstep::comm
