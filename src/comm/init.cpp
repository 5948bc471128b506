// init(): read the environment, rendezvous through a c10d store, build the backend.
#include <lockstep/comm/init.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include "comm/backends/factories.h"
#include "comm/backends/hier/hier_backend.h"
#include "comm/blas_check.h"
#include "comm/store_channel.h"

#include <torch/csrc/distributed/c10d/HashStore.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <optional>
#include <random>
#include <sstream>
#include <string_view>
#include <thread>

namespace lockstep::comm {
namespace {

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

constexpr double kMaxTimeoutS = 30 * 24 * 3600;  // 30 days: far beyond any op, no overflow

// A number of seconds in [lo, kMaxTimeoutS] from the environment variable `name`, if set;
// otherwise nothing. `lo_text` says the lower bound in the error message.
std::optional<Millis> env_seconds(const char* name, double lo, const char* lo_text) {
  const char* s = env(name);
  if (s == nullptr) return std::nullopt;
  char* end = nullptr;
  const double v = std::strtod(s, &end);
  if (end == s || *end != '\0' || !(v >= lo && v <= kMaxTimeoutS))
    throw ConfigError(detail::concat(name, "='", s, "' is not a number of seconds between ",
                                     lo_text, " and ", kMaxTimeoutS));
  return Millis(static_cast<int64_t>(v * 1000));
}

Millis default_timeout(const InitOptions& o) {
  if (o.timeout) return *o.timeout;
  return env_seconds(lockstep::env::kTimeoutSeconds, 0.001, "0.001")
      .value_or(ProcessGroupOptions{}.timeout);
}

void check_timeout(Millis t) {
  if (t.count() < 1 || t.count() > kMaxTimeoutS * 1000)
    throw ConfigError(detail::concat("InitOptions::timeout of ", t.count(),
                                     " ms is outside 1 ms .. ", kMaxTimeoutS, " s"));
}

bool check_collectives(const InitOptions& o) {
  if (o.check_collectives) return *o.check_collectives;
  if (const char* s = env(lockstep::env::kCheckCollectives)) {
    const std::string v = s;
    if (v != "0" && v != "1")
      throw ConfigError(
          detail::concat(lockstep::env::kCheckCollectives, "='", v, "' must be 0 or 1"));
    return v == "1";
  }
  return true;
}

// LOCKSTEP_DEBUG=DETAIL (any case) turns on the fingerprint check on every backend.
bool debug_detail(const InitOptions& o) {
  if (o.detail) return *o.detail;
  const char* s = env(lockstep::env::kDebug);
  return s != nullptr && strcasecmp(s, lockstep::env::kDebugDetail) == 0;
}

// LOCKSTEP_DEBUG set to anything but "" or "0".
bool debug_on() {
  const char* s = env(lockstep::env::kDebug);
  return s != nullptr && std::string_view(s) != "0";
}

Millis stall_warn(const InitOptions& o) {
  if (o.stall_warn) return *o.stall_warn;
  return env_seconds(lockstep::env::kStallWarnSeconds, 0, "0 (never warn)")
      .value_or(ProcessGroupOptions{}.stall_warn);
}

std::string hostname() {
  char buf[256] = {0};
  gethostname(buf, sizeof buf - 1);
  return buf;
}

bool is_port_in_use(const std::string& msg) {
  return msg.find("in use") != std::string::npos || msg.find("EADDRINUSE") != std::string::npos ||
         msg.find("failed to listen") != std::string::npos;
}

// --- rendezvous security (docs/launcher.md, "Rendezvous and its security") -------------

// SHA-256 (FIPS 180-4), only to derive HMAC proofs of the token: the token itself never
// enters the store, which any process that reaches the port can read.
struct Sha256 {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a,
                   0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string buf;
  uint64_t bits = 0;

  static uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

