// lockstep-bench collectives: allreduce, allgather and reduce_scatter on every backend,
// beside c10d's ProcessGroupGloo and OpenMPI's own collectives, measured in one run.
//
// The driver (no --worker) starts two jobs of this same program: one under lockstep-run
// (lockstep shm, shm allreduce on alloc_shared tensors, lockstep gloo, raw c10d gloo)
// and one under mpirun (lockstep mpi, raw MPI), then prints one table with the ratios
// and writes the CSV. Each job also measures the memory roofline (collectives_roofline.h)
// at every size from 1 MiB, beside its collectives, so each implementation's time is set
// against what the memory allowed in the same minutes.
#include "bench_util.h"
#include "collectives_impls.h"
#include "collectives_roofline.h"
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
#include <tuple>

#include <sched.h>

namespace lockstep::bench {
namespace {

struct Options {
  int nproc = 2;
  std::string sizes = "8B,4KiB,64KiB,1MiB,16MiB,64MiB,256MiB";
  std::string out = "bench-results/collectives.csv";
  std::string ops = "allreduce,allgather,reduce_scatter";
  // driver: which implementations to run (all if empty); worker: make_impls()'s list
  std::string impls;
  // Pin each rank to a core of its own (rank r on the r-th CPU this process may use).
  bool separate_cores = false;
  // worker
  bool worker = false;
  std::string csv;       // rank 0 appends its rows here
  std::string roofline;  // the impl name of this job's STREAM rows ("" = none)
};

// The roofline is measured from this size up; below it latency, not memory, bounds.
constexpr int64_t kRooflineMinBytes = int64_t{1} << 20;

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

// Rank 0: one line on stdout, one row of the CSV
// (impl,op,bytes,ranks,seconds,algbw,busbw,best_seconds; seconds is the median).
void report(std::ostream& csv, const std::string& impl, const std::string& op, int64_t n, int p,
            double t, double best) {
  const double algbw = n * 4.0 / t / 1e9, busbw = algbw * bus_factor(op, p);
  // "<t> ms" is parsed by bench/multihost.sh; small sizes need the 4th decimal (0.1 us).
  std::printf("%-14s %-15s %8s  %11.4f ms  busbw %7.2f GB/s\n", impl.c_str(), op.c_str(),
              format_size(n * 4).c_str(), t * 1e3, busbw);
  std::fflush(stdout);
  if (csv)
    csv << impl << "," << op << "," << n * 4 << "," << p << "," << t << "," << algbw << "," << busbw
        << "," << best << "\n";
}

// Pins this process to the (rank mod count)-th CPU of its current affinity mask.
void pin_to_own_core(int rank) {
  cpu_set_t allowed;
  if (sched_getaffinity(0, sizeof(allowed), &allowed) != 0) return;
  const int count = CPU_COUNT(&allowed);
  for (int cpu = 0, seen = 0; cpu < CPU_SETSIZE && count > 0; ++cpu) {
    if (!CPU_ISSET(cpu, &allowed) || seen++ != rank % count) continue;
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(cpu, &one);
    if (sched_setaffinity(0, sizeof(one), &one) != 0) std::perror("sched_setaffinity");
    return;
  }
}

// The STREAM kernels at `bytes` on every rank at once; rank 0 reports them as rows of
// impl `name`, op "copy" / "rmw" (GB/s per rank in the bandwidth columns).
void report_stream(std::ostream& csv, comm::ProcessGroup& control, const std::string& name,
                   int64_t bytes) {
  const StreamResult bw = measure_stream(control, bytes);
  if (control.rank() != 0) return;
  std::printf(
      "%-14s STREAM %8s  copy %7.2f GB/s (best %.2f)  a+=b %7.2f GB/s (best %.2f), per rank, %d "
      "at once\n",
      name.c_str(), format_size(bytes).c_str(), bw.median.copy, bw.best.copy, bw.median.rmw,
      bw.best.rmw, control.size());
  std::fflush(stdout);
  if (!csv) return;
  // GB/s in the bandwidth columns, the best run's GB/s in the last
  for (const auto& [op, med, best] : {std::tuple{"copy", bw.median.copy, bw.best.copy},
                                      std::tuple{"rmw", bw.median.rmw, bw.best.rmw}})
    csv << name << "," << op << "," << bytes << "," << control.size() << ",0," << med << "," << med
        << "," << best << "\n";
}

// Size by size, so the roofline and every implementation of one size run minutes apart
// at most, under the same load.
int run_worker(const Options& o) {
  auto control = lockstep::init();  // for coordination only
  const int p = control->size();
  if (o.separate_cores) pin_to_own_core(control->rank());
  auto impls = make_impls(o.impls, *control);
  std::ofstream csv;
  if (control->rank() == 0 && !o.csv.empty()) csv.open(o.csv, std::ios::app);
  for (int64_t bytes : parse_sizes(o.sizes)) {
    const int64_t n = elements(bytes, p);
    if (!o.roofline.empty() && n * 4 >= kRooflineMinBytes)
      report_stream(csv, *control, o.roofline, n * 4);
    for (auto& impl : impls) {
      for (const std::string op : kOps) {
        if (!impl->supports(op) || !listed(o.ops, op)) continue;
        const double t = impl->time(op, n);  // median seconds; verifies the result
        if (control->rank() == 0) report(csv, impl->name(), op, n, p, t, impl->best());
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
  const std::string common = " collectives --worker --sizes " + o.sizes + " --ops " + o.ops +
                             " --csv '" + csv + "'" + (o.separate_cores ? " --separate-cores" : "");
  bool ok = true;
  const std::string local = pick("shm,shm-shared,gloo,c10d-gloo", o.impls);
  if (!local.empty()) {
    const std::string cmd = std::string("'") + LOCKSTEP_RUN_PATH + "' --nproc-per-node " +
                            std::to_string(o.nproc) + " --master-port 0 " + self_command() +
                            common + " --impls " + local + " --roofline stream";
    ok = run_job_command(cmd, "lockstep-run");
  }
#ifdef LOCKSTEP_HAVE_MPI
  const std::string mpi = pick("mpi,mpi-raw", o.impls);
  if (!mpi.empty()) {
    const std::string cmd = std::string("'") + LOCKSTEP_MPIRUN_PATH + "' -np " +
                            std::to_string(o.nproc) + " " + self_command() + common + " --impls " +
                            mpi + " --roofline stream-mpi";
    ok = run_job_command(cmd, "mpirun") && ok;
  }
#endif
  return ok;
}

struct Row {
  std::string impl, op;
  int64_t bytes;
  double t, busbw;
  double best;  // collectives: the best sample's seconds; STREAM rows: the best run's GB/s
};

// The rows of the workers' CSV by "impl|op|bytes".
class Rows {
 public:
  explicit Rows(const std::string& csv) {
    std::ifstream in(csv);
    std::string line;
    while (std::getline(in, line)) {
      std::stringstream ss(line);
      std::string f[8];
      for (auto& x : f) std::getline(ss, x, ',');
      rows_[f[0] + "|" + f[1] + "|" + f[2]] = {f[0],
                                               f[1],
                                               std::stoll(f[2]),
                                               std::stod(f[4]),
                                               std::stod(f[6]),
                                               f[7].empty() ? 0 : std::stod(f[7])};
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
  // allreduce and reduce_scatter also from shared memory (their zero-copy paths)
  const bool shared = op != "allgather";
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

std::string percent(double x) { return x > 0 ? fmt(100 * x, 0) + "%" : std::string("n/a"); }

// The job's STREAM bandwidths at `bytes` (0 where it measured none), at its median run
// or at its best.
StreamBandwidth stream_of(const Rows& rows, const std::string& name, int64_t bytes, bool best) {
  const Row* copy = rows.get(name, "copy", bytes);
  const Row* rmw = rows.get(name, "rmw", bytes);
  auto gbps = [best](const Row* r) { return r ? (best ? r->best : r->busbw) : 0; };
  return {gbps(copy), gbps(rmw)};
}

// "median% / best%": the bound at the job's median STREAM figure over the median time,
// and at its best STREAM run over the best sample (STREAM's own way to report).
std::string fractions(const Rows& rows, const std::string& impl, const std::string& op, int64_t b,
                      int p, const std::string& stream) {
  const Row* r = rows.get(impl, op, b);
  if (!r || r->t <= 0) return "n/a";
  const double med = bound_seconds(op, b, p, stream_of(rows, stream, b, false)) / r->t;
  const double best =
      r->best > 0 ? bound_seconds(op, b, p, stream_of(rows, stream, b, true)) / r->best : 0;
  return percent(med) + " / " + percent(best);
}

// Per op and size from 1 MiB: the bound (minimum traffic at the STREAM bandwidth of the
// job that ran the implementation) and each implementation's fraction of it.
void print_roofline(const Options& o, const Rows& rows) {
  Table t({"op", "size", "min traffic/rank", "kernel", "GB/s/rank", "bound ms", "shm", "shm shared",
           "c10d-gloo", "MPI"});
  for (const std::string op : kOps) {
    if (!listed(o.ops, op)) continue;
    for (int64_t bytes : parse_sizes(o.sizes)) {
      const int64_t b = elements(bytes, o.nproc) * 4;
      if (b < kRooflineMinBytes) continue;
      const StreamBandwidth local = stream_of(rows, "stream", b, false);
      const bool copy = std::string(bound_kernel(op)) == "copy";
      const int p = o.nproc;
      t.add({op, format_size(b), format_size(static_cast<int64_t>(min_traffic_bytes(op, b, p))),
             bound_kernel(op), fmt(copy ? local.copy : local.rmw),
             fmt(bound_seconds(op, b, p, local) * 1e3, 3),
             fractions(rows, "shm", op, b, p, "stream"),
             fractions(rows, "shm-shared", op, b, p, "stream"),
             fractions(rows, "c10d-gloo", op, b, p, "stream"),
             fractions(rows, "mpi-raw", op, b, p, "stream-mpi")});
    }
  }
  std::printf(
      "\nmemory roofline, %d ranks: minimum memory traffic per rank (read + written, STREAM "
      "counting), the STREAM bandwidth per rank with all %d running at once (median run), the "
      "time that traffic takes at it; each implementation's bound time / its time, "
      "median / best (100%% = at the roofline; MPI against the mpirun job's own STREAM)\n%s",
      o.nproc, o.nproc, t.str().c_str());
}

int run_driver(const Options& o) {
  const std::string tmp = o.out + ".tmp";
  std::remove(tmp.c_str());
  make_parent_dir(o.out);
  const bool ok = run_jobs(o, tmp);
  const Rows rows(tmp);
  std::rename(tmp.c_str(), o.out.c_str());
  std::printf("\nbus bandwidth, GB/s, %d ranks (float32; higher is better)\n", o.nproc);
  for (const std::string op : kOps)
    if (listed(o.ops, op)) print_table(o, rows, op);
  std::printf("\nallreduce latency, us per op, %d ranks (median; lower is better)\n", o.nproc);
  print_latency(o, rows);
  print_roofline(o, rows);
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
  app->add_flag("--separate-cores", o->separate_cores,
                "pin each rank to a core of its own (rank r on the r-th CPU it may use)");
  app->add_flag("--worker", o->worker)->group(kWorkerOnly);
  app->add_option("--roofline", o->roofline)->group(kWorkerOnly);
  app->add_option("--csv", o->csv)->group(kWorkerOnly);
  return {app, [o] { return o->worker ? run_worker(*o) : run_driver(*o); }};
}

}  // namespace lockstep::bench
