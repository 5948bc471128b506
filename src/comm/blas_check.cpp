// lockstep::init()'s check of the BLAS this process loaded: OPENBLAS_CORETYPE is read when
// OpenBLAS loads, so a running process can only be told what to set for the next start.
#include "blas_check.h"

#include <dlfcn.h>

#include <cstdio>
#include <cstdlib>

#include "lockstep/blas_core.h"
#include "lockstep/error.h"

namespace lockstep::comm {

std::optional<std::string> loaded_openblas_core() {
  using CoreName = const char* (*)();
  auto f = reinterpret_cast<CoreName>(dlsym(RTLD_DEFAULT, "openblas_get_corename"));
  if (!f || !f()) return std::nullopt;
  return std::string(f());
}

std::string blas_note(const std::optional<std::string>& core, const char* user_coretype,
                      bool debug) {
  if (!core) return "";
  const blas::Isa cpu = blas::cpu_isa();
  const auto better = blas::better_core(*core, cpu, blas::cpu_is_amd());
  if (!better) {
    if (!debug) return "";
    return lockstep::detail::concat("lockstep: OpenBLAS runs its ", *core,
                                    " kernels (CPU: ", blas::isa_name(cpu), ")");
  }
  const std::string why =
      user_coretype ? lockstep::detail::concat("OPENBLAS_CORETYPE=", user_coretype, " selects")
                    : std::string("OpenBLAS did not recognise this CPU and runs");
  return lockstep::detail::concat(
      "lockstep: ", why, " its ", *core, " kernels on a CPU with ", blas::isa_name(cpu),
      ": matrix products run several times slower than they could; start "
      "the ranks with OPENBLAS_CORETYPE=",
      *better, " (lockstep-run sets it when you leave it unset)");
}

void check_blas(const LaunchEnv& e, bool debug) {
  if (e.local_rank != 0) return;
  const char* user = std::getenv("OPENBLAS_CORETYPE");
  const std::string note = blas_note(loaded_openblas_core(), user && *user ? user : nullptr, debug);
  if (!note.empty()) std::fprintf(stderr, "%s\n", note.c_str());
}

}  // namespace lockstep::comm