  void block(const unsigned char* p) {
    static const uint32_t k[64] = {
        0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4,
        0xab1c5ed5, 0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe,
        0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f,
        0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7,
        0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc,
        0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b,
        0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116,
        0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
        0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
        0xc67178f2};
    uint32_t w[64];
    for (size_t i = 0; i < 16; ++i)
      w[i] = uint32_t(p[4 * i]) << 24 | uint32_t(p[4 * i + 1]) << 16 | uint32_t(p[4 * i + 2]) << 8 |
             uint32_t(p[4 * i + 3]);
    for (int i = 16; i < 64; ++i) {
      uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
      uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
      w[i] = w[i - 16] + s0 + w[i - 7] + s1;
    }
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      uint32_t t1 =
          hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g;
      g = f;
      f = e;
      e = d + t1;
      d = c;
      c = b;
      b = a;
      a = t1 + t2;
    }
    const uint32_t add[8] = {a, b, c, d, e, f, g, hh};
    for (int i = 0; i < 8; ++i) h[i] += add[i];
  }

  void update(const std::string& data) {
    bits += uint64_t(data.size()) * 8;
    buf += data;
    size_t off = 0;
    for (; off + 64 <= buf.size(); off += 64)
      block(reinterpret_cast<const unsigned char*>(buf.data() + off));
    buf.erase(0, off);
  }

  std::string digest() {  // 32 raw bytes
    const uint64_t total = bits;
    std::string pad(1, char(0x80));
    pad.append((buf.size() + 1 + 8 <= 64 ? 56 : 120) - buf.size() - 1, '\0');
    for (int i = 7; i >= 0; --i) pad.push_back(char(total >> (8 * i)));
    update(pad);
    std::string out;
    for (uint32_t v : h)
      for (int i = 3; i >= 0; --i) out.push_back(char(v >> (8 * i)));
    return out;
  }
};

std::string sha256(const std::string& data) {
  Sha256 s;
  s.update(data);
  return s.digest();
}

std::string to_hex(const std::string& raw) {
  static const char* digits = "0123456789abcdef";
  std::string out;
  for (unsigned char c : raw) {
    out.push_back(digits[c >> 4]);
    out.push_back(digits[c & 15]);
  }
  return out;
}

std::string random_hex(size_t bytes) {
  std::random_device rd;  // /dev/urandom on Linux
  std::string raw;
  while (raw.size() < bytes) {
    const uint32_t v = rd();
    raw.append(reinterpret_cast<const char*>(&v), std::min(sizeof v, bytes - raw.size()));
  }
  return to_hex(raw);
}

bool is_loopback(const std::string& addr) {
  return addr == "localhost" || addr == "::1" || addr.rfind("127.", 0) == 0;
}

// libtorch's TCPStore listens on every interface and takes no address to bind. For a
// single-node job rank 0 then ties its listening socket to the loopback device
// (SO_BINDTODEVICE "lo", allowed unprivileged since Linux 5.7): connections that arrive
// from another host are refused. Returns false when it could not (older kernel).
bool restrict_store_to_loopback(int port) {
  bool found = false, ok = true;
  DIR* dir = opendir("/proc/self/fd");
  if (!dir) return false;
  while (dirent* d = readdir(dir)) {
    const int fd = std::atoi(d->d_name);
    if (fd <= 2 || fd == dirfd(dir)) continue;
    int listening = 0;
    socklen_t len = sizeof listening;
    if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &listening, &len) != 0 || !listening) continue;
    sockaddr_storage sa{};
    len = sizeof sa;
    if (getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) continue;
    int p = -1;
    if (sa.ss_family == AF_INET) p = ntohs(reinterpret_cast<sockaddr_in*>(&sa)->sin_port);
    if (sa.ss_family == AF_INET6) p = ntohs(reinterpret_cast<sockaddr_in6*>(&sa)->sin6_port);
    if (p != port) continue;
    found = true;
    ok = setsockopt(fd, SOL_SOCKET, SO_BINDTODEVICE, "lo", 3) == 0 && ok;
  }
  closedir(dir);
  return found && ok;
}

namespace key {
const char* const kJob = "lockstep/rdzv/job";      // rank 0's job id
const char* const kAuth = "lockstep/rdzv/auth";    // "token" or "none"
const char* const kNonce = "lockstep/rdzv/nonce";  // fresh per store: proofs cannot be replayed
const char* const kCheck = "lockstep/rdzv/check";  // rank 0's proof: tells a wrong token
}  // namespace key

