// lockstep/train/atomic_file.h: crash-safe file replacement.
#pragma once

#include <string>

namespace lockstep::train {

// Writes `bytes` to `path` so that a crash at any moment leaves either the old file or the
// complete new one: write `path.tmp`, fsync it, rename over `path`, fsync the directory.
// Throws lockstep::Error naming the path on failure.
void write_file_atomic(const std::string& path, const std::string& bytes);
// fsync a directory (makes renames inside it durable).
void fsync_dir(const std::string& dir);
std::string read_file(const std::string& path);

}  // namespace lockstep::train
