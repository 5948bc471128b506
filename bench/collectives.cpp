// lockstep-bench collectives: allreduce, allgather and reduce_scatter on every backend,
// beside c10d's ProcessGroupGloo and OpenMPI's own collectives, measured in one run.
//
// The driver (no --worker) starts two jobs of this same program: one under lockstep-run
// (lockstep shm, shm allreduce on alloc_shared tensors, lockstep gloo, raw c10d gloo)
// and one under mpirun (lockstep mpi, raw MPI), then prints one table with the ratios
// and writes the CSV.
#include "bench_util.h"
#include "collectives_impls.h"
#include "commands.h"
#include "jobs.h"

#include <lockstep/lockstep.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <memory>
#include <sstream>

namespace lockstep::bench {
namespace {

struct Options {
  int nproc = 2;
  std::string sizes = "8B,4KiB,64KiB,1MiB,16MiB,64MiB,256MiB";
  std::string out = "bench-results/collectives.csv";
  std::string ops = "allreduce,allgather,reduce_scatter";
  // driver: which implementations to run (all if empty); worker: make_impls()'s list
  std::string impls;
  // worker
  bool worker = false;
  std::string csv;  // rank 0 appends its rows here
};

const char* const kOps[] = {"allreduce", "allgather", "reduce_scatter"};

bool listed(const std::string& csv, const std::string& item) {
  for (const std::string& x : split_csv(csv))
    if (x == item) return true;
  return false;
}

// The members of `all` that `filter` names (all of them if `filter` is empty).
std::string pick(const std::string& all, const std::string& filter) {
  std::string out;
  for (const std::string& x : split_csv(all))
    if (filter.empty() || listed(filter, x)) out += (out.empty() ? "" : ",") + x;
  return out;
}

// float32 elements for a buffer of `bytes`: divisible by P, at least P.
int64_t elements(int64_t bytes, int p) { return std::max<int64_t>(bytes / 4 / p * p, p); }

double bus_factor(const std::string& op, int p) {
  if (p == 1) return 0;  // nothing crosses a link
  return op == "allreduce" ? 2.0 * (p - 1) / p : double(p - 1) / p;
}

// ---------------------------------------------------------------- worker (one rank)

// Rank 0: one line on stdout, one row of the CSV (impl,op,bytes,ranks,seconds,algbw,busbw).
void report(std::ostream& csv, const std::string& impl, const std::string& op, int64_t n, int p,
            double t) {
  const double algbw = n * 4.0 / t / 1e9, busbw = algbw * bus_factor(op, p);
  // "<t> ms" is parsed by bench/multihost.sh; small sizes need the 4th decimal (0.1 us).
  std::printf("%-14s %-15s %8s  %11.4f ms  busbw %7.2f GB/s\n", impl.c_str(), op.c_str(),
              format_size(n * 4).c_str(), t * 1e3, busbw);
  std::fflush(stdout);
  if (csv)
    csv << impl << "," << op << "," << n * 4 << "," << p << "," << t << "," << algbw << "," << busbw
        << "\n";
}

int run_worker(const Options& o) {
  auto control = lockstep::init();  // for coordination only
  const int p = control->size();
  auto impls = make_impls(o.impls, *control);
  std::ofstream csv;
  if (control->rank() == 0 && !o.csv.empty()) csv.open(o.csv, std::ios::app);
  for (auto& impl : impls) {
    for (const std::string op : kOps) {
      if (!impl->supports(op) || !listed(o.ops, op)) continue;
      for (int64_t bytes : parse_sizes(o.sizes)) {
        const int64_t n = elements(bytes, p);
        const double t = impl->time(op, n);  // median seconds; verifies the result
        if (control->rank() == 0) report(csv, impl->name(), op, n, p, t);
      }
    }
  }
  control->barrier()->wait();
  return 0;
}

// ---------------------------------------------------------------- driver

// Echoes and runs one job; false if it failed.
bool run_job_command(const std::string& cmd, const char* what) {
  std::printf("\n$ %s\n", cmd.c_str());
  std::fflush(stdout);
  if (std::system(cmd.c_str()) == 0) return true;
  std::fprintf(stderr, "%s job failed\n", what);
  return false;
}

// The two jobs; their rank 0 append to `csv`. False if one failed.
bool run_jobs(const Options& o, const std::string& csv) {
  const std::string common =
      " collectives --worker --sizes " + o.sizes + " --ops " + o.ops + " --csv '" + csv + "'";
  bool ok = true;
  const std::string local = pick("shm,shm-shared,gloo,c10d-gloo", o.impls);
  if (!local.empty()) {
    const std::string cmd = std::string("'") + LOCKSTEP_RUN_PATH + "' --nproc-per-node " +
                            std::to_string(o.nproc) + " --master-port 0 " + self_command() +
                            common + " --impls " + local;
    ok = run_job_command(cmd, "lockstep-run");
  }
#ifdef LOCKSTEP_HAVE_MPI
  const std::string mpi = pick("mpi,mpi-raw", o.impls);
  if (!mpi.empty()) {
    const std::string cmd = std::string("'") + LOCKSTEP_MPIRUN_PATH + "' -np " +
                            std::to_string(o.nproc) + " " + self_command() + common + " --impls " +
                            mpi;
    ok = run_job_command(cmd, "mpirun") && ok;
  }
#endif
  return ok;
}

struct Row {
  std::string impl, op;
  int64_t bytes;
  double t, busbw;
};

// The rows of the workers' CSV by "impl|op|bytes".
class Rows {
 public:
  explicit Rows(const std::string& csv) {
    std::ifstream in(csv);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string f[7];
      for (auto& x : f) std::getline(ss, x, ',');
      rows_[f[0] + "|" + f[1] + "|" + f[2]] = {f[0], f[1], std::stoll(f[2]), std::stod(f[4]),
                                               std::stod(f[6])};
    }
  }
  const Row* get(const std::string& impl, const std::string& op, int64_t bytes) const {
    auto it = rows_.find(impl + "|" + op + "|" + std::to_string(bytes));
    return it == rows_.end() ? nullptr : &it->second;
  }

