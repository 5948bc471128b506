// The restart loop around Group, and the one-time setup of a launch (port, job id, logs).
#include "lockstep/launch/launcher.h"

#include <arpa/inet.h>
#include <dirent.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include <sys/prctl.h>
#include <sys/wait.h>

#include <csignal>
#include <thread>

#include "coordinator.h"
#include "group.h"
#include "lockstep/launch/rank_env.h"

namespace lockstep::launch {
namespace {

using lockstep::detail::concat;

// If the launcher was started with fd 0, 1 or 2 closed, a pipe could land there and the
// child's dup2 onto 1/2 would clobber it; park /dev/null on the gaps first.
void ensure_std_fds_open() {
  for (int fd = 0; fd < 3; ++fd) {
    if (fcntl(fd, F_GETFD) != -1 || errno != EBADF) continue;
    int n = open("/dev/null", fd == 0 ? O_RDONLY : O_WRONLY);
    if (n >= 0 && n != fd) {
      dup2(n, fd);
      close(n);
    }
  }
}

void make_dirs(const std::string& dir) {
  std::string path;
  for (std::size_t i = 0; i <= dir.size(); ++i) {
    if (i == dir.size() || (dir[i] == '/' && i > 0)) {
      path = dir.substr(0, i);
      if (mkdir(path.c_str(), 0755) != 0 && errno != EEXIST)
        throw ConfigError(
            concat("lockstep-run: cannot create --log-dir '", path, "': ", std::strerror(errno)));
    }
  }
}

// One file per local rank, truncated once per launch; restarts append to it.
std::vector<int> open_logs(const LaunchOptions& opt) {
  std::vector<int> fds;
  if (opt.log_dir.empty()) return fds;
  make_dirs(opt.log_dir);
  for (int local = 0; local < opt.nproc_per_node; ++local) {
    std::string path = opt.log_dir + "/rank_" + std::to_string(opt.global_rank(local)) + ".log";
    int fd = open(path.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0644);
    if (fd < 0) {
      int e = errno;
      for (int f : fds) close(f);
      throw ConfigError(
          concat("lockstep-run: cannot open log file '", path, "': ", std::strerror(e)));
    }
    fds.push_back(fd);
  }
  return fds;
}

void mark_restart_in_logs(const std::vector<int>& fds, int restart) {
  std::string line = "--- lockstep-run: restart " + std::to_string(restart) + " ---\n";
  for (int fd : fds) (void)!write(fd, line.data(), line.size());
}

// Closes the log fds however run_launcher leaves.
struct FdCloser {
  std::vector<int>& fds;
  ~FdCloser() {
    for (int fd : fds) close(fd);
  }
};

// The directory of the ranks' error files (error_file.h), removed with what is in it when
// the launch ends. Inside --log-dir when there is one, so the files can be looked at.
class ErrorDir {
 public:
  explicit ErrorDir(const LaunchOptions& opt) : keep_(!opt.log_dir.empty()) {
    if (keep_) {
      path_ = opt.log_dir;
      return;
    }
    const char* tmp = std::getenv("TMPDIR");
    std::string templ = std::string(tmp && *tmp ? tmp : "/tmp") + "/lockstep-run-XXXXXX";
    if (mkdtemp(templ.data()) != nullptr) path_ = templ;  // else: no error files, no harm
  }
  ~ErrorDir() {
    if (keep_ || path_.empty()) return;
    if (DIR* d = opendir(path_.c_str())) {
      while (dirent* e = readdir(d))
        if (e->d_name[0] != '.') unlink((path_ + "/" + e->d_name).c_str());
      closedir(d);
    }
    rmdir(path_.c_str());
  }
  ErrorDir(const ErrorDir&) = delete;
  ErrorDir& operator=(const ErrorDir&) = delete;
  const std::string& path() const { return path_; }

