// lockstep/train/provenance.h: where an exported model came from, for its model card.
#pragma once

#include <string>

namespace lockstep::train {

// `git rev-parse HEAD` in the current directory (40 hex digits), or "" when unavailable.
std::string git_revision();
// The current time in UTC as "YYYY-MM-DDTHH:MM:SSZ".
std::string utc_timestamp();

}  // namespace lockstep::train
