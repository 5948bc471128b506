// The compressed collectives keep one call in flight per plan: before the next call (or
// the plan's end) the previous work is waited for. Its failure is not raised here: it broke
// the group, which fails the next call with the cause, and the caller that dropped the work
// has moved on.
#pragma once

#include <lockstep/comm/work.h>

#include <exception>

namespace lockstep::compress {

inline void wait_quietly(const comm::WorkPtr& w) {
  if (!w || w->is_completed()) return;
  try {
    w->wait();
  } catch (const std::exception&) {
  }
}

}  // namespace lockstep::compress