std::string store_get(const StorePtr& store, const std::string& k) {
  auto v = store->get(k);
  return std::string(v.begin(), v.end());
}

void store_set(const StorePtr& store, const std::string& k, const std::string& v) {
  store->set(k, std::vector<uint8_t>(v.begin(), v.end()));
}

std::string show_id(const std::string& id) { return id.empty() ? "(none)" : "'" + id + "'"; }

[[noreturn]] void refuse(const LaunchEnv& e, const std::string& why) {
  throw ConfigError(detail::concat("rank ", e.rank, " refused by the rendezvous store at ",
                                   e.master_addr, ":", e.master_port, ": ", why));
}

// The first exchange on a fresh store, before any rank announces itself: rank 0 publishes
// its job id and whether a token is required; every other rank checks both.
void handshake(const StorePtr& store, const LaunchEnv& e) {
  namespace n = lockstep::env;
  if (e.rank == 0) {
    const std::string nonce = random_hex(16);
    store_set(store, key::kNonce, nonce);
    store_set(store, key::kAuth, e.rdzv_token.empty() ? "none" : "token");
    if (!e.rdzv_token.empty())
      store_set(store, key::kCheck, rdzv_proof(e.rdzv_token, nonce + "\ncheck"));
    store_set(store, key::kJob, e.job_id);  // last: the others wait for it
    return;
  }
  const std::string job = store_get(store, key::kJob);
  if (job != e.job_id)
    refuse(e, detail::concat("it belongs to job ", show_id(job), ", this rank to job ",
                             show_id(e.job_id),
                             ". Two jobs share the port: give each its own --master-port "
                             "(MASTER_PORT), or every node of one job the same --rdzv-id (",
                             n::kJobId, ")"));
  const bool required = store_get(store, key::kAuth) == "token";
  if (required && e.rdzv_token.empty())
    refuse(e, detail::concat("rank 0 requires the job's token and this rank has none; set ",
                             n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
  if (!required && !e.rdzv_token.empty())
    refuse(e, detail::concat("this rank has a token but rank 0 has none; set the same ",
                             n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
  if (required && store_get(store, key::kCheck) !=
                      rdzv_proof(e.rdzv_token, store_get(store, key::kNonce) + "\ncheck"))
    refuse(e, detail::concat("this rank's token differs from rank 0's; set the same ",
                             n::kRdzvToken, " or ", n::kRdzvTokenFile, " on every node"));
}

// With a token, each join entry carries an HMAC of (nonce, job, key, payload): entries
// written by a process without the token are told apart from the job's own.
std::string seal(const StorePtr& store, const LaunchEnv& e, const std::string& k,
                 const std::string& payload) {
  if (e.rdzv_token.empty() || e.world_size == 1) return payload;
  const std::string msg =
      store_get(store, key::kNonce) + "\n" + e.job_id + "\n" + k + "\n" + payload;
  return payload + "\n" + rdzv_proof(e.rdzv_token, msg);
}

std::string unseal(const StorePtr& store, const LaunchEnv& e, const std::string& k,
                   const std::string& entry, int rank) {
  if (e.rdzv_token.empty() || e.world_size == 1) return entry;
  const auto cut = entry.rfind('\n');
  std::string payload = cut == std::string::npos ? entry : entry.substr(0, cut);
  if (cut == std::string::npos || seal(store, e, k, payload) != entry) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    c.peer = rank;
    throw CommError(CommError::Kind::Rendezvous, c,
                    detail::concat("the join entry of rank ", rank,
                                   " carries no valid proof of the job's token: a process "
                                   "without the token wrote it; the job stops rather than "
                                   "accept it"));
  }
  return payload;
}

StorePtr connect_store(const LaunchEnv& e, Millis timeout);

// Groups of one job share rank 0's store (it can be hosted only once per port): a later
// init() reuses the store of an earlier group that is still alive, under a new key prefix.
StorePtr shared_store(const LaunchEnv& e, Millis timeout) {
  static std::mutex mu;
  static std::map<std::string, c10::weak_intrusive_ptr<c10d::Store>> live;
  const std::string key = e.master_addr + ":" + std::to_string(e.master_port) + "/" +
                          std::to_string(e.rank) + "/" + std::to_string(e.world_size);
  std::lock_guard<std::mutex> lock(mu);
  auto it = live.find(key);
  if (it != live.end())
    if (StorePtr alive = it->second.lock()) return alive;
  StorePtr store = connect_store(e, timeout);
  if (e.world_size > 1) handshake(store, e);
  live.insert_or_assign(key, c10::weak_intrusive_ptr<c10d::Store>(store));
  return store;
}

StorePtr connect_store(const LaunchEnv& e, Millis timeout) {
  if (e.world_size == 1) return c10::make_intrusive<c10d::HashStore>();
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(e.master_port);
  o.isServer = e.rank == 0;
  o.waitWorkers = false;  // our own join below names the ranks that are missing
  o.timeout = timeout;
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, o);
    const bool local = is_loopback(e.master_addr) ||
                       (e.single_node() && e.launcher == lockstep::env::kLauncherName);
    if (o.isServer && local && !restrict_store_to_loopback(e.master_port))
      std::fprintf(stderr,
                   "lockstep: warning: could not restrict the rendezvous store on port %d to "
                   "loopback (SO_BINDTODEVICE needs Linux 5.7); it accepts other hosts too\n",
                   e.master_port);
    return store;
  } catch (const std::exception& ex) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    const std::string where = e.master_addr + ":" + std::to_string(e.master_port);
    if (e.rank == 0 && is_port_in_use(ex.what()))
      throw ConfigError(detail::concat(
          "rank 0 cannot host the rendezvous store on ", where,
          ": the port is in use. Pick "
          "another with MASTER_PORT (lockstep-run --master-port N, or 0 to choose a free one)"));
    if (e.rank == 0) throw CommError(CommError::Kind::Rendezvous, c, ex.what());
    c.peer = 0;
    c.timeout_s = std::chrono::duration<double>(timeout).count();
    throw CommError(CommError::Kind::Rendezvous, c,
                    detail::concat("could not reach rank 0's store at ", where,
                                   ": rank 0 has not started, or MASTER_ADDR/MASTER_PORT point "
                                   "elsewhere (",
                                   ex.what(), ")"));
  }
}

