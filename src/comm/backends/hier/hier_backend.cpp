// The hierarchical backend's collectives (the algorithms and their costs: hier_backend.h and
// docs/algorithms.md, "Hierarchical collectives").
#include "comm/backends/hier/hier_backend.h"

#include <lockstep/error.h>

#include <ATen/ATen.h>

#include <map>
#include <thread>

namespace lockstep::comm {

HierBackend::HierBackend(const HierLayout& layout, std::unique_ptr<Backend> intra,
                         std::unique_ptr<Backend> inter, StorePtr store, const std::string& prefix)
    : lay_(layout),
      intra_(std::move(intra)),
      inter_(std::move(inter)),
      store_(std::move(store)),
      notice_key_(notice_key(prefix)) {
  LOCKSTEP_CHECK(intra_->size() == lay_.per_node && inter_->size() == lay_.nodes,
                 "hier: inner groups of ", intra_->size(), " and ", inter_->size(),
                 " ranks for a layout of ", lay_.nodes, " nodes x ", lay_.per_node);
}

// Every rank that published or read the notice counts itself under "/seen"; the others of
// a failed job are the dead (at least one) and the ranks still on their way to it. Rank 0
// waits until all but one node's worth have come, or kLinger.
HierBackend::~HierBackend() {
  if (!failed_ || rank() != 0) return;
  const auto until = Clock::now() + kLinger;
  try {
    while (Clock::now() < until && store_->add(notice_key_ + "/seen", 0) < size() - lay_.per_node)
      std::this_thread::sleep_for(Millis(50));
  } catch (...) {
  }
}

// "inside node 1 (its ranks 0..1 are job ranks 2..3)", "between nodes (the cross-node
// group of local rank 1: its ranks 0..2 are job ranks 1, 3, 5)".
std::string HierBackend::describe(Hop hop) const {
  if (hop == Hop::Intra)
    return lockstep::detail::concat("inside node ", lay_.node, " (its ranks 0..", lay_.per_node - 1,
                                    " are job ranks ", lay_.job_rank(lay_.node, 0), "..",
                                    lay_.job_rank(lay_.node, lay_.per_node - 1), ")");
  std::string ranks;
  for (int n = 0; n < lay_.nodes; ++n)
    ranks += (n ? ", " : "") + std::to_string(lay_.job_rank(n, lay_.local));
  return lockstep::detail::concat("between nodes (the cross-node group of local rank ", lay_.local,
                                  ": its ranks 0..", lay_.nodes - 1, " are job ranks ", ranks, ")");
}

void HierBackend::rethrow(Hop hop, const OpContext& ctx, const CommError& e) {
  CommContext c = op_context(*this, ctx.desc, &ctx);
  const int peer = e.context().peer;
  if (peer >= 0)
    c.peer = hop == Hop::Intra ? lay_.job_rank(lay_.node, peer) : lay_.job_rank(peer, lay_.local);
  std::string what = lockstep::detail::concat(
      e.detail(), " [", e.context().backend, " ", describe(hop),
      c.peer >= 0 ? lockstep::detail::concat("; job rank ", c.peer) : "", "]");
  CommError::Kind kind = e.kind();
  failed_ = true;
  if (kind != CommError::Kind::Aborted && c.peer >= 0) {
    publish(
        Notice{c.peer, kind, lockstep::detail::concat(what, " (seen by job rank ", rank(), ")")});
  } else {  // aborted, or the culprit unknown here: whoever saw it has said who
    if (auto n = notice(Millis(1000))) {
      c.peer = n->peer;
      kind = n->kind;
      what = lockstep::detail::concat(n->what, "; here: ", what);
    }
  }
  throw CommError(kind, c, what);
}

void HierBackend::publish(const Notice& n) noexcept {
  try {
    store_->add(notice_key_ + "/seen", 1);
    if (store_->add(notice_key_ + "/count", 1) != 1) return;  // another rank was first
    const std::string v =
        lockstep::detail::concat(n.peer, "\n", static_cast<int>(n.kind), "\n", n.what);
    store_->set(notice_key_, std::vector<uint8_t>(v.begin(), v.end()));
  } catch (...) {  // the store's host may be the one that failed: the message stays local
  }
}

std::optional<HierBackend::Notice> HierBackend::notice(Millis patience) noexcept {
  const auto until = Clock::now() + patience;
  try {
    while (!store_->check({notice_key_})) {
      if (Clock::now() >= until) return std::nullopt;
      std::this_thread::sleep_for(Millis(20));
    }
    const auto b = store_->get(notice_key_);
    store_->add(notice_key_ + "/seen", 1);
    return parse(b);
  } catch (...) {
    return std::nullopt;
  }
}

std::string HierBackend::notice_reason(const std::vector<uint8_t>& value) {
  return parse(value).what;
}

HierBackend::Notice HierBackend::parse(const std::vector<uint8_t>& value) {
  const std::string v(value.begin(), value.end());
  const auto a = v.find('\n'), k = v.find('\n', a + 1);
  return Notice{std::stoi(v.substr(0, a)),
                static_cast<CommError::Kind>(std::stoi(v.substr(a + 1, k - a - 1))),
                v.substr(k + 1)};
}

template <class F>
void HierBackend::step(Hop hop, const OpContext& ctx, F&& f) {
  try {
    f(hop == Hop::Intra ? *intra_ : *inter_);
  } catch (const CommError& e) {
    rethrow(hop, ctx, e);
  }
}

void HierBackend::allreduce(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  if (lay_.nodes == 1 || lay_.per_node == 1)
    return step(lay_.nodes == 1 ? Hop::Intra : Hop::Inter, ctx,
                [&](Backend& b) { b.allreduce(t, op, ctx); });
  const int64_t bytes = t.numel() * static_cast<int64_t>(t.element_size());
  if (bytes < kSmallBytes || t.numel() < lay_.per_node) return allreduce_small(t, op, ctx);
  allreduce_large(t, op, ctx);
}

void HierBackend::allreduce_small(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  step(Hop::Intra, ctx, [&](Backend& b) { b.allreduce(t, op, ctx); });
  step(Hop::Inter, ctx, [&](Backend& b) { b.allreduce(t, op, ctx); });
}

// Reduce-scatter inside, allreduce of this rank's share across, allgather inside. A buffer
// whose length L does not divide is padded (in a copy) to the next multiple of L.
void HierBackend::allreduce_large(at::Tensor& t, ReduceOp op, const OpContext& ctx) {
  const int L = lay_.per_node;
  const int64_t n = t.numel(), share = (n + L - 1) / L;
  at::Tensor flat = t.view({-1});
  at::Tensor whole = flat;
  if (share * L != n) {
    whole = kept_buffer(scratch_[0], share * L, t.scalar_type());
    whole.narrow(0, 0, n).copy_(flat);
    whole.narrow(0, n, share * L - n).zero_();
  }
  at::Tensor mine = kept_buffer(scratch_[1], share, t.scalar_type());
  step(Hop::Intra, ctx, [&](Backend& b) {
    b.reduce_scatter(mine, whole, op,
                     step_context(ctx, OpKind::ReduceScatter, share * L, t.scalar_type()));
  });
  step(Hop::Inter, ctx, [&](Backend& b) {
    b.allreduce(mine, op, step_context(ctx, OpKind::Allreduce, share, t.scalar_type()));
  });
  step(Hop::Intra, ctx, [&](Backend& b) {
    b.allgather(whole, mine, step_context(ctx, OpKind::Allgather, share, t.scalar_type()));
  });
  if (whole.data_ptr() != flat.data_ptr()) flat.copy_(whole.narrow(0, 0, n));
}

void HierBackend::broadcast(at::Tensor& t, int root, const OpContext& ctx) {
  const int root_node = root / lay_.per_node, root_local = root % lay_.per_node;
  if (lay_.local == root_local && lay_.nodes > 1)
    step(Hop::Inter, ctx, [&](Backend& b) { b.broadcast(t, root_node, ctx); });
  if (lay_.per_node > 1)
    step(Hop::Intra, ctx, [&](Backend& b) { b.broadcast(t, root_local, ctx); });
}

// Across first (each local rank gathers its counterparts' blocks: node-major), then inside
// (local-major), then the blocks are put in job-rank order: [node][local][n].
void HierBackend::allgather(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  const int N = lay_.nodes, L = lay_.per_node;
  const int64_t n = in.numel();
  if (N == 1 || L == 1)
    return step(N == 1 ? Hop::Intra : Hop::Inter, ctx,
                [&](Backend& b) { b.allgather(out, in, ctx); });
  at::Tensor across = kept_buffer(scratch_[0], N * n, in.scalar_type());
  step(Hop::Inter, ctx, [&](Backend& b) {
    b.allgather(across, in, step_context(ctx, OpKind::Allgather, n, in.scalar_type()));
  });
  at::Tensor inside = kept_buffer(scratch_[1], int64_t(L) * N * n, in.scalar_type());
  step(Hop::Intra, ctx, [&](Backend& b) {
    b.allgather(inside, across, step_context(ctx, OpKind::Allgather, N * n, in.scalar_type()));
  });
  out.view({N, L, n}).copy_(inside.view({L, N, n}).transpose(0, 1));
}

// in holds the blocks for job ranks [node][local]; reordered [local][node], reduced inside
// (this rank keeps its local rank's blocks for every node, summed over its node), then
// across (this rank keeps its node's block, summed over nodes).
void HierBackend::reduce_scatter(at::Tensor& out, const at::Tensor& in, ReduceOp op,
                                 const OpContext& ctx) {
  const int N = lay_.nodes, L = lay_.per_node;
  const int64_t n = out.numel();
  if (N == 1 || L == 1)
    return step(N == 1 ? Hop::Intra : Hop::Inter, ctx,
                [&](Backend& b) { b.reduce_scatter(out, in, op, ctx); });
  at::Tensor local_major = kept_buffer(scratch_[0], int64_t(L) * N * n, in.scalar_type());
  local_major.view({L, N, n}).copy_(in.view({N, L, n}).transpose(0, 1));
  at::Tensor mine = kept_buffer(scratch_[1], N * n, in.scalar_type());
  step(Hop::Intra, ctx, [&](Backend& b) {
    b.reduce_scatter(mine, local_major, op,
                     step_context(ctx, OpKind::ReduceScatter, N * n, in.scalar_type()));
  });
  step(Hop::Inter, ctx, [&](Backend& b) {
    b.reduce_scatter(out, mine, op, step_context(ctx, OpKind::ReduceScatter, n, in.scalar_type()));
  });
}

// Rank (a, i) sends block [b][j] to (b, j). Inside: to (a, j) go the blocks for (*, j),
// arriving as [i][b]; reordered [b][i] and sent across: (b, j) receives [a][i], which is
// job-rank order.
void HierBackend::alltoall(at::Tensor& out, const at::Tensor& in, const OpContext& ctx) {
  const int N = lay_.nodes, L = lay_.per_node;
  const int64_t n = in.numel() / (int64_t(N) * L);
  if (N == 1 || L == 1)
    return step(N == 1 ? Hop::Intra : Hop::Inter, ctx,
                [&](Backend& b) { b.alltoall(out, in, ctx); });
  at::Tensor by_local = kept_buffer(scratch_[0], int64_t(L) * N * n, in.scalar_type());
  by_local.view({L, N, n}).copy_(in.view({N, L, n}).transpose(0, 1));
  at::Tensor from_node = kept_buffer(scratch_[1], int64_t(L) * N * n, in.scalar_type());
  step(Hop::Intra, ctx, [&](Backend& b) {
    b.alltoall(from_node, by_local,
               step_context(ctx, OpKind::Alltoall, int64_t(L) * N * n, in.scalar_type()));
  });
  by_local.view({N, L, n}).copy_(from_node.view({L, N, n}).transpose(0, 1));
  step(Hop::Inter, ctx, [&](Backend& b) {
    b.alltoall(out, by_local,
               step_context(ctx, OpKind::Alltoall, int64_t(L) * N * n, in.scalar_type()));
  });
}

std::pair<HierBackend::Hop, int> HierBackend::route(int rank, const char* op) const {
  const int node = rank / lay_.per_node, local = rank % lay_.per_node;
  if (node == lay_.node) return {Hop::Intra, local};
  if (local == lay_.local) return {Hop::Inter, node};
  throw ConfigError(lockstep::detail::concat(
      "the hier backend cannot ", op, " between job rank ", this->rank(), " (node ", lay_.node,
      ", local rank ", lay_.local, ") and job rank ", rank, " (node ", node, ", local rank ", local,
      "): point-to-point goes inside a node or between ranks of the same local rank. "
      "Use LOCKSTEP_BACKEND=gloo for arbitrary pairs across nodes"));
}

void HierBackend::send(const at::Tensor& t, int dst, int tag, const OpContext& ctx) {
  const auto route_to = route(dst, "send");
  const Hop hop = route_to.first;
  const int peer = route_to.second;
  OpContext inner = ctx;  // the inner group's errors name its own rank as the peer
  inner.desc.root = peer;
  step(hop, ctx, [&](Backend& b) { b.send(t, peer, tag, inner); });
}

void HierBackend::recv(at::Tensor& t, int src, int tag, const OpContext& ctx) {
  const auto route_from = route(src, "receive");
  const Hop hop = route_from.first;
  const int peer = route_from.second;
  OpContext inner = ctx;
  inner.desc.root = peer;
  step(hop, ctx, [&](Backend& b) { b.recv(t, peer, tag, inner); });
}

void HierBackend::barrier(const OpContext& ctx) {
  if (lay_.per_node > 1) step(Hop::Intra, ctx, [&](Backend& b) { b.barrier(ctx); });
  if (lay_.nodes > 1) step(Hop::Inter, ctx, [&](Backend& b) { b.barrier(ctx); });
}

std::optional<HierLayout> hier_layout(int rank, const std::vector<int>& local_ranks,
                                      const std::vector<int>& local_sizes,
                                      const std::vector<std::string>& hosts, std::string* why) {
  const int P = static_cast<int>(local_ranks.size());
  const int L = P ? local_sizes[0] : 1;
  for (int r = 0; r < P; ++r)
    if (local_sizes[r] != L) {
      *why = lockstep::detail::concat("nodes run different numbers of ranks (job rank 0's node ", L,
                                      ", job rank ", r, "'s ", local_sizes[r], ")");
      return std::nullopt;
    }
  std::map<int, std::string> node_host;
  for (int r = 0; r < P; ++r) {
    if (L <= 0 || P % L != 0 || local_ranks[r] != r % L) {
      *why = lockstep::detail::concat("ranks are not numbered node by node (job rank ", r,
                                      " has local rank ", local_ranks[r], " of ", L,
                                      " in a job of ", P, ")");
      return std::nullopt;
    }
    auto [it, fresh] = node_host.emplace(r / L, hosts[r]);
    if (!fresh && it->second != hosts[r]) {
      *why = lockstep::detail::concat("node ", r / L, "'s ranks run on hosts ", it->second, " and ",
                                      hosts[r]);
      return std::nullopt;
    }
  }
  return HierLayout{P / L, L, rank / L, rank % L};
}

}  // namespace lockstep::comm

