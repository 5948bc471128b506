// Reading the launcher's environment: torchrun / lockstep-run, OpenMPI, Slurm (the
// names: lockstep/env_contract.h, shared with the writer, src/launch/rank_env.cpp).
#include <lockstep/comm/launch_env.h>
#include <lockstep/env_contract.h>
#include <lockstep/error.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>

namespace lockstep::comm {
namespace {

const char* get(const char* name) {
  const char* v = std::getenv(name);
  return (v && *v) ? v : nullptr;
}

int parse_int(const char* name, const char* value) {
  char* end = nullptr;
  errno = 0;
  long v = std::strtol(value, &end, 10);
  if (errno != 0 || end == value || *end != '\0' || v < 0 || v > (1L << 30))
    throw ConfigError(detail::concat("environment variable ", name, "='", value,
                                     "' is not a non-negative integer"));
  return static_cast<int>(v);
}

int int_or(const char* name, int fallback) {
  const char* v = get(name);
  return v ? parse_int(name, v) : fallback;
}

// The variables of one launcher, by role.
struct Contract {
  const char* launcher;
  const char* rank;
  const char* size;
  const char* local_rank;
  const char* local_size;
};

void check_consistent(const LaunchEnv& e, const Contract& c) {
  if (e.world_size < 1)
    throw ConfigError(
        detail::concat(c.size, "=", e.world_size, ": the world needs at least 1 rank"));
  if (e.rank >= e.world_size)
    throw ConfigError(
        detail::concat(c.rank, "=", e.rank, " is not below ", c.size, "=", e.world_size));
  if (e.local_world_size < 1 || e.local_world_size > e.world_size)
    throw ConfigError(detail::concat(c.local_size, "=", e.local_world_size, " must be in 1..",
                                     c.size, "=", e.world_size));
  if (e.local_rank >= e.local_world_size)
    throw ConfigError(detail::concat(c.local_rank, "=", e.local_rank, " is not below ",
                                     c.local_size, "=", e.local_world_size));
}

LaunchEnv read(const Contract& c) {
  LaunchEnv e;
  e.launcher = c.launcher;
  e.rank = parse_int(c.rank, get(c.rank));
  if (!get(c.size))
    throw ConfigError(
        detail::concat(c.rank, " is set but ", c.size,
                       " is not: a launcher sets both (or neither, for one process)"));
  e.world_size = parse_int(c.size, get(c.size));
  // Without local information, assume every rank shares this node (a hand-made launch).
  e.local_rank = int_or(c.local_rank, e.rank);
  e.local_world_size = int_or(c.local_size, e.world_size);
  check_consistent(e, c);
  return e;
}

// The token file must be a regular file that only its owner can read or write: a token
// others can read protects nothing.
std::string read_token_file(const char* path) {
  namespace n = lockstep::env;
  struct stat st {};
  if (stat(path, &st) != 0)
    throw ConfigError(
        detail::concat(n::kRdzvTokenFile, "='", path, "' cannot be read: ", std::strerror(errno)));
  if (!S_ISREG(st.st_mode) || (st.st_mode & 077) != 0 || st.st_uid != geteuid())
    throw ConfigError(detail::concat(n::kRdzvTokenFile, "='", path,
                                     "' must be a regular file of yours that only you can read "
                                     "(chmod 600 ",
                                     path, ")"));
  std::ifstream in(path);
  std::string token;
  std::getline(in, token);
  if (token.empty())
    throw ConfigError(
        detail::concat(n::kRdzvTokenFile, "='", path, "' is empty: its first line is the token"));
  return token;
}

}  // namespace

LaunchEnv LaunchEnv::from_environment() {
  namespace n = lockstep::env;
  LaunchEnv e;
  if (get(n::kRank)) {
    e = read({"torchrun", n::kRank, n::kWorldSize, n::kLocalRank, n::kLocalWorldSize});
    if (const char* l = get(n::kLauncher)) e.launcher = l;
  } else if (get(n::kOmpiRank)) {
    e = read({"mpirun", n::kOmpiRank, n::kOmpiSize, n::kOmpiLocalRank, n::kOmpiLocalSize});
  } else if (get(n::kPmiRank)) {
    e = read({"mpirun", n::kPmiRank, n::kPmiSize, n::kMpiLocalRankId, n::kMpiLocalNRanks});
  } else if (get(n::kSlurmProcId)) {
    e = read({"slurm", n::kSlurmProcId, n::kSlurmNTasks, n::kSlurmLocalId, n::kSlurmNTasksPerNode});
    if (int nodes = int_or(n::kSlurmNNodes, 1); nodes > 1 && !get(n::kSlurmNTasksPerNode))
      e.local_world_size = std::max(1, e.world_size / nodes);
    if (const char* host = get(n::kSlurmLaunchNodeIpAddr)) e.master_addr = host;
    if (const char* job = get(n::kSlurmJobId)) {
      e.job_id = std::string("slurm-") + job;
      // A port derived from the job id, so concurrent jobs on a node do not collide.
      e.master_port = 29500 + static_cast<int>(std::hash<std::string>{}(job) % 20000);
    }
  }
  if (const char* a = get(n::kMasterAddr)) e.master_addr = a;
  if (const char* p = get(n::kMasterPort)) {
    e.master_port = parse_int(n::kMasterPort, p);
    if (e.master_port < 1 || e.master_port > 65535)
      throw ConfigError(detail::concat(n::kMasterPort, "=", p, " is not a TCP port (1..65535)"));
  }
  if (const char* j = get(n::kJobId)) e.job_id = j;
  if (const char* t = get(n::kRdzvToken)) e.rdzv_token = t;
  if (const char* f = get(n::kRdzvTokenFile)) {
    if (!e.rdzv_token.empty())
      throw ConfigError(detail::concat("both ", n::kRdzvToken, " and ", n::kRdzvTokenFile,
                                       " are set: set only one"));
    e.rdzv_token = read_token_file(f);
  }
  return e;
}

}  // namespace lockstep::comm
