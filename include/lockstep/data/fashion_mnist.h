// lockstep/data/fashion_mnist.h: Fashion-MNIST from its idx files.
//
// Reads the four files Debian's `dataset-fashion-mnist` package installs in
// /usr/share/datasets/fashion-mnist (gzip'd; uncompressed idx files work too):
//   train-images-idx3-ubyte.gz  train-labels-idx1-ubyte.gz   (60000 examples)
//   t10k-images-idx3-ubyte.gz   t10k-labels-idx1-ubyte.gz    (10000 examples)
// The whole split is loaded into memory at construction (~190 MB of float for the
// training split), so get() and the loaders never touch the disk.
//
// Errors: lockstep::data::DataError whose message names the file and the problem:
// a missing file names the package that installs it; a corrupt one says bad magic,
// wrong dimensions, "truncated at byte N of M", gzip error, or a count mismatch
// between images and labels. See docs/data.md.
#pragma once

#include <lockstep/data/data_error.h>

#include <torch/data/datasets/base.h>
#include <torch/data/example.h>

#include <optional>
#include <string>

namespace lockstep::data {

enum class Split { Train, Test };

// Training-set statistics of the pixels scaled to [0, 1]: normalizing with them
// gives inputs of mean 0, std 1, which keeps the first layer's scale sane.
inline constexpr double kFashionMnistMean = 0.2860;
inline constexpr double kFashionMnistStd = 0.3530;

struct FashionMnistOptions {
  // Directory of the four files. Empty: $LOCKSTEP_FASHION_MNIST_DIR if set, else
  // /usr/share/datasets/fashion-mnist.
  std::string dir;
  // true: (x / 255 - mean) / std. false: x / 255 in [0, 1].
  bool normalize = true;
};

// The directory FashionMnistOptions{}.dir resolves to.
std::string fashion_mnist_default_dir();
// "train-images-idx3-ubyte.gz" etc. for a split; prefers the .gz name, falls back to
// the uncompressed name if only that exists in `dir`.
std::string fashion_mnist_images_path(const std::string& dir, Split split);
std::string fashion_mnist_labels_path(const std::string& dir, Split split);

// An idx3 ubyte file of 28x28 images as float [N, 1, 28, 28] (normalized as asked).
torch::Tensor read_idx_images(const std::string& path, bool normalize = true);
// An idx1 ubyte file of labels 0..9 as int64 [N].
torch::Tensor read_idx_labels(const std::string& path);

// Fashion-MNIST as a libtorch dataset: get(i) = {image [1,28,28] float, label int64 scalar}.
// Use with .map(torch::data::transforms::Stack<>()) and a DistributedSampler.
// Copies are cheap (the tensors are shared) and read-only access is thread-safe.
class FashionMnist : public torch::data::datasets::Dataset<FashionMnist> {
 public:
  explicit FashionMnist(Split split, const FashionMnistOptions& options = {});

  torch::data::Example<> get(size_t index) override;
  torch::optional<size_t> size() const override;

  const torch::Tensor& images() const { return images_; }    // [N, 1, 28, 28] float
  const torch::Tensor& targets() const { return targets_; }  // [N] int64
  Split split() const { return split_; }

  // "T-shirt/top", "Trouser", ... for labels 0..9.
  static const char* class_name(int64_t label);

 private:
  Split split_;
  torch::Tensor images_;
  torch::Tensor targets_;
};

}  // namespace lockstep::data
