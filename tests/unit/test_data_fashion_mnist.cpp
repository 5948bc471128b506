// Fashion-MNIST reader: the real files (when the package is installed) and named
// errors for crafted corrupt files in a temporary directory.
#include <lockstep/data/fashion_mnist.h>

#include <gtest/gtest.h>
#include <torch/torch.h>
#include <zlib.h>

#include <unistd.h>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <string>

using lockstep::data::DataError;
using lockstep::data::FashionMnist;
using lockstep::data::FashionMnistOptions;
using lockstep::data::Split;

namespace {

const char* kRealDir = "/usr/share/datasets/fashion-mnist";

bool real_files_present() {
  return access((std::string(kRealDir) + "/train-images-idx3-ubyte.gz").c_str(), R_OK) == 0 &&
         access((std::string(kRealDir) + "/t10k-labels-idx1-ubyte.gz").c_str(), R_OK) == 0;
}

std::vector<uint8_t> be32(uint32_t v) {
  return {uint8_t(v >> 24), uint8_t(v >> 16), uint8_t(v >> 8), uint8_t(v)};
}

// An idx ubyte file: magic 00 00 08 ndims, dims, payload (pixel = index % 251).
std::vector<uint8_t> idx_bytes(const std::vector<uint32_t>& dims, uint32_t magic = 0) {
  std::vector<uint8_t> b = be32(magic ? magic : 0x0800u | uint32_t(dims.size()));
  size_t n = 1;
  for (uint32_t d : dims) {
    auto e = be32(d);
    b.insert(b.end(), e.begin(), e.end());
    n *= d;
  }
  for (size_t i = 0; i < n; ++i) b.push_back(uint8_t(dims.size() == 1 ? i % 10 : i % 251));
  return b;
}

class TempDir : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/lockstep-data-test-XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }

  std::string path(const std::string& name) const { return dir_ + "/" + name; }
  void write_raw(const std::string& name, const std::vector<uint8_t>& b) const {
    std::ofstream(path(name), std::ios::binary)
        .write(reinterpret_cast<const char*>(b.data()), std::streamsize(b.size()));
  }
  void write_gz(const std::string& name, const std::vector<uint8_t>& b) const {
    gzFile f = gzopen(path(name).c_str(), "wb");
    ASSERT_NE(f, nullptr);
    ASSERT_EQ(gzwrite(f, b.data(), unsigned(b.size())), int(b.size()));
    gzclose(f);
  }
  // A valid test split of n examples, gzip'd.
  void write_split(uint32_t n_images, uint32_t n_labels) const {
    write_gz("t10k-images-idx3-ubyte.gz", idx_bytes({n_images, 28, 28}));
    write_gz("t10k-labels-idx1-ubyte.gz", idx_bytes({n_labels}));
  }
  // Loads the test split from dir_ and returns the DataError it raises.
  DataError load_error() const {
    try {
      FashionMnist(Split::Test, {.dir = dir_});
    } catch (const DataError& e) {
      return e;
    }
    ADD_FAILURE() << "no DataError";
    return DataError(DataError::Kind::Io, "", "");
  }
  std::string dir_;
};

#define EXPECT_CONTAINS(haystack, needle) \
  EXPECT_NE(std::string(haystack).find(needle), std::string::npos) << "message: " << (haystack)

TEST(FashionMnistReal, ReadsDebiansFiles) {
  if (!real_files_present()) GTEST_SKIP() << "dataset-fashion-mnist not installed";
  FashionMnist train(Split::Train, {.dir = kRealDir});
  FashionMnist test(Split::Test, {.dir = kRealDir});
  EXPECT_EQ(train.size().value(), 60000u);
  EXPECT_EQ(test.size().value(), 10000u);
  EXPECT_EQ(train.images().sizes(), (std::vector<int64_t>{60000, 1, 28, 28}));
  EXPECT_EQ(train.images().dtype(), torch::kFloat32);
  EXPECT_EQ(train.targets().dtype(), torch::kInt64);
  // Normalized with the training statistics: mean ~0, std ~1.
  EXPECT_NEAR(train.images().mean().item<double>(), 0.0, 0.01);
  EXPECT_NEAR(train.images().std().item<double>(), 1.0, 0.01);
  // Balanced classes: 6000 per class in train, 1000 in test.
  auto counts = torch::bincount(train.targets());
  EXPECT_TRUE(torch::all(counts == 6000).item<bool>()) << counts;
  EXPECT_TRUE(torch::all(torch::bincount(test.targets()) == 1000).item<bool>());
  auto ex = train.get(0);
  EXPECT_EQ(ex.data.sizes(), (std::vector<int64_t>{1, 28, 28}));
  // Raw pixels are in [0, 1] when not normalized.
  FashionMnist raw(Split::Test, {.dir = kRealDir, .normalize = false});
  EXPECT_GE(raw.images().min().item<float>(), 0.0f);
  EXPECT_LE(raw.images().max().item<float>(), 1.0f);
}