namespace lockstep::comm {

std::unique_ptr<Backend> make_hier_backend(const StorePtr& store, const std::string& prefix,
                                           const LaunchEnv& env, const HierLayout& layout,
                                           const std::string& inter, Millis timeout) {
  LaunchEnv node = env;  // the ranks of this node
  node.rank = node.local_rank = layout.local;
  node.world_size = node.local_world_size = layout.per_node;
  LaunchEnv across = env;  // one rank per node: this local rank's counterparts
  across.rank = layout.node;
  across.world_size = layout.nodes;
  across.local_rank = 0;
  across.local_world_size = 1;
  // Inside first on every rank, then across: the two rendezvous never wait on each other.
  auto intra = make_shm_backend(store, lockstep::detail::concat(prefix, "node", layout.node, "/"),
                                node, timeout);
  std::unique_ptr<Backend> cross;
  if (inter == "mpi")  // the world's ranks of this local rank (MPI_Comm_split)
    cross = make_mpi_backend(env, timeout, layout.local);
  else
    cross = make_gloo_backend(
        store, lockstep::detail::concat(prefix, "cross", layout.local, "/"), across, timeout,
        ExternalNotice{store, HierBackend::notice_key(prefix), HierBackend::notice_reason});
  return std::make_unique<HierBackend>(layout, std::move(intra), std::move(cross), store, prefix);
}

}  // namespace lockstep::comm
