// OpenBLAS's kernel choice for the ranks lockstep-run starts (lockstep/blas_core.h says why).
#include <dlfcn.h>
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cstdlib>
#include <cstring>

#include "lockstep/error.h"
#include "lockstep/launch/rank_env.h"

namespace lockstep::launch {
namespace {

constexpr const char* kCoreType = "OPENBLAS_CORETYPE";

// In the probe's child: load the OpenBLAS a libtorch program loads (the libblas.so.3 that
// Debian's alternatives point at, else libopenblas.so.0) and write the core it picked.
[[noreturn]] void report_core(int fd) {
  setenv("OPENBLAS_NUM_THREADS", "1", 1);  // no thread pool for a look-up
  unsetenv("OPENBLAS_VERBOSE");
  using CoreName = const char* (*)();
  for (const char* lib : {"libblas.so.3", "libopenblas.so.0"}) {
    void* h = dlopen(lib, RTLD_NOW | RTLD_LOCAL);
    if (!h) continue;
    if (auto f = reinterpret_cast<CoreName>(dlsym(h, "openblas_get_corename"))) {
      const char* name = f();
      if (name) (void)!write(fd, name, std::strlen(name));
      _exit(0);
    }
  }
  _exit(0);
}

std::string read_until_eof(int fd, int timeout_ms) {
  std::string out;
  char buf[64];
  pollfd p{fd, POLLIN, 0};
  while (poll(&p, 1, timeout_ms) == 1) {
    const ssize_t n = read(fd, buf, sizeof buf);
    if (n <= 0) break;
    out.append(buf, static_cast<size_t>(n));
  }
  return out;
}

}  // namespace

// In a child process, so the launcher itself never loads OpenBLAS (nor its threads) and
// a broken library cannot take it down. A few tens of ms, once per launch.
std::string probe_openblas_core() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) return "";
  const pid_t pid = fork();
  if (pid == 0) {
    close(fds[0]);
    unsetenv(kCoreType);  // the choice OpenBLAS makes on its own
    report_core(fds[1]);
  }
  close(fds[1]);
  std::string core = pid > 0 ? read_until_eof(fds[0], 10000) : "";
  close(fds[0]);
  if (pid > 0) {
    kill(pid, SIGKILL);  // harmless when it has exited; ends a hung probe
    waitpid(pid, nullptr, 0);
  }
  return core;
}

BlasTuning blas_tuning(const EnvMap& base, std::string_view detected_core, blas::Isa cpu,
                       bool amd) {
  BlasTuning t;
  if (base.count(kCoreType)) return t;  // the user's choice (lockstep::init() checks it)
  const auto better = blas::better_core(detected_core, cpu, amd);
  if (!better) return t;
  t.env[kCoreType] = *better;
  t.note =
      lockstep::detail::concat("OpenBLAS would run its ", detected_core, " kernels on this CPU (",
                               blas::isa_name(cpu), "); setting ", kCoreType, "=", *better,
                               " for each rank (set ", kCoreType, " yourself to choose)");
  return t;
}

BlasTuning blas_tuning(const EnvMap& base) {
  if (base.count(kCoreType)) return {};
  return blas_tuning(base, probe_openblas_core(), blas::cpu_isa(), blas::cpu_is_amd());
}

}  // namespace lockstep::launch
