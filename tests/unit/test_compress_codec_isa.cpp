// Every SIMD path of the codec (generic, AVX2, AVX-512: whichever this build has and this
// CPU runs) writes the bytes of the plain scalar reference (codec_reference.h), for every
// bit width, both rounding modes, float32 / bfloat16 / float16 input, sizes around the
// bucket and block boundaries, unaligned pointers, and inputs with NaN, Inf, constant
// buckets, subnormals, signed zeros and ranges that overflow float. Decoding likewise.
#include "codec_reference.h"

#include <lockstep/compress/qsgd_codec.h>

#include <gtest/gtest.h>

#include <cstdlib>
#include <random>
#include <string>
#include <vector>

namespace lockstep::compress {
namespace {

// Restores the process-wide path after each test.
class CodecIsa : public ::testing::Test {
 protected:
  void SetUp() override { saved_ = codec_isa(); }
  void TearDown() override { set_codec_isa(saved_); }
  std::string saved_;
};

std::vector<float> random_values(int64_t n, uint32_t seed, int kind) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d;
  std::vector<float> x(static_cast<size_t>(n));
  for (auto& v : x) v = d(g);
  for (int64_t i = 0; i < n; ++i) {
    switch (kind) {
      case 1:  // subnormals and signed zeros
        x[size_t(i)] = (i % 3 == 0) ? (i % 2 ? -0.0f : 0.0f) : x[size_t(i)] * 1e-39f;
        break;
      case 2:  // specials scattered: NaN, +-Inf, and a constant run
        if (i % 997 == 5) x[size_t(i)] = NAN;
        if (i % 1499 == 7) x[size_t(i)] = (i % 2) ? INFINITY : -INFINITY;
        if (i / 256 == 3) x[size_t(i)] = 2.5f;
        break;
      case 3:  // ranges that overflow float (max - min = inf) and huge magnitudes
        x[size_t(i)] *= 3e38f;
        break;
      default:
        break;
    }
  }
  return x;
}

template <typename T>
std::vector<T> as(const std::vector<float>& x) {
  return std::vector<T>(x.begin(), x.end());
}

c10::ScalarType dtype_of(float) { return c10::kFloat; }
c10::ScalarType dtype_of(c10::BFloat16) { return c10::kBFloat16; }
c10::ScalarType dtype_of(c10::Half) { return c10::kHalf; }

// memcmp of n bytes, defined for n == 0 with null pointers (empty vectors).
bool same_bytes(const void* a, const void* b, size_t n) {
  return n == 0 || std::memcmp(a, b, n) == 0;
}

// Encodes x (shifted by `skew` elements to unalign it) on the active path and compares
// with the reference; then decodes the reference bytes on the path (float store and add,
// and the input dtype) and compares with the reference decode.
template <typename T>
void check_path(const std::vector<T>& storage, int64_t skew, const CodecOptions& o,
                const std::string& what) {
  const T* x = storage.data() + skew;
  const int64_t n = int64_t(storage.size()) - skew;
  const StreamKey key{7, 3, 1, 2};
  const std::vector<uint8_t> want = reference::encode(x, n, o, key, 11);
  std::vector<uint8_t> got(want.size() + 1, 0xAB);  // +1: an unaligned output pointer
  const int64_t bad = encode(x, dtype_of(T{}), n, o, key, 11, got.data() + 1);
  ASSERT_TRUE(same_bytes(want.data(), got.data() + 1, want.size()))
      << what << ": encoded bytes differ from the reference";
  (void)bad;

  std::vector<float> ref(static_cast<size_t>(n), 0.25f), out(static_cast<size_t>(n), 0.25f);
  reference::decode(want.data(), n, o, ref.data(), /*add=*/true);
  decode_add(want.data(), n, o, out.data());
  ASSERT_TRUE(same_bytes(ref.data(), out.data(), size_t(n) * 4)) << what << ": decode_add";
  reference::decode(want.data(), n, o, ref.data(), /*add=*/false);
  decode(want.data(), n, o, out.data());
  ASSERT_TRUE(same_bytes(ref.data(), out.data(), size_t(n) * 4)) << what << ": decode";
  std::vector<T> typed(static_cast<size_t>(n)), typed_want(ref.begin(), ref.end());
  decode(want.data(), n, o, typed.data(), dtype_of(T{}));
  ASSERT_TRUE(same_bytes(typed_want.data(), typed.data(), size_t(n) * sizeof(T)))
      << what << ": decode into the input dtype";
}

TEST_F(CodecIsa, EveryPathWritesTheReferenceBytes) {
  const std::vector<std::string> paths = codec_isas();
  ASSERT_FALSE(paths.empty());
  std::printf("codec paths on this CPU: ");
  for (const auto& p : paths) std::printf("%s ", p.c_str());
  std::printf("\n");
  for (const auto& path : paths) {
    set_codec_isa(path);
    ASSERT_EQ(path, codec_isa());
    for (int64_t n : {0, 1, 7, 127, 128, 129, 1023, 1025, 5000}) {
      for (int kind = 0; kind < 4; ++kind) {
        const std::vector<float> x = random_values(n + 1, uint32_t(n * 4 + kind), kind);
        for (int bits = 1; bits <= 8; ++bits) {
          for (int64_t bucket : {int64_t(128), int64_t(1), int64_t(13), int64_t(3000)}) {
            for (bool stochastic : {true, false}) {
              const CodecOptions o{bits, bucket, stochastic};
              const std::string what =
                  path + " n=" + std::to_string(n) + " kind=" + std::to_string(kind) +
                  " bits=" + std::to_string(bits) + " bucket=" + std::to_string(bucket) +
                  (stochastic ? " stochastic" : " nearest");
              ASSERT_NO_FATAL_FAILURE(check_path(x, 1, o, what + " f32"));
              if (bucket == 128) {
                ASSERT_NO_FATAL_FAILURE(check_path(as<c10::BFloat16>(x), 1, o, what + " bf16"));
                ASSERT_NO_FATAL_FAILURE(check_path(as<c10::Half>(x), 1, o, what + " f16"));
              }
            }
          }
        }
      }
    }
  }
}

TEST_F(CodecIsa, LargeInputEveryBitWidth) {
  const int64_t n = 1000003;
  const std::vector<float> x = random_values(n + 1, 5, 0);
  for (const auto& path : codec_isas()) {
    set_codec_isa(path);
    for (int bits = 1; bits <= 8; ++bits)
      ASSERT_NO_FATAL_FAILURE(check_path(x, 1, CodecOptions{bits, 128, true},
                                         path + " 10^6+3 bits=" + std::to_string(bits)));
  }
}

// What the codec does with non-finite and extreme input (documented in qsgd_codec.h).
TEST_F(CodecIsa, NonFiniteAndExtremeInputs) {
  for (const auto& path : codec_isas()) {
    set_codec_isa(path);
    const CodecOptions o{4, 8, true};
    std::vector<float> x = {1,        2,      3,     NAN,   5,      6, 7, 8,  // bucket 0: NaN
                            -0.0f,    -0.0f,  -0.0f, -0.0f, 0,      0, 0, 0,  // bucket 1: zeros
                            -3e38f,   3e38f,  0,     1,     2,      3, 4, 5,  // bucket 2: overflow
                            1e-45f,   2e-45f, 0,     0,     1e-45f, 0, 0, 3e-45f,  // 3: subnormal
                            INFINITY, 0,      0,     0,     0,      0, 0, 0};      // bucket 4: Inf
    std::vector<uint8_t> buf(size_t(encoded_bytes(int64_t(x.size()), o)));
    EXPECT_EQ(0, encode(x.data(), int64_t(x.size()), o, StreamKey{}, 0, buf.data())) << path;
    std::vector<float> y(x.size());
    EXPECT_EQ(0, decode(buf.data(), int64_t(x.size()), o, y.data())) << path;
    for (int i = 0; i < 8; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << path;
    for (int i = 8; i < 16; ++i) {  // zeros come back as +0 exactly
      EXPECT_EQ(0.0f, y[size_t(i)]) << path;
      EXPECT_FALSE(std::signbit(y[size_t(i)])) << path;
    }
    // unit = FLT_MAX: no NaN, the min exact, the top code lo + 15 * FLT_MAX overflows to +Inf
    for (int i = 16; i < 24; ++i) EXPECT_FALSE(std::isnan(y[size_t(i)])) << path << " " << i;
    EXPECT_EQ(-3e38f, y[16]) << path;
    // subnormal range: (hi - lo) / 15 underflows to 0, every value decodes to lo = 0
    for (int i = 24; i < 32; ++i) EXPECT_EQ(0.0f, y[size_t(i)]) << path << " " << i;
    for (int i = 32; i < 40; ++i) EXPECT_TRUE(std::isnan(y[size_t(i)])) << path;
  }
}

TEST_F(CodecIsa, UnknownPathIsRefusedNamingTheAvailableOnes) {
  try {
    set_codec_isa("sve");
    FAIL() << "set_codec_isa accepted 'sve'";
  } catch (const InvalidArgument& e) {
    EXPECT_NE(std::string(e.what()).find("generic"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace lockstep::compress