TEST_F(TempDir, ReadsCraftedGzipAndRawFiles) {
  write_split(5, 5);
  FashionMnist ds(Split::Test, {.dir = dir_, .normalize = false});
  ASSERT_EQ(ds.size().value(), 5u);
  EXPECT_EQ(ds.targets()[3].item<int64_t>(), 3);
  EXPECT_FLOAT_EQ(ds.images()[0][0][0][1].item<float>(), 1.0f / 255);
  // Uncompressed files are accepted too.
  std::remove(path("t10k-labels-idx1-ubyte.gz").c_str());
  write_raw("t10k-labels-idx1-ubyte", idx_bytes({5}));
  EXPECT_EQ(FashionMnist(Split::Test, {.dir = dir_}).size().value(), 5u);
}

TEST_F(TempDir, MissingFileNamesThePackage) {
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::NotFound);
  EXPECT_CONTAINS(e.what(), path("t10k-images-idx3-ubyte.gz"));
  EXPECT_CONTAINS(e.what(), "apt-get install dataset-fashion-mnist");
  EXPECT_CONTAINS(e.what(), "make deps");
}

TEST_F(TempDir, BadMagic) {
  write_split(3, 3);
  write_gz("t10k-images-idx3-ubyte.gz", idx_bytes({3, 28, 28}, 0x00000801));
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::BadMagic);
  EXPECT_CONTAINS(e.what(), "t10k-images-idx3-ubyte.gz");
  EXPECT_CONTAINS(e.what(), "bad magic 0x00000801, expected 0x00000803");
}

TEST_F(TempDir, WrongDimensions) {
  write_split(3, 3);
  write_gz("t10k-images-idx3-ubyte.gz", idx_bytes({3, 32, 32}));
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::BadShape);
  EXPECT_CONTAINS(e.what(), "wrong dimensions: images are 32x32, expected 28x28");
}

TEST_F(TempDir, TruncatedPayload) {
  write_split(3, 3);
  auto b = idx_bytes({3, 28, 28});  // 16 + 2352 bytes
  b.resize(1000);
  write_gz("t10k-images-idx3-ubyte.gz", b);
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::Truncated);
  EXPECT_CONTAINS(e.what(), "t10k-images-idx3-ubyte.gz");
  EXPECT_CONTAINS(e.what(), "truncated at byte 1000 of 2368");
}

TEST_F(TempDir, TruncatedGzipStream) {
  write_split(50, 50);
  std::ifstream in(path("t10k-images-idx3-ubyte.gz"), std::ios::binary);
  std::vector<uint8_t> gz((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  gz.resize(gz.size() / 2);  // a download cut in the middle
  write_raw("t10k-images-idx3-ubyte.gz", gz);
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::Gzip);
  EXPECT_CONTAINS(e.what(), "gzip stream truncated");
  EXPECT_CONTAINS(e.what(), "t10k-images-idx3-ubyte.gz");
}

TEST_F(TempDir, GzipGarbage) {
  write_split(3, 3);
  // The gzip magic and header, then bytes that are not a deflate stream.
  std::vector<uint8_t> junk = {0x1f, 0x8b, 0x08, 0, 0, 0, 0, 0, 0, 3};
  for (int i = 0; i < 64; ++i) junk.push_back(uint8_t(0xff - i));
  write_raw("t10k-images-idx3-ubyte.gz", junk);
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::Gzip);
  EXPECT_CONTAINS(e.what(), "gzip error at compressed byte");
  EXPECT_CONTAINS(e.what(), "t10k-images-idx3-ubyte.gz");
}

TEST_F(TempDir, CountMismatchBetweenImagesAndLabels) {
  write_split(4, 3);
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::Mismatch);
  EXPECT_CONTAINS(e.what(), "has 4 images but");
  EXPECT_CONTAINS(e.what(), "has 3 labels");
}

TEST_F(TempDir, LabelOutOfRange) {
  write_split(3, 3);
  auto b = idx_bytes({3});
  b.back() = 12;
  write_gz("t10k-labels-idx1-ubyte.gz", b);
  auto e = load_error();
  EXPECT_EQ(e.kind(), DataError::Kind::Mismatch);
  EXPECT_CONTAINS(e.what(), "label 12 at index 2 is out of range [0, 9]");
}

TEST_F(TempDir, ErrorsAreLockstepErrors) {
  EXPECT_THROW(FashionMnist(Split::Train, {.dir = dir_}), lockstep::Error);
}

}  // namespace
