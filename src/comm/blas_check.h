// The one-line check of the BLAS that lockstep::init() makes (lockstep/blas_core.h).
#pragma once

#include <optional>
#include <string>

#include "lockstep/comm/launch_env.h"

namespace lockstep::comm {

// The core openblas_get_corename() reports in this process; nullopt when no OpenBLAS is
// loaded (MKL in a torch wheel, the reference BLAS).
std::optional<std::string> loaded_openblas_core();

// The line init() prints on each node's local rank 0, or "" when there is nothing to say:
// OpenBLAS runs kernels below the CPU's tier (what to set, and that lockstep-run sets it),
// or, with `debug` (LOCKSTEP_DEBUG set), the core it runs and the CPU's tier.
std::string blas_note(const std::optional<std::string>& core, const char* user_coretype,
                      bool debug);

// Prints blas_note(...) for this process to stderr when `e` is its node's local rank 0.
void check_blas(const LaunchEnv& e, bool debug);

}  // namespace lockstep::comm
