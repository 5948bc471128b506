// lockstep-bench collectives: allreduce, allgather and reduce_scatter on every backend,
// beside c10d's ProcessGroupGloo and OpenMPI's own collectives, measured in one run.
//
// The driver (no --worker) starts two jobs of this same program: one under lockstep-run
// (lockstep shm, shm allreduce on alloc_shared tensors, lockstep gloo, raw c10d gloo)
// and one under mpirun (lockstep mpi, raw MPI), then prints one table with the ratios
// and writes the CSV.
#include "bench_util.h"
#include "collectives_impls.h"

#include <lockstep/lockstep.h>

#include <ATen/ATen.h>

#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <map>
#include <sstream>

namespace lockstep::bench {
namespace {

struct Args {
  bool worker = false;
  std::string impls;
  std::string csv;
  std::string out = "bench-results/collectives.csv";
  std::string sizes = "4KiB,64KiB,1MiB,16MiB,64MiB,256MiB";
  int nproc = 2;
};

Args parse(int argc, char** argv) {
  Args a;
  for (int i = 0; i < argc; ++i) {
    std::string k = argv[i];
    auto val = [&]() -> std::string {
      if (i + 1 >= argc) throw std::invalid_argument(k + " needs a value");
      return argv[++i];
    };
    if (k == "--worker") a.worker = true;
    else if (k == "--impls") a.impls = val();
    else if (k == "--csv") a.csv = val();
    else if (k == "--out") a.out = val();
    else if (k == "--sizes") a.sizes = val();
    else if (k == "--nproc") a.nproc = std::stoi(val());
    else throw std::invalid_argument("unknown option " + k +
                                     " (collectives [--nproc N] [--sizes 4KiB,1MiB,...] [--out FILE])");
  }
  return a;
}

double bus_factor(const std::string& op, int p) {
  if (p == 1) return 0;  // nothing crosses a link
  return op == "allreduce" ? 2.0 * (p - 1) / p : double(p - 1) / p;
}

int run_worker(const Args& a) {
  auto control = lockstep::init();  // for coordination only
  const int p = control->size();
  auto impls = make_impls(a.impls, *control);
  std::ofstream csv;
  if (control->rank() == 0 && !a.csv.empty()) csv.open(a.csv, std::ios::app);
  for (auto& impl : impls) {
    for (const std::string op : {"allreduce", "allgather", "reduce_scatter"}) {
      if (!impl->supports(op)) continue;
      for (int64_t bytes : parse_sizes(a.sizes)) {
        const int64_t n = bytes / 4 / p * p;  // float32 elements, divisible by P
        double t = impl->time(op, n);         // median seconds; verifies the result
        if (control->rank() != 0) continue;
        const double algbw = n * 4.0 / t / 1e9;
        std::printf("%-14s %-15s %8s  %10.3f ms  busbw %7.2f GB/s\n", impl->name().c_str(),
                    op.c_str(), format_size(n * 4).c_str(), t * 1e3, algbw * bus_factor(op, p));
        std::fflush(stdout);
        if (csv) csv << impl->name() << "," << op << "," << n * 4 << "," << p << "," << t << ","
                     << algbw << "," << algbw * bus_factor(op, p) << "\n";
      }
    }
  }
  control->barrier()->wait();
  return 0;
}

std::string self_exe() {
  char buf[4096];
  ssize_t n = readlink("/proc/self/exe", buf, sizeof buf - 1);
  return n > 0 ? std::string(buf, n) : "lockstep-bench";
}

struct Row {
  std::string impl, op;
  int64_t bytes;
  double t, busbw;
};

int run_driver(const Args& a) {
  const std::string tmp = a.out + ".tmp";
  std::remove(tmp.c_str());
  if (auto slash = a.out.rfind('/'); slash != std::string::npos)
    std::system(("mkdir -p '" + a.out.substr(0, slash) + "'").c_str());
  std::printf("memcpy bandwidth (1 core, 256 MiB): %.2f GB/s\n", memcpy_gbps(256 << 20));
  const std::string common = " collectives --worker --sizes " + a.sizes + " --csv '" + tmp + "'";
  const std::string self = "'" + self_exe() + "'";
  std::string cmd = std::string("'") + LOCKSTEP_RUN_PATH + "' --nproc-per-node " +
                    std::to_string(a.nproc) + " --master-port 0 " + self + common +
                    " --impls shm,shm-shared,gloo,c10d-gloo";
  std::printf("\n$ %s\n", cmd.c_str());
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "lockstep-run job failed\n");
#ifdef LOCKSTEP_HAVE_MPI
  cmd = std::string("'") + LOCKSTEP_MPIRUN_PATH + "' -np " + std::to_string(a.nproc) + " " + self +
        common + " --impls mpi,mpi-raw";
  std::printf("\n$ %s\n", cmd.c_str());
  std::fflush(stdout);
  if (std::system(cmd.c_str()) != 0) std::fprintf(stderr, "mpirun job failed\n");
#endif
  std::map<std::string, Row> rows;  // key impl|op|bytes
  std::ifstream in(tmp);
  std::string line;
  while (std::getline(in, line)) {
    std::stringstream ss(line);
    Row r;
    std::string f[7];
    for (auto& x : f) std::getline(ss, x, ',');
    r.impl = f[0];
    r.op = f[1];
    r.bytes = std::stoll(f[2]);
    r.t = std::stod(f[4]);
    r.busbw = std::stod(f[6]);
    rows[r.impl + "|" + r.op + "|" + f[2]] = r;
  }
  std::rename(tmp.c_str(), a.out.c_str());
  auto get = [&](const std::string& impl, const std::string& op, int64_t b) -> const Row* {
    auto it = rows.find(impl + "|" + op + "|" + std::to_string(b));
    return it == rows.end() ? nullptr : &it->second;
  };
  auto bw = [&](const Row* r) { return r ? fmt(r->busbw) : std::string("n/a"); };
  auto ratio = [&](const Row* x, const Row* y) {
    return x && y && y->busbw > 0 ? fmt(x->busbw / y->busbw) + "x" : std::string("n/a");
  };
  std::printf("\nbus bandwidth, GB/s, %d ranks (float32; higher is better)\n", a.nproc);
  for (const std::string op : {"allreduce", "allgather", "reduce_scatter"}) {
    // allreduce also in shared memory (the zero-copy path DDP's buckets take)
    const bool shared = std::string(op) == "allreduce";
    std::vector<std::string> cols{op, "shm"};
    if (shared) cols.push_back("shm shared");
    for (const char* c : {"gloo", "mpi", "c10d-gloo", "MPI", "shm/c10d-gloo", "shm/MPI"})
      cols.push_back(c);
    if (shared) cols.push_back("shared/MPI");
    Table t(cols);
    for (int64_t bytes : parse_sizes(a.sizes)) {
      const int64_t b = bytes / 4 / a.nproc * a.nproc * 4;
      const Row* shm = get("shm", op, b);
      const Row* sh = get("shm-shared", op, b);
      const Row* peer_gloo = get("c10d-gloo", op, b);
      const Row* peer_mpi = get("mpi-raw", op, b);
      std::vector<std::string> row{format_size(bytes), bw(shm)};
      if (shared) row.push_back(bw(sh));
      for (const std::string& v : {bw(get("gloo", op, b)), bw(get("mpi", op, b)), bw(peer_gloo),
                                   bw(peer_mpi), ratio(shm, peer_gloo), ratio(shm, peer_mpi)})
        row.push_back(v);
      if (shared) row.push_back(ratio(sh, peer_mpi));
      t.add(row);
    }
    std::printf("\n%s", t.str().c_str());
  }
  std::printf("\nCSV: %s\n", a.out.c_str());
  return 0;
}

}  // namespace

int collectives_main(int argc, char** argv) {
  Args a = parse(argc, argv);
  return a.worker ? run_worker(a) : run_driver(a);
}

}  // namespace lockstep::bench
