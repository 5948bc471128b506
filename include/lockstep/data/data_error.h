// lockstep/data/data_error.h: the error a dataset reader raises.
//
// Every message names the file and what is wrong with it, in words a user can act
// on: a missing file names the Debian package that installs it; a corrupt one says
// whether the magic, the dimensions, the length (truncated at byte N of M), the
// gzip stream, or the image/label counts are wrong.
#pragma once

#include <lockstep/error.h>

#include <string>

namespace lockstep::data {

class DataError : public Error {
 public:
  enum class Kind {
    NotFound,   // the file does not exist
    Io,         // open/read failed (permissions, I/O error)
    BadMagic,   // not an idx file of the expected type
    BadShape,   // idx header has the wrong number or size of dimensions
    Truncated,  // fewer payload bytes than the header promises
    Gzip,       // the gzip stream is corrupt or ends early
    Mismatch,   // images and labels disagree (count), or a label is out of range
  };
  DataError(Kind kind, std::string path, const std::string& what_happened);

  Kind kind() const { return kind_; }
  // The file the error is about (for Mismatch: the labels file).
  const std::string& path() const { return path_; }
  static const char* kind_name(Kind k);

 private:
  Kind kind_;
  std::string path_;
};

}  // namespace lockstep::data
