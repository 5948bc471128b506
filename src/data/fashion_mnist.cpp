// Fashion-MNIST: idx files -> tensors, with the shape and count checks the raw
// format leaves to the reader.
#include <lockstep/data/fashion_mnist.h>

#include "data/idx_file.h"

#include <torch/torch.h>

#include <sys/stat.h>
#include <cstdlib>

namespace lockstep::data {
namespace {

using Kind = DataError::Kind;

constexpr int64_t kSide = 28;
constexpr int64_t kClasses = 10;

bool exists(const std::string& p) {
  struct stat st {};
  return ::stat(p.c_str(), &st) == 0;
}

std::string pick(const std::string& dir, const std::string& stem) {
  const std::string base = dir.empty() || dir.back() == '/' ? dir : dir + "/";
  std::string gz = base + stem + ".gz";
  if (!exists(gz) && exists(base + stem)) return base + stem;
  return gz;
}

// A missing file is almost always a missing package: say which one installs it.
[[noreturn]] void rethrow_not_found(const DataError& e) {
  throw DataError(Kind::NotFound, e.path(),
                  e.path() +
                      ": no such file. Fashion-MNIST comes with Debian's package: "
                      "`sudo apt-get install dataset-fashion-mnist` (or `make deps`); "
                      "or point --data-dir / FashionMnistOptions::dir / "
                      "LOCKSTEP_FASHION_MNIST_DIR at a directory holding the idx files");
}

}  // namespace

std::string fashion_mnist_default_dir() {
  if (const char* env = std::getenv("LOCKSTEP_FASHION_MNIST_DIR"); env && *env) return env;
  return "/usr/share/datasets/fashion-mnist";
}

std::string fashion_mnist_images_path(const std::string& dir, Split split) {
  return pick(dir, split == Split::Train ? "train-images-idx3-ubyte" : "t10k-images-idx3-ubyte");
}

std::string fashion_mnist_labels_path(const std::string& dir, Split split) {
  return pick(dir, split == Split::Train ? "train-labels-idx1-ubyte" : "t10k-labels-idx1-ubyte");
}

torch::Tensor read_idx_images(const std::string& path, bool normalize) {
  detail::IdxUbyte idx;
  try {
    idx = detail::read_idx_ubyte(path, 3, "images");
  } catch (const DataError& e) {
    if (e.kind() == Kind::NotFound) rethrow_not_found(e);
    throw;
  }
  const int64_t n = idx.dims[0];
  if (idx.dims[1] != kSide || idx.dims[2] != kSide)
    throw DataError(Kind::BadShape, path,
                    lockstep::detail::concat(path, ": wrong dimensions: images are ", idx.dims[1],
                                             "x", idx.dims[2], ", expected ", kSide, "x", kSide));
  // from_blob borrows idx.bytes; the conversion to float copies before it goes away.
  auto pixels =
      torch::from_blob(const_cast<uint8_t*>(idx.payload()), {n, 1, kSide, kSide}, torch::kUInt8);
  auto images = pixels.to(torch::kFloat32).div_(255.0);
  if (normalize) images.sub_(kFashionMnistMean).div_(kFashionMnistStd);
  return images;
}

torch::Tensor read_idx_labels(const std::string& path) {
  detail::IdxUbyte idx;
  try {
    idx = detail::read_idx_ubyte(path, 1, "labels");
  } catch (const DataError& e) {
    if (e.kind() == Kind::NotFound) rethrow_not_found(e);
    throw;
  }
  const int64_t n = idx.dims[0];
  const uint8_t* p = idx.payload();
  for (int64_t i = 0; i < n; ++i)
    if (p[i] >= kClasses)
      throw DataError(Kind::Mismatch, path,
                      lockstep::detail::concat(path, ": label ", int{p[i]}, " at index ", i,
                                               " is out of range [0, ", kClasses - 1, "]"));
  return torch::from_blob(const_cast<uint8_t*>(p), {n}, torch::kUInt8).to(torch::kInt64);
}

FashionMnist::FashionMnist(Split split, const FashionMnistOptions& options) : split_(split) {
  const std::string dir = options.dir.empty() ? fashion_mnist_default_dir() : options.dir;
  const std::string images_path = fashion_mnist_images_path(dir, split);
  const std::string labels_path = fashion_mnist_labels_path(dir, split);
  images_ = read_idx_images(images_path, options.normalize);
  targets_ = read_idx_labels(labels_path);
  if (images_.size(0) != targets_.size(0))
    throw DataError(Kind::Mismatch, labels_path,
                    lockstep::detail::concat("count mismatch: ", images_path, " has ",
                                             images_.size(0), " images but ", labels_path, " has ",
                                             targets_.size(0), " labels"));
}

torch::data::Example<> FashionMnist::get(size_t index) {
  const auto i = static_cast<int64_t>(index);
  LOCKSTEP_CHECK(i < images_.size(0), "FashionMnist::get: index ", index, " out of range [0, ",
                 images_.size(0), ")");
  return {images_[i], targets_[i]};
}

torch::optional<size_t> FashionMnist::size() const { return static_cast<size_t>(images_.size(0)); }

const char* FashionMnist::class_name(int64_t label) {
  static const char* const kNames[kClasses] = {"T-shirt/top", "Trouser",   "Pullover", "Dress",
                                               "Coat",        "Sandal",    "Shirt",    "Sneaker",
                                               "Bag",         "Ankle boot"};
  return label >= 0 && label < kClasses ? kNames[label] : "?";
}

}  // namespace lockstep::data
