// lockstep-bench: benchmarks that measure lockstep beside its peers in the same run.
#include <cstdio>
#include <cstring>
#include <exception>
#include <string>

namespace lockstep::bench {
int collectives_main(int argc, char** argv);
int compression_main(int argc, char** argv);
int ddp_main(int argc, char** argv);
int train_main(int argc, char** argv);
}

int main(int argc, char** argv) {
  const std::string usage =
      "usage: lockstep-bench collectives [--nproc N] [--sizes 4KiB,16MiB,...] [--out FILE]\n"
      "       lockstep-bench compression [--nproc N] [--rates 1gbit,10gbit] [--steps N] [--skip-net]\n"
      "       lockstep-bench ddp [--nproc 1,2] [--configs shm,gloo,mpi] [--steps 30] [--rounds N]\n"
      "                          [--out FILE] [--skip-peer] [--python PATH] [--profile]\n"
      "       lockstep-bench train [--config FILE] [--epochs N] [--ranks 1,2] [--repeat N]\n";
  if (argc < 2 || !std::strcmp(argv[1], "--help")) {
    std::fputs(usage.c_str(), argc < 2 ? stderr : stdout);
    return argc < 2 ? 2 : 0;
  }
  try {
    const std::string cmd = argv[1];
    if (cmd == "collectives") return lockstep::bench::collectives_main(argc - 2, argv + 2);
    if (cmd == "compression") return lockstep::bench::compression_main(argc - 2, argv + 2);
    if (cmd == "ddp") return lockstep::bench::ddp_main(argc - 2, argv + 2);
    if (cmd == "train") return lockstep::bench::train_main(argc - 2, argv + 2);
    std::fprintf(stderr, "lockstep-bench: unknown benchmark '%s'\n%s", cmd.c_str(), usage.c_str());
    return 2;
  } catch (const std::exception& e) {
    std::fprintf(stderr, "lockstep-bench: %s\n", e.what());
    return 1;
  }
}
