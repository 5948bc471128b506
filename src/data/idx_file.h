// idx_file.h (private): reading (optionally gzip'd) idx files into memory, with
// errors that name the file, the byte offset and what is wrong.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::data::detail {

// The whole file, decompressed if it starts with the gzip magic (1f 8b); other
// files are returned as they are (Debian ships .gz, other sources ship raw idx).
// Throws DataError: NotFound, Io, Gzip (corrupt or cut-short stream).
std::vector<uint8_t> read_maybe_gzip(const std::string& path);

// An idx file of unsigned bytes: dims from its header and the payload after it.
struct IdxUbyte {
  std::vector<int64_t> dims;
  std::vector<uint8_t> bytes;  // the whole decompressed file
  size_t payload_offset = 0;   // 4 + 4 * dims.size()
  const uint8_t* payload() const { return bytes.data() + payload_offset; }
};

// Parses and checks the header: magic 00 00 08 <ndims> with ndims == expected_ndims,
// and exactly prod(dims) payload bytes. Throws DataError BadMagic, BadShape, Truncated.
// `what` names the expected content in messages ("images", "labels").
IdxUbyte read_idx_ubyte(const std::string& path, int expected_ndims, const char* what);

}  // namespace lockstep::data::detail
