// The quorum service's server: one poll() loop, one thread, line-oriented TCP. The rules
// live in QuorumState; this file only moves lines between sockets and the state.
#include "coordinator.h"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <cstring>
#include <map>
#include <sstream>
#include <thread>

#include "group.h"
#include "line_buffer.h"
#include "lockstep/error.h"

namespace lockstep::launch {
namespace {

using lockstep::detail::concat;
using Clock = std::chrono::steady_clock;

volatile std::sig_atomic_t g_quit = 0;
void on_quit(int) { g_quit = 1; }

void send_line(int fd, const std::string& line) {
  const std::string s = line + "\n";
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) return;  // the peer is gone: its EOF comes through poll
    off += size_t(n);
  }
}

// One request line into the state; false for a line the protocol does not know.
bool dispatch(QuorumState& st, int fd, const std::string& line, Clock::time_point now) {
  std::istringstream in(line);
  std::string word;
  in >> word;
  st.heard(fd, now);
  if (word == "HB") return true;
  if (word == "BYE") {
    int64_t step = 0;
    if (!(in >> step)) return false;
    st.bye(fd, step);
    return true;
  }
  if (word == "HELLO") {
    int id = -1, port = 0, min_replicas = 0;
    std::string host;
    if (!(in >> id >> host >> port) || id < 0) return false;
    if (!(in >> min_replicas)) min_replicas = 0;  // optional
    st.hello(fd, id, host, port, now, min_replicas);
    return true;
  }
  if (word == "QUORUM") {
    int64_t step = 0;
    if (!(in >> step)) return false;
    st.request(fd, step, now);
    return true;
  }
  if (word == "VOTE") {
    int64_t q = 0, step = 0;
    int ok = 0;
    if (!(in >> q >> step >> ok)) return false;
    st.vote(fd, q, step, ok != 0, now);
    return true;
  }
  return false;
}

class Server {
 public:
  Server(int listen_fd, const QuorumConfig& config) : listen_(listen_fd), state_(config) {}

  int run() {
    Clock::time_point stop_at{}, idle_since = Clock::now();
    while (!g_quit) {
      poll_once();
      const auto now = Clock::now();
      for (const auto& m : state_.advance(now)) send_line(m.conn, m.line);
      for (int fd : state_.take_closed()) close_conn(fd);
      for (const auto& l : state_.take_log()) say("quorum service: " + l);
      if (state_.stopped()) {
        if (stop_at == Clock::time_point{}) stop_at = now + std::chrono::seconds(2);
        if (now >= stop_at) return kExitQuorumStop;
      }
      // Done: once every replica left after the job finished, or once none has been
      // connected for a while (one restarting on another node still learns DONE).
      if (state_.all_left()) return 0;
      if (!state_.finished() || !conns_.empty()) idle_since = now;
      if (now - idle_since >= kFinishedLinger) return 0;
    }
    return 0;
  }

 private:
  static constexpr std::chrono::seconds kFinishedLinger{15};

  void poll_once() {
    std::vector<pollfd> pfds{{listen_, POLLIN, 0}};
    for (const auto& [fd, buf] : conns_) pfds.push_back({fd, POLLIN, 0});
    if (poll(pfds.data(), pfds.size(), 100) <= 0) return;
    if (pfds[0].revents & POLLIN) accept_one();
    for (size_t i = 1; i < pfds.size(); ++i)
      if (pfds[i].revents) read_conn(pfds[i].fd);
  }

  void accept_one() {
    const int fd = accept4(listen_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
    if (fd < 0) return;
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    conns_[fd] = LineBuffer{};
  }

  void read_conn(int fd) {
    auto it = conns_.find(fd);
    if (it == conns_.end()) return;
    char buf[4096];
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n < 0 && (errno == EINTR || errno == EAGAIN)) return;
    if (n <= 0) {
      state_.lost(fd);
      close_conn(fd);
      return;
    }
    const auto now = Clock::now();
    for (const std::string& line : it->second.feed(buf, size_t(n)))
      if (!dispatch(state_, fd, line, now)) {
        say(concat("quorum service: closing a connection that sent '", line.substr(0, 80),
                   "' (not this protocol: docs/fault-tolerance.md)"));
        state_.lost(fd);
        close_conn(fd);
        return;
      }
  }

  void close_conn(int fd) {
    if (conns_.erase(fd)) close(fd);
  }

  int listen_;
  QuorumState state_;
  std::map<int, LineBuffer> conns_;
};

}  // namespace

int listen_on(const std::string& addr, int port, int* bound) {
  const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) throw ConfigError(concat("lockstep-run: socket: ", std::strerror(errno)));
  int one = 1;
  setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = htons(uint16_t(port));
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    close(fd);
    throw ConfigError(concat("lockstep-run: quorum service: not an IPv4 address: '", addr, "'"));
  }
  socklen_t len = sizeof sa;
  if (bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 || listen(fd, 128) != 0 ||
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    const int e = errno;
    close(fd);
    throw ConfigError(concat("lockstep-run: quorum service: cannot listen on ", addr, ":", port,
                             ": ", std::strerror(e),
                             e == EADDRINUSE ? " (another job? choose --coordinator-port)" : ""));
  }
  *bound = ntohs(sa.sin_port);
  return fd;
}

int serve_quorum(int listen_fd, const QuorumConfig& config) {
  g_quit = 0;
  struct sigaction sa = {};
  sa.sa_handler = on_quit;
  sigaction(SIGTERM, &sa, nullptr);
  sigaction(SIGINT, &sa, nullptr);
  signal(SIGPIPE, SIG_IGN);
  return Server(listen_fd, config).run();
}

bool service_reachable(const std::string& address, int within_ms) {
  const auto colon = address.rfind(':');
  if (colon == std::string::npos) return false;
  const std::string host = address.substr(0, colon), port = address.substr(colon + 1);
  const auto until = std::chrono::steady_clock::now() + std::chrono::milliseconds(within_ms);
  do {
    addrinfo hints{}, *res = nullptr;
    hints.ai_socktype = SOCK_STREAM;
    if (getaddrinfo(host.c_str(), port.c_str(), &hints, &res) == 0) {
      bool ok = false;
      for (addrinfo* a = res; a && !ok; a = a->ai_next) {
        const int fd = socket(a->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
        if (fd < 0) continue;
        if (connect(fd, a->ai_addr, a->ai_addrlen) == 0 || errno == EINPROGRESS) {
          pollfd p{fd, POLLOUT, 0};
          int err = 0;
          socklen_t len = sizeof err;
          ok = poll(&p, 1, 1000) == 1 && getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) == 0 &&
               err == 0;
        }
        close(fd);
      }
      freeaddrinfo(res);
      if (ok) return true;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(200));
  } while (std::chrono::steady_clock::now() < until);
  return false;
}

}  // namespace lockstep::launch