 private:
  bool keep_;
  std::string path_;
};

QuorumConfig quorum_config(const LaunchOptions& opt) {
  QuorumConfig c;
  c.min_replicas = opt.min_replicas;
  c.expected = opt.replicas();
  c.heartbeat_timeout = std::chrono::milliseconds(long(opt.heartbeat_timeout * 1000));
  return c;
}

// The quorum service's port: --coordinator-port, else a free one on one node (0), else
// --master-port + 1, which every node can work out alone.
int coordinator_port(const LaunchOptions& opt) {
  if (opt.coordinator_port >= 0) return opt.coordinator_port;
  return opt.nnodes == 1 ? 0 : opt.master_port + 1;
}

// The quorum service in a child process of its own (its own process group, so a Ctrl-C
// meant for the ranks does not reach it; it ends with lockstep-run). Sets ctx's address
// and pid.
void start_quorum_service(const LaunchOptions& opt, GroupContext& ctx) {
  int port = 0;
  const int fd = listen_on(opt.nnodes == 1 ? "127.0.0.1" : "0.0.0.0", coordinator_port(opt), &port);
  const pid_t pid = fork();
  if (pid < 0) {
    close(fd);
    throw Error(
        concat("lockstep-run: cannot start the quorum service: fork: ", std::strerror(errno)));
  }
  if (pid == 0) {
    prctl(PR_SET_PDEATHSIG, SIGTERM);
    setpgid(0, 0);
    std::_Exit(serve_quorum(fd, quorum_config(opt)));
  }
  close(fd);
  ctx.service_pid = pid;
  ctx.coordinator = concat(opt.master_addr, ":", port);
  say(concat("fault tolerant: quorum service on ", ctx.coordinator, " (pid ", pid,
             "), --min-replicas ", opt.min_replicas, ", --max-restarts ", opt.max_restarts,
             " single-replica restarts"));
}

// `drain`: the job succeeded and other nodes may still have replicas restarting: the service
// ends by itself once none has been connected for a while (up to 60 s), telling late ones
// the job is DONE (they exit 0) instead of leaving them to find no service.
void stop_quorum_service(const GroupContext& ctx, bool drain) {
  if (ctx.service_pid <= 0) return;
  int st = 0;
  // Non-zero: it exited now, or it was reaped already (the group saw it end).
  for (int i = 0; drain && i < 600; ++i) {
    if (waitpid(ctx.service_pid, &st, WNOHANG) != 0) return;
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
  }
  if (waitpid(ctx.service_pid, &st, WNOHANG) != 0) return;
  kill(ctx.service_pid, SIGTERM);
  waitpid(ctx.service_pid, &st, 0);
}

}  // namespace

int pick_free_port(const std::string& addr) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) throw Error(concat("lockstep-run: socket: ", std::strerror(errno)));
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_port = 0;
  if (inet_pton(AF_INET, addr.c_str(), &sa.sin_addr) != 1) {
    close(s);
    throw Error(concat("lockstep-run: not an IPv4 address: '", addr, "'"));
  }
  socklen_t len = sizeof sa;
  if (bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) != 0 ||
      getsockname(s, reinterpret_cast<sockaddr*>(&sa), &len) != 0) {
    int e = errno;
    close(s);
    throw Error(concat("lockstep-run: cannot find a free port on ", addr, ": ", std::strerror(e)));
  }
  close(s);
  return ntohs(sa.sin_port);
}

bool port_is_free(int port) {
  int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (s < 0) return true;  // cannot tell: let rank 0 report it
  int one = 1;
  setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);  // as TCPStore does
  sockaddr_in sa = {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_ANY);
  sa.sin_port = htons(static_cast<uint16_t>(port));
  const bool free = bind(s, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0;
  close(s);
  return free;
}

std::string default_job_id(const LaunchOptions& opt) {
  if (!opt.rdzv_id.empty()) return opt.rdzv_id;
  if (opt.nnodes == 1) return make_job_id();
  // Every node must agree without talking: derive it from what they share.
  std::string id = "lockstep-" + opt.master_addr + "-" + std::to_string(opt.master_port);
  for (char& c : id)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-') c = '_';
  return id;
}

