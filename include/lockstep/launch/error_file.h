// lockstep/launch/error_file.h: the per-rank error file (torchelastic's TORCHELASTIC_ERROR_FILE).
//
// lockstep-run gives every rank its own path in LOCKSTEP_ERROR_FILE (and the same path in
// TORCHELASTIC_ERROR_FILE, which torch's @record writes). A rank that fails writes its
// exception's message there before it exits; when the job fails, the launcher's summary
// prints the message of the rank that failed first (exit order), and one line per other
// rank, so the log names the culprit and the reason even when stderr was noisy.
// Pure C++17 + POSIX, no libtorch: every program may link lockstep_launch for this.
#pragma once

#include <string>

namespace lockstep::launch {

// Writes `message` to the file named by LOCKSTEP_ERROR_FILE (else TORCHELASTIC_ERROR_FILE).
// The first error of a process wins: later calls, usually consequences of the first, keep
// it. No-op (false) when neither variable is set or the file cannot be written; never
// throws. Call it where main catches what ends the program.
bool record_error(const std::string& message);

// The message of an error file: its text as written by record_error, or the "message"
// string of torchelastic's JSON format. Empty when the file is missing or empty.
std::string read_error_file(const std::string& path);

// The path a rank's error file gets inside the launcher's directory for them.
std::string error_file_path(const std::string& dir, int rank);

}  // namespace lockstep::launch
