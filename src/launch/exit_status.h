// src/launch/exit_status.h: turning waitpid statuses into words and exit codes.
#pragma once

#include <string>

namespace lockstep::launch {

// "SIGKILL" for 9; "SIG<n>" for signals without a well-known name.
std::string signal_name(int sig);

// "exited with code 3" / "killed by signal 9 (SIGKILL)" (+ " (core dumped)").
std::string describe_wait_status(int status);

// The shell's convention: the exit code, or 128 + signal number.
int exit_code_of(int status);

// True when the status means success (exited with code 0).
bool succeeded(int status);

}  // namespace lockstep::launch
