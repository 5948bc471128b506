#include <lockstep/data/data_error.h>

namespace lockstep::data {

DataError::DataError(Kind kind, std::string path, const std::string& what_happened)
    : Error(what_happened), kind_(kind), path_(std::move(path)) {}

const char* DataError::kind_name(Kind k) {
  switch (k) {
    case Kind::NotFound:
      return "not found";
    case Kind::Io:
      return "I/O error";
    case Kind::BadMagic:
      return "bad magic";
    case Kind::BadShape:
      return "bad shape";
    case Kind::Truncated:
      return "truncated";
    case Kind::Gzip:
      return "gzip error";
    case Kind::Mismatch:
      return "mismatch";
  }
  return "unknown";
}

}  // namespace lockstep::data