// The port of one start: --master-port 0 always gets a free one; a single-node job whose
// default port is taken (another job, a lingering store) falls back to a free one, as
// torchrun --standalone does, and says which.
int resolve_port(const LaunchOptions& opt) {
  if (opt.master_port == 0) return pick_free_port("127.0.0.1");
  if (opt.master_port_given || opt.nnodes > 1 || port_is_free(opt.master_port))
    return opt.master_port;
  const int port = pick_free_port("127.0.0.1");
  say(concat("port ", opt.master_port, " is in use; rendezvous on free port ", port,
             " instead (--master-port P to choose one)"));
  return port;
}

int run_launcher(const LaunchOptions& opt) {
  ensure_std_fds_open();
  if (opt.coordinator) {
    int port = 0;
    const int fd =
        listen_on("0.0.0.0", opt.coordinator_port >= 0 ? opt.coordinator_port : 29501, &port);
    say(concat("quorum service on port ", port, " for ", opt.replicas(),
               " replicas, --min-replicas ", opt.min_replicas, " (Ctrl-C ends it)"));
    return serve_quorum(fd, quorum_config(opt));
  }
  std::vector<int> logs = open_logs(opt);
  FdCloser closer{logs};
  if (!opt.launch_line.empty()) say(opt.launch_line);
  if (!opt.launch_note.empty()) say(opt.launch_note);
  EnvMap base = current_environment();
  const BlasTuning blas = blas_tuning(base);  // first: it forks, before any thread starts
  for (const auto& [k, v] : blas.env) base[k] = v;
  if (!blas.note.empty()) say(blas.note);
  if (should_note_omp(opt, base))
    say("setting OMP_NUM_THREADS=1 for each rank so " + std::to_string(opt.nproc_per_node) +
        " ranks do not oversubscribe the cores; set it yourself to tune it");
  GroupContext ctx;
  ctx.job_id = default_job_id(opt);
  if (opt.fault_tolerant) {
    if (opt.node_rank == 0)
      start_quorum_service(opt, ctx);  // before the signal pipe: the child keeps no handler
    else
      ctx.coordinator = concat(opt.master_addr, ":", coordinator_port(opt));
  }
  SignalPipe signals;
  ErrorDir errors(opt);
  if (opt.fault_tolerant) {  // one start; failed replicas restart alone inside it
    ctx.master_port = resolve_port(opt);
    Group group(opt, ctx, base, signals, logs, errors.path());
    const AttemptResult res = group.run();
    stop_quorum_service(ctx, res.exit_code == 0 && opt.nnodes > 1);
    return res.exit_code;
  }
  for (int attempt = 0;; ++attempt) {
    ctx.restart_count = attempt;
    // A fresh free port each start: the previous group's port may linger in TIME_WAIT.
    ctx.master_port = resolve_port(opt);
    if (attempt > 0) mark_restart_in_logs(logs, attempt);
    Group group(opt, ctx, base, signals, logs, errors.path());
    AttemptResult res = group.run();
    if (res.outcome == AttemptResult::Outcome::Success) {
      if (attempt > 0)
        say(concat("all ranks succeeded after ", attempt, attempt == 1 ? " restart" : " restarts"));
      return 0;
    }
    // A missing program or the user's Ctrl-C will not get better by restarting.
    if (res.outcome != AttemptResult::Outcome::RankFailed) return res.exit_code;
    if (attempt >= opt.max_restarts) {
      if (opt.max_restarts > 0)
        say(concat("giving up after ", attempt, " restarts (--max-restarts ", opt.max_restarts,
                   ")"));
      return res.exit_code;
    }
    say(concat("restarting all ", opt.nproc_per_node, " ranks (restart ", attempt + 1, " of ",
               opt.max_restarts, ")"));
  }
}

}  // namespace lockstep::launch
