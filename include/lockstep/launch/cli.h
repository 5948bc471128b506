// lockstep/launch/cli.h: the command-line rules every lockstep program shares (CLI11;
// a program including this header links CLI11::CLI11 itself).
//
// An unknown flag or a bad value is a usage error: the program prints one line naming it
// (with the nearest valid flag when one is close), then its usage line, and exits with
// kExitUsage (2), as lockstep-run does. CLI11's own exit codes (109 for an unexpected
// argument, ...) are not used.
#pragma once

#include <CLI/CLI.hpp>

#include <iosfwd>
#include <optional>
#include <string>
#include <vector>

namespace lockstep::launch {

// The flag of `valid` that `given` most likely misspells: the only one it is a prefix of,
// else the closest by edit distance (underscores read as dashes) if within max(2, a third
// of its length); "" when none is that close or `given` has under 2 letters ("--", "-x").
std::string nearest_flag(const std::string& given, const std::vector<std::string>& valid);

// Every long and short flag `app` accepts ("--resume", "-h", ...).
std::vector<std::string> flags_of(const CLI::App& app);

// The usage line of `app` ("Usage: NAME [OPTIONS] ...").
std::string usage_line(const CLI::App& app);

// Parses argv into `app` with the rules above. Returns nullopt when the program goes on;
// otherwise the exit code main should return: 0 after printing --help to `out`, kExitUsage
// after printing the error, the nearest flag and the usage line to `err`. With subcommands
// ("lockstep-bench ddp --stesp") the error names the one reached and its flags are known
// too; a word where a subcommand belongs is an unknown command, with the nearest one.
std::optional<int> parse_command_line(CLI::App& app, int argc, const char* const* argv,
                                      std::ostream& out, std::ostream& err);

}  // namespace lockstep::launch