bool store_check(const StorePtr& store, const std::string& key, const LaunchEnv& e) {
  try {
    return store->check({key});
  } catch (const std::exception& ex) {
    CommContext c;
    c.rank = e.rank;
    c.world_size = e.world_size;
    c.op = "rendezvous";
    c.peer = 0;
    throw CommError(
        CommError::Kind::Rendezvous, c,
        detail::concat("lost the connection to rank 0's store (rank 0 exited or gave up "
                       "waiting): ",
                       ex.what()));
  }
}

// Every rank announces itself, then waits for all; on timeout the message lists who is missing.
// Returns every rank's `payload` (by default its hostname).
std::vector<std::string> join(const StorePtr& store, const std::string& prefix, const LaunchEnv& e,
                              Millis timeout, const std::string& payload = hostname()) {
  const std::string mine = prefix + "join/" + std::to_string(e.rank);
  store_set(store, mine, seal(store, e, mine, payload));
  const auto start = Clock::now();
  // Rank 0 hosts the store: it waits a little longer, so the others can read the store
  // (and report the missing ranks themselves) until they give up.
  const auto limit = timeout + (e.rank == 0 ? Millis(2000) : Millis(0));
  std::vector<bool> seen(e.world_size, false);
  for (;;) {
    std::vector<int> missing;
    for (int r = 0; r < e.world_size; ++r) {
      if (!seen[r]) seen[r] = store_check(store, prefix + "join/" + std::to_string(r), e);
      if (!seen[r]) missing.push_back(r);
    }
    if (missing.empty()) break;
    if (Clock::now() - start > limit) {
      std::string list;
      for (int r : missing) list += (list.empty() ? "" : ", ") + std::to_string(r);
      CommContext c;
      c.rank = e.rank;
      c.world_size = e.world_size;
      c.op = "rendezvous";
      c.elapsed_s = std::chrono::duration<double>(Clock::now() - start).count();
      c.timeout_s = std::chrono::duration<double>(timeout).count();
      throw CommError(CommError::Kind::Rendezvous, c,
                      detail::concat(missing.size(), " of ", e.world_size,
                                     " ranks never joined: missing rank(s) ", list));
    }
    std::this_thread::sleep_for(Millis(20));
  }
  std::vector<std::string> hosts;
  for (int r = 0; r < e.world_size; ++r) {
    const std::string k = prefix + "join/" + std::to_string(r);
    hosts.push_back(unseal(store, e, k, store_get(store, k), r));
  }
  return hosts;
}

}  // namespace

