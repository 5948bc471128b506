// Command-line parsing for lockstep-run, with CLI11 (as every lockstep program). Pure: no
// I/O, throws UsageError.
#include "lockstep/launch/options.h"

#include "lockstep/launch/cli.h"
#include "lockstep/launch/scheduler_env.h"

#include <CLI/CLI.hpp>

#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <functional>
#include <memory>

namespace lockstep::launch {
namespace {

using lockstep::detail::concat;

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

struct ValueFlag {
  const char* name;  // the spelling messages use; torchrun's underscore one is an alias
  Setter set;        // checks the value, names the flag in its UsageError
};

// One table for all value flags keeps the spelling, the check and the message together.
const std::vector<ValueFlag>& value_flags() {
  static const std::vector<ValueFlag> flags = {
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
         if (v.empty())
           throw UsageError(concat("lockstep-run: ", f, " expects a host name or address"));
         o.master_addr = v;
       }},
      {"--master-port",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.master_port =
             int(parse_long(f, v, 0, 65535, "a TCP port 0..65535 (0 = pick a free one)"));
         o.master_port_given = true;
       }},
      {"--rdzv-id",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         // It names shared-memory segments and files: keep it to safe characters.
         bool ok = !v.empty() && v.size() <= 64;
         for (char c : v)
           ok = ok && ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.');
         if (!ok)
           throw UsageError(concat("lockstep-run: ", f,
                                   " expects 1-64 characters from A-Z a-z 0-9 . _ -, got '", v,
                                   "'"));
         o.rdzv_id = v;
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
      {"--grace-seconds", [](LaunchOptions& o, const std::string& f,
                             const std::string& v) { o.grace_seconds = parse_seconds(f, v); }},
      {"--notice-seconds", [](LaunchOptions& o, const std::string& f,
                              const std::string& v) { o.notice_seconds = parse_seconds(f, v); }},
      {"--min-replicas",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.min_replicas = int(parse_long(f, v, 1, 1 << 20, "a positive integer"));
       }},
      {"--replica-size",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.replica_size = int(parse_long(f, v, 1, 1 << 20, "a positive integer"));
       }},
      {"--coordinator-port",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.coordinator_port = int(parse_long(f, v, 0, 65535, "a TCP port 0..65535"));
       }},
      {"--heartbeat-timeout",
       [](LaunchOptions& o, const std::string& f, const std::string& v) {
         o.heartbeat_timeout = parse_seconds(f, v);
         if (o.heartbeat_timeout < 0.5)
           throw UsageError(concat("lockstep-run: ", f, " expects at least 0.5 s, got '", v, "'"));
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

// "--nproc-per-node" -> "--nproc_per_node" (the alias CLI11 is told about).
std::string underscore_spelling(std::string name) {
  for (std::size_t i = 2; i < name.size(); ++i)
    if (name[i] == '-') name[i] = '_';
  return name;
}

const ValueFlag* find_value_flag(const std::string& arg) {
  const std::string flag = canonical_flag(arg.substr(0, arg.find('=')));
  for (const ValueFlag& f : value_flags())
    if (flag == f.name) return &f;
  return nullptr;
}

// CLI11 with the launcher's rules: prefix_command() stops at the first non-option (or
// "--") and leaves it and everything after it to the program. Each value flag is checked
// as it is parsed (trigger_on_parse), in command-line order, so a repeated flag behaves
// like the last one given and every occurrence is checked. Unknown options are left in
// remaining() too; the caller rejects them.
std::unique_ptr<CLI::App> make_app(LaunchOptions& opt) {
  auto app = std::make_unique<CLI::App>("lockstep-run", "lockstep-run");
  app->set_help_flag();  // --help is an option like the others: main prints usage_text()
  app->prefix_command();
  app->add_flag("-h,--help", opt.help);
  app->add_flag("--fault-tolerant,--fault_tolerant", opt.fault_tolerant);
  app->add_flag("--coordinator", opt.coordinator);
  for (const ValueFlag& f : value_flags()) {
    app->add_option_function<std::string>(concat(f.name, ",", underscore_spelling(f.name)),
                                          [&opt, &f](const std::string& v) {
                                            f.set(opt, f.name, v);
                                            opt.set_by[f.name] = f.name;
                                          })
        ->trigger_on_parse();
  }
  return app;
}

// CLI11 reads a flag's value from the next argument when "--flag=" gives an empty one;
// the launcher's rule is that "--flag=" is an empty value, which no flag accepts.
void reject_empty_values(const std::vector<std::string>& options, LaunchOptions& opt) {
  for (const std::string& arg : options) {
    if (arg.size() < 3 || arg.compare(0, 2, "--") != 0 || arg.back() != '=') continue;
    if (arg.find('=') != arg.size() - 1) continue;
    if (const ValueFlag* f = find_value_flag(arg)) f->set(opt, f->name, "");
  }
}

void validate(const LaunchOptions& o) {
  if (o.node_rank >= o.nnodes)
    throw UsageError(concat("lockstep-run: --node-rank must be below --nnodes (", o.nnodes,
                            "), got ", o.node_rank));
  if (o.master_port == 0 && o.nnodes > 1)
    throw UsageError(
        "lockstep-run: --master-port 0 (pick a free port) only works with --nnodes 1: the other "
        "nodes could not know the port; give every node the same explicit --master-port");
  if (o.coordinator && !o.program.empty())
    throw UsageError(
        "lockstep-run: --coordinator runs the quorum service alone; it takes no "
        "PROGRAM (start the replicas with --fault-tolerant)");
  if (!o.help && !o.coordinator && o.program.empty())
    throw UsageError("lockstep-run: missing PROGRAM to run (see --help)");
  if (o.replica_size > 1 && !o.fault_tolerant)
    throw UsageError(
        "lockstep-run: --replica-size groups ranks into replicas of a fault-tolerant job; "
        "add --fault-tolerant (a job without it has no replicas)");
  if (o.nproc_per_node % o.replica_size != 0)
    throw UsageError(concat("lockstep-run: --replica-size ", o.replica_size,
                            " must divide --nproc-per-node ", o.nproc_per_node,
                            ": a replica's ranks run on one node"));
  if (o.fault_tolerant && o.min_replicas > o.replicas())
    throw UsageError(concat("lockstep-run: --min-replicas ", o.min_replicas,
                            " is more than the job's ", o.replicas(), " replicas"));
}

// torchrun's PET_* variables, each the default of one flag. "auto", "cpu" and "gpu" for
// PET_NPROC_PER_NODE are torchrun's device counts: lockstep-run needs a number.
const std::pair<const char*, const char*> kPetFlags[] = {{"PET_NNODES", "--nnodes"},
                                                         {"PET_NPROC_PER_NODE", "--nproc-per-node"},
                                                         {"PET_NODE_RANK", "--node-rank"},
                                                         {"PET_MASTER_ADDR", "--master-addr"},
                                                         {"PET_MASTER_PORT", "--master-port"},
                                                         {"PET_RDZV_ID", "--rdzv-id"},
                                                         {"PET_MAX_RESTARTS", "--max-restarts"}};

// Applies PET_* through the flags' own checks; returns the complaint about a
// PET_NPROC_PER_NODE that is no number, which only matters without --nproc-per-node.
std::string apply_pet(const std::map<std::string, std::string>& env, LaunchOptions& opt) {
  std::string nproc_problem;
  for (const auto& [var, flag] : kPetFlags) {
    auto it = env.find(var);
    if (it == env.end() || it->second.empty()) continue;
    std::string v = it->second;
    // An elastic PyTorchJob writes min:max; a fixed job (min = max) is fine.
    if (const auto colon = v.find(':');
        std::string(var) == "PET_NNODES" && colon != std::string::npos) {
      if (v.substr(0, colon) != v.substr(colon + 1))
        throw UsageError(concat("lockstep-run: PET_NNODES='", v,
                                "' is an elastic range; "
                                "lockstep-run runs a fixed number of nodes: give the job's "
                                "elasticPolicy minReplicas = maxReplicas, or --nnodes"));
      v = v.substr(0, colon);
    }
    if (std::string(var) == "PET_NPROC_PER_NODE" &&
        v.find_first_not_of("0123456789") != std::string::npos) {
      nproc_problem = concat("lockstep-run: PET_NPROC_PER_NODE='", v,
                             "' is a device class; "
                             "lockstep-run needs a number: set numProcPerNode (TrainJob) or "
                             "nprocPerNode (PyTorchJob) to an integer, or pass --nproc-per-node");
      continue;
    }
    find_value_flag(flag)->set(opt, var, v);
    opt.set_by[flag] = concat(var, "=", it->second);
  }
  return nproc_problem;
}

LaunchOptions parse_onto(const std::vector<std::string>& args, LaunchOptions start);

}  // namespace

LaunchOptions parse_args(const std::vector<std::string>& args,
                         const std::map<std::string, std::string>& env) {
  LaunchOptions opt;
  const SchedulerContract sched = read_scheduler(env);
  apply_scheduler(sched, opt);
  const std::string nproc_problem = apply_pet(env, opt);
  LaunchOptions parsed = parse_onto(args, std::move(opt));
  if (!nproc_problem.empty() && !parsed.help && parsed.set_by.count("--nproc-per-node") == 0)
    throw UsageError(nproc_problem);
  check_scheduler(sched, parsed);
  validate(parsed);
  parsed.launch_line = describe_launch(sched, parsed);
  parsed.launch_note = sched.note;
  return parsed;
}

LaunchOptions parse_args(const std::vector<std::string>& args) {
  LaunchOptions opt = parse_onto(args, LaunchOptions{});
  validate(opt);
  return opt;
}

namespace {

// The command line over start (the defaults, or what the environment gave).
LaunchOptions parse_onto(const std::vector<std::string>& args, LaunchOptions start) {
  LaunchOptions opt = std::move(start);
  auto app = make_app(opt);
  std::vector<std::string> reversed(args.rbegin(), args.rend());  // CLI11 pops from the back
  try {
    app->parse(reversed);
  } catch (const CLI::ArgumentMismatch&) {
    // Only the last argument can run out of values: "... --nproc-per-node".
    const ValueFlag* f = args.empty() ? nullptr : find_value_flag(args.back());
    throw UsageError(concat("lockstep-run: ", f ? f->name : args.back(), " requires a value"));
  } catch (const CLI::ParseError& e) {
    throw UsageError(concat("lockstep-run: ", e.what(), " (see --help)"));
  }
  std::vector<std::string> rest = app->remaining();
  // What CLI11 consumed are the launcher's options; the rest starts with "--", an unknown
  // option, or PROGRAM.
  reject_empty_values(std::vector<std::string>(args.begin(), args.end() - long(rest.size())), opt);
  if (!rest.empty() && rest.front() == "--") {
    rest.erase(rest.begin());
  } else if (!rest.empty() && rest.front().size() >= 2 && rest.front()[0] == '-') {
    const std::string flag = rest.front().substr(0, rest.front().find('='));
    std::vector<std::string> known = {"--help", "--fault-tolerant", "--coordinator"};
    for (const ValueFlag& f : value_flags()) known.emplace_back(f.name);
    const std::string near = nearest_flag(flag, known);
    throw UsageError(concat("lockstep-run: unknown option '", flag, "'",
                            near.empty() ? std::string() : "; did you mean '" + near + "'?",
                            " (see --help; options go before PROGRAM)"));
  }
  opt.program = std::move(rest);
  return opt;
}

}  // namespace

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
  --master-port P      rendezvous port (default 29500; 0 = pick a free one, single node only;
                       a single-node job whose default port is taken uses a free one)
  --rdzv-id ID         job id (LOCKSTEP_JOB_ID), the same on every node; ranks of another
                       job that reach this job's store are refused (default: random on one
                       node, derived from --master-addr:--master-port on several)
  --log-dir DIR        also write each rank's stdout+stderr to DIR/rank_N.log
  --max-restarts K     restart the whole group up to K times after a failure (default 0)
  --notice-seconds S   after a rank fails, time the others get to notice it and exit with
                       their own error before they are sent SIGTERM (default 3)
  --grace-seconds S    seconds between SIGTERM and SIGKILL when stopping ranks (default 5)
  --fault-tolerant     each rank (or --replica-size ranks) is a replica (lockstep::ft::Manager):
                       a failed one is restarted alone (--max-restarts in all) while the
                       others go on; node 0 hosts the quorum service (docs/fault-tolerance.md)
  --replica-size S     with --fault-tolerant: S ranks per replica (an HSDP shard group), each
                       replica a small job of its own (RANK 0..S-1); a failed rank
                       restarts its whole replica (default 1)
  --min-replicas M     stop the job when fewer than M replicas remain (default 1)
  --coordinator-port P the quorum service's port (default: a free one on one node,
                       --master-port + 1 on several)
  --heartbeat-timeout S  a replica silent this long is lost (default 3)
  --coordinator        run the quorum service alone (no PROGRAM), for replicas started
                       elsewhere with LOCKSTEP_COORDINATOR=HOST:PORT
  --help               print this text

Under a scheduler the defaults come from its environment (docs/schedulers.md): srun with
one task per node gives --nnodes, --node-rank, --master-addr (the first host of the step's
node list), --master-port and --rdzv-id; a Kubeflow PyTorchJob pod gives --node-rank (RANK),
--master-addr and --master-port; PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,
PET_MASTER_ADDR, PET_MASTER_PORT, PET_RDZV_ID, PET_MAX_RESTARTS (TrainJob, torchrun) are
the defaults of the flags of the same names. Flags win, except against a Slurm step's
facts. lockstep-run says in one line what it took.

exit code: 0 when every rank succeeded; the first failed rank's exit code (128+signal if it
was killed); 127 if PROGRAM cannot be executed; 130/143 when interrupted by SIGINT/SIGTERM;
2 for a bad command line. See docs/launcher.md.
)";
}

}  // namespace lockstep::launch
