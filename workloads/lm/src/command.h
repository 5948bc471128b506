// command.h (private to lockstep_lm): a shell command's standard output.
#pragma once

#include <string>

namespace lm {

struct CommandOutput {
  std::string text;  // everything the command wrote to stdout
  int status = -1;   // its exit status; 127 when the shell found no such program; -1 when
                     // it could not be started or was killed by a signal
};

// Runs `command` through /bin/sh (popen) and reads its stdout to the end. Blocks.
CommandOutput run_command(const std::string& command);

}  // namespace lm
