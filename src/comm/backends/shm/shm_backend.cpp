// The shm backend: rendezvous, descriptor checks, progress counters, barrier, abort.
// The data-moving algorithms live one per file (allreduce_shm.cpp, ...).
#include "comm/backends/shm/shm_backend.h"
#include "comm/op_fingerprint.h"

#include <lockstep/error.h>

#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <sstream>

namespace lockstep::comm::shm {
namespace {

std::string join_key(const std::string& prefix, const std::string& key) {
  if (prefix.empty() || prefix.back() == '/') return prefix + "shm/" + key;
  return prefix + "/shm/" + key;
}

uint64_t parse_bytes(const char* var, uint64_t fallback) {
  const char* v = std::getenv(var);
  if (v == nullptr || *v == '\0') return fallback;
  char* end = nullptr;
  const unsigned long long x = std::strtoull(v, &end, 10);
  uint64_t mult = 1;
  if (*end == 'K' || *end == 'k')
    mult = 1 << 10, ++end;
  else if (*end == 'M' || *end == 'm')
    mult = 1 << 20, ++end;
  else if (*end == 'G' || *end == 'g')
    mult = 1 << 30, ++end;
  if (end == v || *end != '\0' || x == 0 || x * mult < 4096 || x * mult > (uint64_t{1} << 34))
    throw ConfigError(lockstep::detail::concat(var, "=", v,
                                               ": expected a byte count between 4096 and 16G "
                                               "(plain number, or with a K/M/G suffix)"));
  return (x * mult + 4095) / 4096 * 4096;  // whole pages: keeps chunk parts aligned
}

// An unguessable name: another user cannot pre-create it, two groups cannot collide.
std::string segment_name(const std::string& prefix) {
  std::random_device rd;
  const uint64_t nonce = (uint64_t{rd()} << 32) ^ rd();
  std::ostringstream os;
  os << "/lockstep-" << ::getuid() << "-" << std::hex << nonce << "-"
     << (std::hash<std::string>{}(prefix)&0xffffffffu);
  return os.str();
}

WireDesc to_wire(const OpDesc& d) {
  WireDesc w;
  w.kind = static_cast<int32_t>(d.kind);
  w.dtype = static_cast<int32_t>(d.dtype);
  w.op = static_cast<int32_t>(d.op);
  w.root = d.root;
  w.tag = d.tag;
  w.seq = d.seq;
  w.numel = d.numel;
  return w;
}

OpDesc from_wire(const WireDesc& w) {
  OpDesc d;
  d.kind = static_cast<OpKind>(w.kind);
  d.dtype = static_cast<at::ScalarType>(w.dtype);
  d.op = static_cast<ReduceOp>(w.op);
  d.root = w.root;
  d.tag = w.tag;
  d.seq = w.seq;
  d.numel = w.numel;
  return d;
}

bool same(const WireDesc& a, const WireDesc& b) {
  return a.kind == b.kind && a.seq == b.seq && a.numel == b.numel && a.dtype == b.dtype &&
         a.op == b.op && a.root == b.root;
}

}  // namespace

ShmOptions ShmOptions::from_environment() {
  ShmOptions o;
  o.buffer_bytes = parse_bytes("LOCKSTEP_SHM_BUFFER_BYTES", o.buffer_bytes);
  o.channel_bytes = parse_bytes("LOCKSTEP_SHM_CHANNEL_BYTES", o.channel_bytes);
  o.stream_output_bytes = parse_bytes("LOCKSTEP_SHM_STREAM_BYTES", o.stream_output_bytes);
  o.path = path_mode_from_environment();
  return o;
}

ShmBackend::ShmBackend(const StorePtr& store, const std::string& prefix, const LaunchEnv& env,
                       Millis timeout, const ShmOptions& options)
    : rank_(env.rank),
      size_(env.world_size),
      options_(options),
      policy_(WaitPolicy::for_group(env.world_size)),
      pids_(env.world_size, 0),
      paths_(options.path) {
  rendezvous(store, prefix, timeout);
}

ShmBackend::~ShmBackend() = default;  // Segment unmaps; never throws

void ShmBackend::rendezvous(const StorePtr& store, const std::string& prefix, Millis timeout) {
  CommContext c;
  c.rank = rank_;
  c.world_size = size_;
  c.backend = "shm";
  c.op = "rendezvous";
  c.timeout_s = std::chrono::duration<double>(timeout).count();
  const Clock::time_point start = Clock::now();
  auto fail = [&](const std::string& what) {
    c.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
    return CommError(CommError::Kind::Rendezvous, c, what);
  };

  const std::string seg_key = join_key(prefix, "segment");
  std::string name;
  SegmentConfig cfg{size_, options_.buffer_bytes, options_.channel_bytes, options_.small_bytes};
  if (rank_ == 0) {
    name = segment_name(prefix);
    try {
      seg_ = Segment::create(name, cfg);
    } catch (const std::exception& e) {
      // Tell the others now rather than letting them wait out the timeout.
      const std::string v = std::string("!") + e.what();
      store->set(seg_key, std::vector<uint8_t>(v.begin(), v.end()));
      throw;
    }
    const std::string v = lockstep::detail::concat(name, " ", cfg.buffer_bytes, " ",
                                                   cfg.channel_bytes, " ", cfg.small_bytes);
    store->set(seg_key, std::vector<uint8_t>(v.begin(), v.end()));
  } else {
    try {
      store->wait({seg_key}, timeout);
    } catch (const std::exception& e) {
      throw fail(lockstep::detail::concat("rank 0 never published the shm segment: ", e.what()));
    }
    const std::vector<uint8_t> raw = store->get(seg_key);
    const std::string value(raw.begin(), raw.end());
    if (!value.empty() && value[0] == '!')
      throw fail("rank 0 could not create the shm segment: " + value.substr(1));
    std::istringstream is(value);
    is >> name >> cfg.buffer_bytes >> cfg.channel_bytes >> cfg.small_bytes;  // rank 0's win
    options_.buffer_bytes = cfg.buffer_bytes;
    options_.channel_bytes = cfg.channel_bytes;
    options_.small_bytes = cfg.small_bytes;
    seg_ = Segment::open(name, cfg);
  }
  seg_name_ = name;
  seg_.info(rank_).pid.store(static_cast<int32_t>(::getpid()), std::memory_order_release);

  // Barrier through the store: once every rank has mapped the segment its name is
  // no longer needed, and unlinking it now means no crash can ever leak it.
  std::vector<std::string> keys;
  keys.reserve(size_);
  for (int r = 0; r < size_; ++r)
    keys.push_back(join_key(prefix, lockstep::detail::concat("mapped/", r)));
  store->set(keys[rank_], std::vector<uint8_t>{'1'});
  try {
    store->wait(keys, timeout);
  } catch (const std::exception&) {
    Segment::unlink(name);
    std::string missing;
    for (int r = 0; r < size_; ++r)
      if (!store->check({keys[r]}))
        missing += lockstep::detail::concat(missing.empty() ? "" : ", ", r);
    throw fail(
        lockstep::detail::concat("ranks [", missing, "] never mapped the shm segment ", name));
  }
  Segment::unlink(name);  // every rank tries: whoever survives removes it
  for (int r = 0; r < size_; ++r)
    pids_[r] = static_cast<pid_t>(seg_.info(r).pid.load(std::memory_order_acquire));
  peers_ = PeerPoller(rank_, pids_, policy_);
}

Waiter ShmBackend::make_waiter(const OpContext& ctx, const OpDesc& d) {
  CommContext c = op_context(*this, d);
  c.timeout_s = std::chrono::duration<double>(ctx.timeout).count();
  return Waiter(seg_, peers_, rank_, policy_, ctx, std::move(c), aborted_);
}

Waiter ShmBackend::begin(OpKind kind, int64_t numel, at::ScalarType dtype, ReduceOp op, int root,
                         const OpContext& ctx, const void* payload, size_t payload_bytes,
                         int32_t variant, uint64_t shared_at) {
  OpDesc d = ctx.desc;
  d.kind = kind;
  d.numel = numel;
  d.dtype = dtype;
  d.op = op;
  d.root = root;
  d.tag = 0;
  Waiter w = make_waiter(ctx, d);
  w.raise_if_failed();  // a broken group fails at once, before touching shared state
  // Slot n % 2 is free: every peer has posted collective n - 1's descriptor (we saw
  // it in the last round), so it has finished reading collective n - 2's slot.
  const uint64_t slot = collectives_++ % 2;
  if (payload_bytes > 0)
    std::memcpy(seg_.small(rank_, static_cast<int>(slot)), payload, payload_bytes);
  WireDesc wire = to_wire(d);
  wire.variant = variant;
  wire.shared_at = shared_at;
  seg_.info(rank_).desc[slot] = wire;
  post();
  wait_all(w, step_);
  check_descriptors(w, slot);
  return w;
}

bool ShmBackend::all_shared_at(uint64_t code) const {
  if (code == 0) return false;
  for (int r = 0; r < size_; ++r)
    if (last_desc(r).shared_at != code) return false;
  return true;
}

void ShmBackend::check_descriptors(Waiter& w, uint64_t slot) {
  // Every rank compares every rank against rank 0, so all reach the same verdict.
  const WireDesc& d0 = seg_.info(0).desc[slot];
  for (int r = 1; r < size_; ++r) {
    const WireDesc& dr = seg_.info(r).desc[slot];
    if (!same(d0, dr))
      w.fail(CommError::Kind::Mismatch, rank_ == r ? 0 : r,
             describe_mismatch(0, from_wire(d0), r, from_wire(dr)));
  }
}

int64_t ShmBackend::region_elems(int64_t es) const {
  const int64_t align = std::max<int64_t>(1, 128 / es);
  return std::max<int64_t>(1, static_cast<int64_t>(buffer_bytes()) / (size_ * es) / align * align);
}

void ShmBackend::stage_others(int b, const char* src, int64_t n, int64_t off, int64_t len,
                              int64_t m, int64_t es) {
  char* const mine = seg_.staging(rank_, b);
  for (int d = 0; d < size_; ++d)
    if (d != rank_) std::memcpy(mine + d * m * es, src + (d * n + off) * es, len * es);
}

void ShmBackend::wait_peer(Waiter& w, int peer, uint64_t target) const {
  Progress& p = seg_.progress(peer);
  w.wait_until([&] { return p.value.load(std::memory_order_acquire) >= target; }, peer, &p, target);
}

void ShmBackend::wait_all(Waiter& w, uint64_t target) const {
  for (int r = 0; r < size_; ++r)
    if (r != rank_) wait_peer(w, r, target);
}

void ShmBackend::barrier(const OpContext& ctx) {
  begin(OpKind::Barrier, 0, at::kFloat, ReduceOp::Sum, -1, ctx);  // the descriptor round is one
}

std::vector<OpDesc> ShmBackend::last_entered() const {
  std::vector<OpDesc> out(size_);
  for (int r = 0; r < size_; ++r) {
    if (r == rank_) continue;  // our own slots are being written by our comm thread
    // A rank's newest descriptor is the slot with the larger sequence number. The copy may
    // be torn if that rank is posting its next op right now; the inspector reports only a
    // state that stayed the same for warn/4 seconds, which a rank in motion does not.
    const WireDesc a = seg_.info(r).desc[0];
    const WireDesc b = seg_.info(r).desc[1];
    out[r] = from_wire(a.seq >= b.seq ? a : b);
  }
  return out;
}

void ShmBackend::abort() noexcept {
  aborted_.store(true, std::memory_order_release);
  uint64_t expected = 0;
  seg_.header().abort_word.compare_exchange_strong(
      expected, encode_failure(Failure{CommError::Kind::Aborted, rank_, -1}),
      std::memory_order_acq_rel);
  wake_all(seg_);  // sleepers (ours and the peers') see it now, not at their next check
}

}  // namespace lockstep::comm::shm

namespace lockstep::comm {

std::unique_ptr<Backend> make_shm_backend(const StorePtr& store, const std::string& prefix,
                                          const LaunchEnv& env, Millis timeout) {
  if (!env.single_node())
    throw ConfigError(lockstep::detail::concat(
        "the shm backend needs all ranks on one node, but ", env.local_world_size, " of ",
        env.world_size, " ranks are local (use LOCKSTEP_BACKEND=gloo or mpi)"));
  return std::make_unique<shm::ShmBackend>(store, prefix, env, timeout,
                                           shm::ShmOptions::from_environment());
}

}  // namespace lockstep::comm
