// Reads idx files (the MNIST family's format: a big-endian header, then raw bytes).
// The file is inflated in memory rather than through gzread so that a corrupt or
// cut-short stream can be reported with its byte offset instead of a bare "read failed".
#include "data/idx_file.h"

#include <lockstep/data/data_error.h>

#include <zlib.h>

#include <sys/stat.h>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace lockstep::data::detail {
namespace {

using Kind = DataError::Kind;

template <typename... Args>
std::string msg(const std::string& path, const Args&... args) {
  return lockstep::detail::concat(path, ": ", args...);
}

std::vector<uint8_t> read_file(const std::string& path) {
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0) {
    if (errno == ENOENT) throw DataError(Kind::NotFound, path, msg(path, "no such file"));
    throw DataError(Kind::Io, path, msg(path, std::strerror(errno)));
  }
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(Kind::Io, path, msg(path, "cannot open: ", std::strerror(errno)));
  std::vector<uint8_t> bytes(static_cast<size_t>(st.st_size));
  in.read(reinterpret_cast<char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  if (static_cast<size_t>(in.gcount()) != bytes.size())
    throw DataError(Kind::Io, path,
                    msg(path, "read ", in.gcount(), " of ", bytes.size(), " bytes"));
  return bytes;
}

bool is_gzip(const std::vector<uint8_t>& b, size_t at = 0) {
  return b.size() >= at + 2 && b[at] == 0x1f && b[at + 1] == 0x8b;
}

std::vector<uint8_t> gunzip(const std::string& path, const std::vector<uint8_t>& in) {
  std::vector<uint8_t> out;
  // The gzip trailer's ISIZE (size mod 2^32) is a good first guess for the output size.
  if (in.size() >= 18) {
    const uint8_t* t = in.data() + in.size() - 4;
    out.reserve(static_cast<size_t>(t[0]) | (static_cast<size_t>(t[1]) << 8) |
                (static_cast<size_t>(t[2]) << 16) | (static_cast<size_t>(t[3]) << 24));
  }
  z_stream zs{};
  if (inflateInit2(&zs, 15 + 16) != Z_OK)  // 15 + 16: gzip wrapper, max window
    throw DataError(Kind::Gzip, path, msg(path, "gzip error: cannot initialise zlib"));
  zs.next_in = const_cast<Bytef*>(in.data());
  zs.avail_in = static_cast<uInt>(in.size());
  uint8_t chunk[1 << 16];
  int rc = Z_OK;
  for (;;) {
    zs.next_out = chunk;
    zs.avail_out = sizeof(chunk);
    rc = inflate(&zs, Z_NO_FLUSH);
    out.insert(out.end(), chunk, chunk + (sizeof(chunk) - zs.avail_out));
    if (rc == Z_STREAM_END) {
      // gzip allows several members back to back; anything else after the end is ignored,
      // as gzip(1) does with trailing zeros.
      const size_t consumed = in.size() - zs.avail_in;
      if (zs.avail_in > 0 && is_gzip(in, consumed)) {
        inflateReset(&zs);
        continue;
      }
      break;
    }
    if (rc == Z_OK) continue;
    const size_t at = in.size() - zs.avail_in;
    const std::string zmsg = zs.msg ? zs.msg : zError(rc);
    inflateEnd(&zs);
    if (rc == Z_BUF_ERROR && zs.avail_in == 0)
      throw DataError(Kind::Gzip, path,
                      msg(path, "gzip stream truncated: the compressed file ends at byte ",
                          in.size(), " before the end of the stream (", out.size(),
                          " bytes decompressed so far); the file was cut short, reinstall it"));
    throw DataError(Kind::Gzip, path,
                    msg(path, "gzip error at compressed byte ", at, " of ", in.size(), ": ", zmsg,
                        " (the file is corrupt, reinstall it)"));
  }
  inflateEnd(&zs);
  return out;
}

uint32_t be32(const uint8_t* p) {
  return (uint32_t{p[0]} << 24) | (uint32_t{p[1]} << 16) | (uint32_t{p[2]} << 8) | uint32_t{p[3]};
}

std::string hex32(uint32_t v) {
  char buf[16];
  std::snprintf(buf, sizeof(buf), "0x%08x", v);
  return buf;
}

}  // namespace

std::vector<uint8_t> read_maybe_gzip(const std::string& path) {
  std::vector<uint8_t> raw = read_file(path);
  return is_gzip(raw) ? gunzip(path, raw) : raw;
}

IdxUbyte read_idx_ubyte(const std::string& path, int expected_ndims, const char* what) {
  IdxUbyte idx;
  idx.bytes = read_maybe_gzip(path);
  const auto& b = idx.bytes;
  const uint32_t expected_magic = 0x00000800u | static_cast<uint32_t>(expected_ndims);
  if (b.size() < 4)
    throw DataError(Kind::Truncated, path,
                    msg(path, "truncated at byte ", b.size(), " of the 4-byte idx magic"));
  const uint32_t magic = be32(b.data());
  if (magic != expected_magic)
    throw DataError(
        Kind::BadMagic, path,
        msg(path, "bad magic ", hex32(magic), ", expected ", hex32(expected_magic),
            " (idx file of unsigned bytes with ", expected_ndims, " dimensions: ", what, ")"));
  idx.payload_offset = 4 + 4 * static_cast<size_t>(expected_ndims);
  if (b.size() < idx.payload_offset)
    throw DataError(Kind::Truncated, path,
                    msg(path, "truncated at byte ", b.size(), " of the ", idx.payload_offset,
                        "-byte idx header"));
  uint64_t payload = 1;
  for (int d = 0; d < expected_ndims; ++d) {
    const uint32_t n = be32(b.data() + 4 + 4 * static_cast<size_t>(d));
    idx.dims.push_back(n);
    payload *= n;
  }
  const uint64_t expected = idx.payload_offset + payload;
  if (b.size() < expected)
    throw DataError(Kind::Truncated, path,
                    msg(path, "truncated at byte ", b.size(), " of ", expected,
                        " (the header says ", idx.dims[0], " ", what, ")"));
  if (b.size() > expected)
    throw DataError(Kind::BadShape, path,
                    msg(path, "has ", b.size() - expected, " bytes past the ", expected,
                        " its header accounts for (", idx.dims[0], " ", what,
                        "); wrong dimensions or not an idx file"));
  return idx;
}

}  // namespace lockstep::data::detail
