// Command-line parsing for lockstep-run. Pure: no I/O, throws UsageError.
#include "lockstep/launch/options.h"

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <map>

namespace lockstep::launch {
namespace {

using detail::concat;

long parse_long(const std::string& flag, const std::string& value, long lo, long hi,
                const char* expected) {
  errno = 0;
  char* end = nullptr;
  long v = std::strtol(value.c_str(), &end, 10);
  // Reject "", "3x", " 3", overflow: a typo must not silently become a different number.
  if (value.empty() || *end != '\0' || errno == ERANGE || value[0] == ' ' || v < lo || v > hi)
    throw UsageError(concat("lockstep-run: ", flag, " expects ", expected, ", got '", value, "'"));
  return v;
}

double parse_seconds(const std::string& flag, const std::string& value) {
  errno = 0;
  char* end = nullptr;
  double v = std::strtod(value.c_str(), &end);
  if (value.empty() || *end != '\0' || errno == ERANGE || !std::isfinite(v) || v < 0)
    throw UsageError(concat("lockstep-run: ", flag,
                            " expects a non-negative number of seconds, got '", value, "'"));
  return v;
}

using Setter = std::function<void(LaunchOptions&, const std::string& flag, const std::string&)>;

// One table for all value flags keeps the spelling, the check and the message together.
const std::map<std::string, Setter>& value_flags() {
  static const std::map<std::string, Setter> flags = {
      {"--nproc-per-node",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.nproc_per_node = int(parse_long(f, v, 1, 4096, "a positive integer"));
       }},
      {"--nnodes",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.nnodes = int(parse_long(f, v, 1, 1 << 20, "a positive integer"));
       }},
      {"--node-rank",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.node_rank = int(parse_long(f, v, 0, 1 << 20, "a non-negative integer"));
       }},
      {"--master-addr",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         if (v.empty()) throw UsageError(concat("lockstep-run: ", f, " expects a host name or address"));
         o.master_addr = v;
       }},
      {"--master-port",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.master_port = int(parse_long(f, v, 0, 65535, "a TCP port 0..65535 (0 = pick a free one)"));
       }},
      {"--log-dir",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         if (v.empty()) throw UsageError(concat("lockstep-run: ", f, " expects a directory"));
         o.log_dir = v;
       }},
      {"--max-restarts",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.max_restarts = int(parse_long(f, v, 0, 1000000, "a non-negative integer"));
       }},
      {"--grace-seconds",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.grace_seconds = parse_seconds(f, v);
       }},
  };
  return flags;
}

// torchrun users type --nproc_per_node; accept it as the same flag.
std::string canonical_flag(std::string name) {
  for (std::size_t i = 2; i < name.size(); ++i)
    if (name[i] == '_') name[i] = '-';
  return name;
}

void validate(const LaunchOptions& o) {
  if (o.node_rank >= o.nnodes)
    throw UsageError(concat("lockstep-run: --node-rank must be below --nnodes (", o.nnodes,
                            "), got ", o.node_rank));
  if (o.master_port == 0 && o.nnodes > 1)
    throw UsageError(
        "lockstep-run: --master-port 0 (pick a free port) only works with --nnodes 1: the other "
        "nodes could not know the port; give every node the same explicit --master-port");
  if (!o.help && o.program.empty())
    throw UsageError("lockstep-run: missing PROGRAM to run (see --help)");
}

}  // namespace

LaunchOptions parse_args(const std::vector<std::string>& args) {
  LaunchOptions opt;
  std::size_t i = 0;
  for (; i < args.size(); ++i) {
    const std::string& arg = args[i];
    if (arg == "--") { ++i; break; }
    if (arg.size() < 2 || arg[0] != '-') break;  // first non-option: the program
    if (arg == "--help" || arg == "-h") { opt.help = true; continue; }
    std::size_t eq = arg.find('=');
    std::string flag = canonical_flag(arg.substr(0, eq));
    auto it = value_flags().find(flag);
    if (it == value_flags().end())
      throw UsageError(concat("lockstep-run: unknown option '", arg.substr(0, eq),
                              "' (see --help; options go before PROGRAM)"));
    std::string value;
    if (eq != std::string::npos) {
      value = arg.substr(eq + 1);
    } else if (i + 1 < args.size()) {
      value = args[++i];
    } else {
      throw UsageError(concat("lockstep-run: ", flag, " requires a value"));
    }
    it->second(opt, flag, value);
  }
  opt.program.assign(args.begin() + long(i), args.end());
  validate(opt);
  return opt;
}

std::string usage_text() {
  return R"(usage: lockstep-run [options] PROGRAM [ARGS...]

Starts --nproc-per-node copies of PROGRAM with torchrun's environment (RANK, LOCAL_RANK,
WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK, MASTER_ADDR, MASTER_PORT, ...), prefixes their
output with [rank N], and stops the whole group when the first rank fails.

options (before PROGRAM; "--" also ends them; --flag value or --flag=value):
  --nproc-per-node N   ranks on this node (default 1)
  --nnodes M           number of nodes (default 1)
  --node-rank K        this node's index, 0..M-1 (default 0)
  --master-addr HOST   address of rank 0's node (default 127.0.0.1)
  --master-port P      rendezvous port (default 29500; 0 = pick a free one, single node only)
  --log-dir DIR        also write each rank's stdout+stderr to DIR/rank_N.log
  --max-restarts K     restart the whole group up to K times after a failure (default 0)
  --grace-seconds S    seconds between SIGTERM and SIGKILL when stopping ranks (default 5)
  --help               print this text

exit code: 0 when every rank succeeded; the first failed rank's exit code (128+signal if it
was killed); 127 if PROGRAM cannot be executed; 130/143 when interrupted by SIGINT/SIGTERM;
2 for a bad command line. See docs/launcher.md.
)";
}

}  // namespace lockstep::launch