std::string rdzv_proof(const std::string& token, const std::string& message) {
  // HMAC-SHA256 (RFC 2104): H((K ^ opad) || H((K ^ ipad) || m)), K padded to 64 bytes.
  std::string k = token.size() > 64 ? sha256(token) : token;
  k.resize(64, '\0');
  std::string inner = k, outer = k;
  for (char& c : inner) c ^= 0x36;
  for (char& c : outer) c ^= 0x5c;
  return to_hex(sha256(outer + sha256(inner + message)));
}

std::string resolve_backend(const std::string& requested, const LaunchEnv& env_) {
  std::string b = requested;
  if (b == "auto")
    if (const char* e = env(lockstep::env::kBackend)) b = e;
  if (b != "auto" && b != "shm" && b != "gloo" && b != "mpi" && b != "nccl" && b != "hier")
    throw ConfigError(detail::concat("unknown backend '", b, "' (from ", lockstep::env::kBackend,
                                     " or InitOptions::backend); "
                                     "choose auto, shm, gloo, hier, mpi or nccl"));
  if (b != "auto") return b;
  // Under mpirun too: there the store is bootstrapped through MPI (job_store), and hier
  // crosses nodes with mpi.
  if (env_.single_node()) return "shm";
  if (env_.local_world_size > 1) return "hier";
  return env_.launcher == "mpirun" && mpi_available() ? "mpi" : "gloo";
}