 private:
  std::map<std::string, Row> rows_;
};

std::string bandwidth(const Row* r) { return r ? fmt(r->busbw) : std::string("n/a"); }
std::string ratio(const Row* x, const Row* y) {
  return x && y && y->busbw > 0 ? fmt(x->busbw / y->busbw) + "x" : std::string("n/a");
}

// One table per op: every implementation's bus bandwidth and shm's ratio to the peers.
void print_table(const Options& o, const Rows& rows, const std::string& op) {
  // allreduce also in shared memory (the zero-copy path DDP's buckets take)
  const bool shared = op == "allreduce";
  std::vector<std::string> cols{op, "shm"};
  if (shared) cols.emplace_back("shm shared");
  for (const char* c : {"gloo", "mpi", "c10d-gloo", "MPI", "shm/c10d-gloo", "shm/MPI"})
    cols.emplace_back(c);
  if (shared) cols.emplace_back("shared/MPI");
  Table t(cols);
  for (int64_t bytes : parse_sizes(o.sizes)) {
    const int64_t b = elements(bytes, o.nproc) * 4;
    const Row* shm = rows.get("shm", op, b);
    const Row* sh = rows.get("shm-shared", op, b);
    const Row* peer_gloo = rows.get("c10d-gloo", op, b);
    const Row* peer_mpi = rows.get("mpi-raw", op, b);
    std::vector<std::string> row{format_size(bytes), bandwidth(shm)};
    if (shared) row.push_back(bandwidth(sh));
    for (const std::string& v :
         {bandwidth(rows.get("gloo", op, b)), bandwidth(rows.get("mpi", op, b)),
          bandwidth(peer_gloo), bandwidth(peer_mpi), ratio(shm, peer_gloo), ratio(shm, peer_mpi)})
      row.push_back(v);
    if (shared) row.push_back(ratio(sh, peer_mpi));
    t.add(row);
  }
  std::printf("\n%s", t.str().c_str());
}

std::string micros(const Row* r) { return r ? fmt(r->t * 1e6, 1) : std::string("n/a"); }
std::string time_ratio(const Row* x, const Row* y) {
  return x && y && y->t > 0 ? fmt(x->t / y->t) + "x" : std::string("n/a");
}

// Allreduce latency: the time of one op, and shm's ratio to OpenMPI's (lower is better).
void print_latency(const Options& o, const Rows& rows) {
  Table t({"allreduce", "shm", "shm shared", "gloo", "mpi", "c10d-gloo", "MPI", "shm/MPI",
           "shared/MPI"});
  for (int64_t bytes : parse_sizes(o.sizes)) {
    const int64_t b = elements(bytes, o.nproc) * 4;
    const Row* mpi = rows.get("mpi-raw", "allreduce", b);
    const Row* shm = rows.get("shm", "allreduce", b);
    const Row* sh = rows.get("shm-shared", "allreduce", b);
    t.add({format_size(b), micros(shm), micros(sh), micros(rows.get("gloo", "allreduce", b)),
           micros(rows.get("mpi", "allreduce", b)), micros(rows.get("c10d-gloo", "allreduce", b)),
           micros(mpi), time_ratio(shm, mpi), time_ratio(sh, mpi)});
  }
  std::printf("\n%s", t.str().c_str());
}

int run_driver(const Options& o) {
  const std::string tmp = o.out + ".tmp";
  std::remove(tmp.c_str());
  make_parent_dir(o.out);
  std::printf("memcpy bandwidth (1 core, 256 MiB): %.2f GB/s\n", memcpy_gbps(256 << 20));
  const bool ok = run_jobs(o, tmp);
  const Rows rows(tmp);
  std::rename(tmp.c_str(), o.out.c_str());
  std::printf("\nbus bandwidth, GB/s, %d ranks (float32; higher is better)\n", o.nproc);
  for (const std::string op : kOps)
    if (listed(o.ops, op)) print_table(o, rows, op);
  std::printf("\nallreduce latency, us per op, %d ranks (median; lower is better)\n", o.nproc);
  print_latency(o, rows);
  std::printf("\nCSV: %s\n", o.out.c_str());
  return ok ? 0 : 1;  // the tables show what the jobs measured before failing
}

}  // namespace

