#include "jobs.h"

#include <lockstep/launch/rank_env.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdio>
#include <cstring>
#include <filesystem>

namespace lockstep::bench {

void report_result(int rank, const std::string& key, double value) {
  if (rank == 0) std::printf("RESULT %s %.6f\n", key.c_str(), value);
  std::fflush(stdout);
}

std::map<std::string, double> run_job(const std::string& cmd) {
  std::printf("$ %s\n", cmd.c_str());
  std::fflush(stdout);
  std::map<std::string, double> results;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) return results;
  char line[1024];
  while (std::fgets(line, sizeof line, p)) {
    char key[128];
    double v;
    const char* at = std::strstr(line, "RESULT ");  // lockstep-run prefixes "[rank 0] "
    if (at && std::sscanf(at, "RESULT %127s %lf", key, &v) == 2)
      results[key] = v;
    else
      std::fputs(line, stdout);
  }
  if (pclose(p) != 0) std::fprintf(stderr, "job failed: %s\n", cmd.c_str());
  return results;
}

JobOutput run_job_quiet(const std::string& cmd) {
  JobOutput out;
  FILE* p = popen((cmd + " 2>&1").c_str(), "r");
  if (!p) {
    out.status = -1;
    return out;
  }
  char line[4096];
  while (std::fgets(line, sizeof line, p)) {
    char key[128];
    double v;
    const char* at = std::strstr(line, "RESULT ");
    if (at && std::sscanf(at, "RESULT %127s %lf", key, &v) == 2)
      out.results[key] = v;
    else
      out.output += line;
  }
  out.status = pclose(p);
  return out;
}

std::string rank_environment() {
  std::string env = "OMP_NUM_THREADS=1 OPENBLAS_NUM_THREADS=1 MKL_NUM_THREADS=1 ";
  for (const auto& [k, v] : launch::malloc_defaults({}))
    env.append(k).append("=").append(v).append(" ");
  return env + blas_environment();
}

std::string blas_environment() {
  // Probed once per process, and only by the driver (a worker never builds a command).
  static const launch::BlasTuning blas = launch::blas_tuning(launch::current_environment());
  std::string env;
  for (const auto& [k, v] : blas.env) env.append(k).append("=").append(v).append(" ");
  return env;
}

std::string self_command() {
  char buf[4096];
  const ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return "'" + (n > 0 ? std::string(buf, size_t(n)) : std::string("lockstep-bench")) + "'";
}

int free_port() {
  const int fd = socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in sa{};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof sa;
  int port = 29511;
  if (fd >= 0 && bind(fd, reinterpret_cast<sockaddr*>(&sa), sizeof sa) == 0 &&
      getsockname(fd, reinterpret_cast<sockaddr*>(&sa), &len) == 0)
    port = ntohs(sa.sin_port);
  if (fd >= 0) close(fd);
  return port;
}

void make_parent_dir(const std::string& file) {
  const auto dir = std::filesystem::path(file).parent_path();
  if (!dir.empty()) std::filesystem::create_directories(dir);
}

}  // namespace lockstep::bench
