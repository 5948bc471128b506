// Internal: init()'s options, each from InitOptions if the program set it, else from its
// LOCKSTEP_* environment variable (include/lockstep/env_contract.h), else the default.
// Bad values are a ConfigError naming the variable and the range it takes.
#pragma once

#include <lockstep/comm/init.h>
#include <lockstep/comm/process_group.h>

namespace lockstep::comm {

// The value of environment variable `name`, or nullptr when it is unset or empty.
const char* env_value(const char* name);

// Every group option init() reads: the op timeout (LOCKSTEP_TIMEOUT_S), the collective
// check (LOCKSTEP_CHECK_COLLECTIVES), DETAIL checks (LOCKSTEP_DEBUG=DETAIL) and the stall
// warning (LOCKSTEP_STALL_WARN_S). No side store: rendezvous adds it (with_side_store).
ProcessGroupOptions group_options(const InitOptions& options);

// LOCKSTEP_DEBUG set to anything but "" or "0".
bool debug_on();

// True when the program or LOCKSTEP_BACKEND asked for hier by name (not through auto).
bool hier_requested(const InitOptions& options);

}  // namespace lockstep::comm
