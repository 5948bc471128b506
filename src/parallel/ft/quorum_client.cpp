// A replica's side of the quorum service's protocol (lockstep/quorum_wire.h).
#include <lockstep/parallel/ft/quorum_client.h>

#include <arpa/inet.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace lockstep::ft {
namespace {

using lockstep::detail::concat;
using Clock = std::chrono::steady_clock;

int connect_once(const std::string& host, const std::string& port) {
  addrinfo hints = {};
  hints.ai_family = AF_UNSPEC;
  hints.ai_socktype = SOCK_STREAM;
  addrinfo* res = nullptr;
  if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) != 0) return -1;
  int fd = -1;
  for (addrinfo* a = res; a && fd < 0; a = a->ai_next) {
    fd = socket(a->ai_family, a->ai_socktype | SOCK_CLOEXEC, a->ai_protocol);
    if (fd >= 0 && connect(fd, a->ai_addr, a->ai_addrlen) != 0) {
      close(fd);
      fd = -1;
    }
  }
  freeaddrinfo(res);
  if (fd >= 0) {
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
  }
  return fd;
}

}  // namespace

QuorumClient::QuorumClient(const std::string& address, comm::Millis heartbeat,
                           comm::Millis connect_timeout)
    : address_(address), heartbeat_(heartbeat) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos || colon == 0)
    throw ConfigError(concat("fault tolerance: the quorum service's address '", address,
                             "' is not HOST:PORT (LOCKSTEP_COORDINATOR; lockstep-run "
                             "--fault-tolerant sets it)"));
  const auto until = Clock::now() + connect_timeout;
  while ((fd_ = connect_once(address.substr(0, colon), address.substr(colon + 1))) < 0) {
    if (Clock::now() >= until)
      throw QuorumError(
          concat("fault tolerance: cannot reach the quorum service at ", address, " (",
                 std::strerror(errno), ") within ", connect_timeout.count() / 1000.0,
                 " s; is lockstep-run --fault-tolerant (or --coordinator) running?"),
          false);
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
}

std::string QuorumClient::local_host() const {
  sockaddr_storage sa = {};
  socklen_t len = sizeof sa;
  char buf[INET6_ADDRSTRLEN] = {};
  if (getsockname(fd_, reinterpret_cast<sockaddr*>(&sa), &len) != 0) return "127.0.0.1";
  const void* addr =
      sa.ss_family == AF_INET6
          ? static_cast<const void*>(&reinterpret_cast<sockaddr_in6*>(&sa)->sin6_addr)
          : static_cast<const void*>(&reinterpret_cast<sockaddr_in*>(&sa)->sin_addr);
  return inet_ntop(sa.ss_family, addr, buf, sizeof buf) ? buf : "127.0.0.1";
}

void QuorumClient::hello(int replica_id, const std::string& store_host, int store_port,
                         int min_replicas) {
  send_line(concat("HELLO ", replica_id, " ", store_host, " ", store_port, " ", min_replicas));
  beater_ = std::thread([this] { beat(); });
}

QuorumClient::~QuorumClient() {
  {
    std::lock_guard<std::mutex> g(beat_mu_);
    stopping_ = true;
  }
  beat_cv_.notify_all();
  if (beater_.joinable()) beater_.join();
  if (fd_ >= 0) close(fd_);
}

void QuorumClient::bye(int64_t step) noexcept {
  try {
    send_line(concat("BYE ", step));
  } catch (...) {  // the service is gone: nothing to tell it
  }
}

void QuorumClient::beat() {
  std::unique_lock<std::mutex> lk(beat_mu_);
  while (!beat_cv_.wait_for(lk, heartbeat_, [this] { return stopping_; })) {
    try {
      send_line("HB");
    } catch (...) {
      return;  // broken_ is set; the next request reports it
    }
  }
}

void QuorumClient::send_line(const std::string& line) {
  std::lock_guard<std::mutex> g(write_mu_);
  if (broken_) lost("the connection broke earlier");
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd_, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      lost(concat("sending failed: ", std::strerror(errno)));
    }
    off += size_t(n);
  }
}

void QuorumClient::lost(const std::string& why) const {
  throw QuorumError(concat("fault tolerance: lost the quorum service at ", address_, ": ", why,
                           ". The service is the job's one single point of failure (or it "
                           "dropped this replica after missed heartbeats: a stopped or hung "
                           "process); docs/fault-tolerance.md"),
                    false);
}

std::string QuorumClient::await(const std::vector<std::string>& words, comm::Millis timeout) {
  const auto until = Clock::now() + timeout;
  for (;;) {
    const auto nl = pending_.find('\n');
    if (nl != std::string::npos) {
      std::string line = pending_.substr(0, nl);
      pending_.erase(0, nl + 1);
      if (line.compare(0, 5, "STOP ") == 0)
        throw QuorumError("fault tolerance: the quorum service stopped the job: " + line.substr(5),
                          true);
      for (const std::string& word : words)
        if (line.compare(0, word.size() + 1, word + " ") == 0) return line;
      continue;  // a reply to an earlier request that timed out here
    }
    const auto left = std::chrono::duration_cast<comm::Millis>(until - Clock::now()).count();
    if (left <= 0)
      throw QuorumError(
          concat("fault tolerance: no ", words.front(), " reply from the quorum service at ",
                 address_, " within ", timeout.count() / 1000.0, " s"),
          false);
    pollfd p{fd_, POLLIN, 0};
    const int r = poll(&p, 1, int(std::min<long long>(left, 1000)));
    if (r < 0 && errno == EINTR) continue;
    if (r <= 0) continue;
    char buf[4096];
    const ssize_t n = read(fd_, buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      broken_ = true;
      lost(n == 0 ? "it closed the connection" : std::strerror(errno));
    }
    pending_.append(buf, size_t(n));
  }
}

quorum_wire::Quorum QuorumClient::quorum(int64_t step, comm::Millis timeout) {
  send_line(concat("QUORUM ", step));
  const std::string line = await({"QUORUM", "DONE"}, timeout);
  quorum_wire::Quorum q;
  if (line.compare(0, 5, "DONE ") == 0) {
    q.done = true;
    q.max_step = std::atoll(line.c_str() + 5);
    return q;
  }
  if (!quorum_wire::parse_quorum(line, &q))
    lost("it sent a malformed quorum '" + line.substr(0, 120) + "'");
  return q;
}

bool QuorumClient::vote(int64_t quorum_id, int64_t step, bool ok, comm::Millis timeout) {
  send_line(concat("VOTE ", quorum_id, " ", step, " ", ok ? 1 : 0));
  for (;;) {
    const std::string line = await({"VOTE"}, timeout);
    int64_t q = 0, s = 0;
    int decision = 0;
    if (std::sscanf(line.c_str(), "VOTE %" SCNd64 " %" SCNd64 " %d", &q, &s, &decision) != 3)
      lost("it sent a malformed vote '" + line.substr(0, 120) + "'");
    if (q == quorum_id && s == step) return decision != 0;
  }
}

}  // namespace lockstep::ft