Command collectives_command(CLI::App& bench) {
  auto o = std::make_shared<Options>();
  CLI::App* app =
      bench.add_subcommand("collectives",
                           "allreduce, allgather and reduce_scatter on every backend, beside c10d "
                           "Gloo and OpenMPI");
  app->add_option("--nproc", o->nproc, "ranks")->check(CLI::PositiveNumber)->capture_default_str();
  app->add_option("--sizes", o->sizes, "buffer sizes, comma-separated (B, KiB, MiB, GiB)")
      ->check([](const std::string& s) {
        try {
          parse_sizes(s);
          return std::string();
        } catch (const std::exception&) {
          return "'" + s + "' is not a list of sizes like 4KiB,16MiB";
        }
      })
      ->capture_default_str();
  app->add_option("--out", o->out, "CSV file")->capture_default_str();
  app->add_option("--ops", o->ops, "collectives to time, comma-separated")->capture_default_str();
  app->add_option("--impls", o->impls,
                  "implementations to run, comma-separated (default all): shm, shm-shared, "
                  "gloo, c10d-gloo, mpi, mpi-raw");
  app->add_flag("--worker", o->worker)->group(kWorkerOnly);
  app->add_option("--csv", o->csv)->group(kWorkerOnly);
  return {app, [o] { return o->worker ? run_worker(*o) : run_driver(*o); }};
}

}  // namespace lockstep::bench