namespace {

ProcessGroupOptions group_options(const InitOptions& options) {
  ProcessGroupOptions pgo;
  pgo.timeout = default_timeout(options);
  check_timeout(pgo.timeout);
  pgo.check_collectives = check_collectives(options);
  pgo.detail = debug_detail(options);
  pgo.stall_warn = stall_warn(options);
  return pgo;
}

// Groups whose backend shares no memory get their own connection to rank 0's store for the
// DETAIL fingerprint check and the stall inspector (keys under prefix + "side/"): a call
// stuck there never holds up the connection that later groups rendezvous through.
ProcessGroupOptions with_side_store(ProcessGroupOptions pgo, const std::string& backend,
                                    const LaunchEnv& e, const std::string& prefix) {
  if (backend == "shm" || e.world_size == 1 || (!pgo.detail && pgo.stall_warn.count() == 0))
    return pgo;
  c10d::TCPStoreOptions o;
  o.port = static_cast<uint16_t>(e.master_port);
  o.isServer = false;
  o.waitWorkers = false;
  o.timeout = std::min<Millis>(pgo.timeout, std::chrono::seconds(30));
  try {
    auto store = c10::make_intrusive<c10d::TCPStore>(e.master_addr, o);
    pgo.side_store = std::make_shared<StoreChannel>(std::move(store), prefix + "side/");
  } catch (const std::exception& ex) {
    // Diagnostics only: the group works without them (DETAIL then checks by allgather).
    std::fprintf(stderr,
                 "lockstep: warning: rank %d: no second connection to the store at %s:%d for the "
                 "stall inspector and LOCKSTEP_DEBUG=DETAIL (%s); the stall inspector shows this "
                 "rank's own waits only\n",
                 e.rank, e.master_addr.c_str(), e.master_port, ex.what());
  }
  return pgo;
}

// Under mpirun (any backend but mpi): the store whose address MPI carries
// (mpi_bootstrap_store, factories.h) instead of MASTER_ADDR/MASTER_PORT; fills e's.
bool bootstraps_through_mpi(const LaunchEnv& e) {
  return e.launcher == "mpirun" && e.world_size > 1 && mpi_available();
}

StorePtr mpirun_store(LaunchEnv& e, Millis timeout) {
  static std::mutex mu;
  static bool ready = false;
  StorePtr store = mpi_bootstrap_store(e, timeout);
  std::lock_guard<std::mutex> lock(mu);
  if (!ready) {
    if (e.rank == 0 && is_loopback(e.master_addr) && !restrict_store_to_loopback(e.master_port))
      std::fprintf(stderr,
                   "lockstep: warning: could not restrict the rendezvous store on port %d to "
                   "loopback (SO_BINDTODEVICE needs Linux 5.7); it accepts other hosts too\n",
                   e.master_port);
    handshake(store, e);
    ready = true;
  }
  return store;
}

StorePtr job_store(LaunchEnv& e, Millis timeout) {
  return bootstraps_through_mpi(e) ? mpirun_store(e, timeout) : shared_store(e, timeout);
}

// Groups made in the same order on every rank get the same key namespace.
std::string next_prefix() {
  static std::atomic<int> generation{0};
  return "lockstep/" + std::to_string(generation++) + "/";
}

// The store must outlive the group: rank 0 hosts it for every other rank.
std::shared_ptr<ProcessGroup> own_store(std::unique_ptr<Backend> b, const StorePtr& store,
                                        const ProcessGroupOptions& pgo) {
  return std::shared_ptr<ProcessGroup>(new ProcessGroup(std::move(b), pgo),
                                       [store](ProcessGroup* pg) { delete pg; });
}

// True when the program or LOCKSTEP_BACKEND asked for hier by name (not through auto).
bool requested(const InitOptions& o) {
  const char* b = env(lockstep::env::kBackend);
  return o.backend == "hier" || (o.backend == "auto" && b != nullptr && std::string(b) == "hier");
}

// What each rank says of itself at the join: where it sits on its node, and the node.
std::string join_payload(const LaunchEnv& e) {
  return detail::concat(e.local_rank, " ", e.local_world_size, " ", hostname());
}

struct Joined {
  std::vector<int> local_ranks, local_sizes;
  std::vector<std::string> hosts;
};

Joined parse_joined(const std::vector<std::string>& payloads) {
  Joined j;
  for (const std::string& p : payloads) {
    std::istringstream in(p);
    int l = 0, s = 0;
    std::string host;
    in >> l >> s;
    std::getline(in >> std::ws, host);
    j.local_ranks.push_back(l);
    j.local_sizes.push_back(s);
    j.hosts.push_back(host);
  }
  return j;
}

// The hier backend if the job's layout allows it, crossing nodes with mpi under mpirun and
// gloo otherwise. Where the layout does not allow it, or one rank per node makes it
// pointless, a job that asked for "auto" gets that flat transport (the same choice on every
// rank: it depends only on what the join gathered); one that asked for "hier" gets the reason.
std::unique_ptr<Backend> make_hier_or_mpi_or_gloo(const StorePtr& store, const std::string& prefix,
                                                  const LaunchEnv& e, const Joined& j,
                                                  bool requested, Millis timeout) {
  const std::string across = bootstraps_through_mpi(e) ? "mpi" : "gloo";
  std::string why;
  const auto layout = hier_layout(e.rank, j.local_ranks, j.local_sizes, j.hosts, &why);
  if (layout && (layout->per_node > 1 || requested))
    return make_hier_backend(store, prefix, e, *layout, across, timeout);
  if (requested)
    throw ConfigError(
        detail::concat("LOCKSTEP_BACKEND=hier needs the same number of ranks on "
                       "every node, numbered node by node, but ",
                       why, "; use LOCKSTEP_BACKEND=", across));
  if (e.rank == 0 && !layout)
    std::fprintf(stderr, "lockstep: %s across all ranks, not hierarchical: %s\n", across.c_str(),
                 why.c_str());
  return across == "mpi" ? make_mpi_backend(e, timeout)
                         : make_gloo_backend(store, prefix, e, timeout);
}

// The shm or gloo group of the ranks in `e` (hosts: each one's hostname), rendezvousing
// under `prefix` in `store`, which must outlive the group.
std::shared_ptr<ProcessGroup> make_group(const std::string& backend, const StorePtr& store,
                                         const std::string& prefix, const LaunchEnv& e,
                                         const std::vector<std::string>& hosts,
                                         const ProcessGroupOptions& pgo) {
  std::unique_ptr<Backend> b;
  if (backend == "shm") {
    for (size_t r = 0; r < hosts.size(); ++r)
      if (hosts[r] != hosts[0])
        throw ConfigError(
            detail::concat("backend shm needs every rank on one node, but rank 0 is on ", hosts[0],
                           " and rank ", r, " on ", hosts[r], "; use gloo or mpi across nodes"));
    b = make_shm_backend(store, prefix, e, pgo.timeout);
  } else if (backend == "nccl") {  // docs/gpu.md; ConfigError in a build without CUDA
    b = make_nccl_backend(store, prefix, e, pgo.timeout);
  } else {
    b = make_gloo_backend(store, prefix, e, pgo.timeout);
  }
  return own_store(std::move(b), store, pgo);
}

}  // namespace

std::shared_ptr<ProcessGroup> init(const InitOptions& options) {
  LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  e.announce();  // which launch contract, on rank 0 for schedulers (docs/schedulers.md)
  const std::string backend = resolve_backend(options.backend, e);
  const ProcessGroupOptions pgo = group_options(options);
  check_blas(e, debug_on());
  if (backend == "mpi")
    return std::make_shared<ProcessGroup>(make_mpi_backend(e, pgo.timeout), pgo);
  const std::string prefix = next_prefix();
  StorePtr store = job_store(e, pgo.timeout);
  const Joined j = parse_joined(join(store, prefix, e, pgo.timeout, join_payload(e)));
  const ProcessGroupOptions side = with_side_store(pgo, backend, e, prefix);
  if (backend == "hier")
    return own_store(make_hier_or_mpi_or_gloo(store, prefix, e, j, requested(options), pgo.timeout),
                     store, side);
  return make_group(backend, store, prefix, e, j.hosts, side);
}

std::shared_ptr<ProcessGroup> init_split(int color, const InitOptions& options) {
  LaunchEnv e = options.env ? *options.env : LaunchEnv::from_environment();
  const std::string backend = resolve_backend(options.backend, e);
  LOCKSTEP_CHECK(color >= 0, "init_split: color must be >= 0, got ", color);
  const ProcessGroupOptions pgo = group_options(options);
  if (backend == "mpi")  // MPI_Comm_split over MPI_COMM_WORLD, key = world rank
    return std::make_shared<ProcessGroup>(make_mpi_backend(e, pgo.timeout, color), pgo);
  const std::string prefix = next_prefix();
  StorePtr store = job_store(e, pgo.timeout);
  const std::string me = hostname();
  const auto all = join(store, prefix, e, pgo.timeout, std::to_string(color) + " " + me);
  LaunchEnv sub = e;  // the members, in world rank order
  sub.world_size = sub.local_world_size = 0;
  std::vector<std::string> hosts;
  for (int r = 0; r < e.world_size; ++r) {
    const auto space = all[r].find(' ');
    if (std::stoi(all[r].substr(0, space)) != color) continue;
    const std::string host = all[r].substr(space + 1);
    if (r == e.rank) sub.rank = sub.world_size;
    if (host == me) {
      if (r == e.rank) sub.local_rank = sub.local_world_size;
      ++sub.local_world_size;
    }
    hosts.push_back(host);
    ++sub.world_size;
  }
  const std::string sub_prefix = prefix + "color" + std::to_string(color) + "/";
  // A subgroup of a hierarchical job is shm on one node, else gloo: the groups hybrid
  // schemes split off (one node; one rank per node) gain nothing from two levels.
  const std::string sub_backend =
      backend != "hier" ? backend : (sub.single_node() ? "shm" : "gloo");
  return make_group(sub_backend, store, sub_prefix, sub, hosts,
                    with_side_store(pgo, sub_backend, sub, sub_prefix));
}

}  // namespace lockstep::comm
