// Unit tests of the QSGD codec: sizes, exact cases, error bounds, unbiasedness, variance,
// determinism, dtypes, NaN/Inf marking. Bounds are stated per bucket in closed form
// (unit = (max - min) / (2^bits - 1)) and every test prints its worst ratio to the bound.
#include <lockstep/compress/qsgd_codec.h>

#include <c10/util/BFloat16.h>
#include <c10/util/Half.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <vector>

using namespace lockstep::compress;

namespace {

std::vector<float> gaussian(int64_t n, uint32_t seed, float scale = 1.0f) {
  std::mt19937 g(seed);
  std::normal_distribution<float> d(0.0f, scale);
  std::vector<float> x{};
  x.resize(static_cast<size_t>(n));
  for (auto& v : x) v = d(g);
  return x;
}

std::vector<float> roundtrip(const std::vector<float>& x, const CodecOptions& o, StreamKey k = {}) {
  std::vector<uint8_t> buf(size_t(encoded_bytes(int64_t(x.size()), o)));
  EXPECT_EQ(encode(x.data(), int64_t(x.size()), o, k, 0, buf.data()), -1);
  std::vector<float> y(x.size());
  EXPECT_EQ(decode(buf.data(), int64_t(x.size()), o, y.data()), -1);
  return y;
}

// Worst |y - x| / unit over buckets.
double worst_ratio(const std::vector<float>& x, const std::vector<float>& y,
                   const CodecOptions& o) {
  double worst = 0;
  for (size_t s = 0; s < x.size(); s += size_t(o.bucket_size)) {
    const size_t e = std::min(x.size(), s + size_t(o.bucket_size));
    float lo = x[s], hi = x[s];
    for (size_t i = s; i < e; ++i) lo = std::min(lo, x[i]), hi = std::max(hi, x[i]);
    const double unit = unit_for(lo, hi, o.bits);
    for (size_t i = s; i < e; ++i) {
      const double err = std::fabs(double(y[i]) - double(x[i]));
      if (unit == 0)
        EXPECT_EQ(err, 0.0) << "constant bucket must be exact";
      else
        worst = std::max(worst, err / unit);
    }
  }
  return worst;
}

TEST(CompressCodec, EncodedBytesClosedForm) {
  // n buckets * 8 bytes metadata + per bucket ceil(len/8)*bits code bytes, padded to 4.
  CodecOptions o{4, 128, true};
  EXPECT_EQ(encoded_bytes(0, o), 0);
  EXPECT_EQ(encoded_bytes(1, o), 8 + 4 + 0);  // 8 meta + 4 code bytes (8 slots * 4 bits)
  EXPECT_EQ(encoded_bytes(128, o), 8 + 64);
  EXPECT_EQ(encoded_bytes(129, o), 16 + 64 + 4);
  o.bits = 3;
  EXPECT_EQ(encoded_bytes(127, o), 8 + 48);   // ceil(127/8)=16 groups * 3 bytes
  EXPECT_EQ(encoded_bytes(9, o), 8 + 6 + 2);  // 14 -> padded to 16
  o = {1, 1, true};
  EXPECT_EQ(encoded_bytes(3, o), 28);  // 3*8 meta + 3*1 code bytes = 27 -> 28
  EXPECT_EQ(encoded_bytes(3, o) % 4, 0);
}

TEST(CompressCodec, ZerosConstantsAndOddSizesAreExactOrBounded) {
  for (int bits = 1; bits <= 8; ++bits)
    for (int64_t n : {0, 1, 7, 8, 127, 128, 129, 1000}) {
      CodecOptions o{bits, 128, true};
      std::vector<float> z(size_t(n), 0.0f), c(size_t(n), -3.25f);
      EXPECT_EQ(roundtrip(z, o), z) << "bits " << bits << " n " << n;
      EXPECT_EQ(roundtrip(c, o), c) << "bits " << bits << " n " << n;
      auto x = gaussian(n, uint32_t(n + bits));
      EXPECT_LT(worst_ratio(x, roundtrip(x, o), o), 1.0 + 1e-4);
    }
}

TEST(CompressCodec, ErrorBoundPerBitWidth) {
  auto x = gaussian(100003, 7, 0.01f);
  for (int bits = 1; bits <= 8; ++bits) {
    CodecOptions st{bits, 128, true}, det{bits, 128, false};
    const double rs = worst_ratio(x, roundtrip(x, st), st);
    const double rd = worst_ratio(x, roundtrip(x, det), det);
    std::printf("bits %d: max |err|/unit stochastic %.4f (bound 1), nearest %.4f (bound 0.5)\n",
                bits, rs, rd);
    EXPECT_LT(rs, 1.0 + 1e-4);
    EXPECT_LT(rd, 0.5 + 1e-4);
  }
}

TEST(CompressCodec, EightBitsCloseToLossless) {
  auto x = gaussian(65536, 3);
  CodecOptions o{8, 128, false};
  auto y = roundtrip(x, o);
  double worst = 0, range = 0;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, double(std::fabs(y[i] - x[i])));
  for (float v : x) range = std::max(range, double(std::fabs(v)));
  std::printf(
      "8 bits nearest: max abs err %.3g, max |x| %.3g (relative %.3g, bound 1/510 of bucket "
      "range)\n",
      worst, range, worst / range);
  EXPECT_LT(worst / range, 2.0 / 255);
}

TEST(CompressCodec, UnbiasedAndVarianceBound) {
  // Mean over K independent encodings -> x; per-element variance <= unit^2/4.
  const int64_t n = 512;
  const int K = 4000;
  auto x = gaussian(n, 11);
  for (int bits : {1, 2, 4}) {
    CodecOptions o{bits, 128, true};
    std::vector<double> sum(size_t(n), 0), sq(size_t(n), 0);
    std::vector<uint8_t> buf(size_t(encoded_bytes(n, o)));
    std::vector<float> y(static_cast<size_t>(n));
    for (int k = 0; k < K; ++k) {
      encode(x.data(), n, o, StreamKey{42, uint64_t(k), 0, 1}, 0, buf.data());
      decode(buf.data(), n, o, y.data());
      for (int64_t i = 0; i < n; ++i) {
        const double e = double(y[size_t(i)]) - x[size_t(i)];
        sum[size_t(i)] += e;
        sq[size_t(i)] += e * e;
      }
    }
    double worst_z = 0, worst_var = 0;
    for (int64_t b = 0; b < n; b += 128) {
      float lo = x[size_t(b)], hi = lo;
      for (int64_t i = b; i < b + 128; ++i)
        lo = std::min(lo, x[size_t(i)]), hi = std::max(hi, x[size_t(i)]);
      const double unit = unit_for(lo, hi, bits);
      for (int64_t i = b; i < b + 128; ++i) {
        const double mean = sum[size_t(i)] / K;
        const double var = sq[size_t(i)] / K - mean * mean;
        // |mean error| <= 5 sigma of the mean, sigma <= unit/2/sqrt(K)
        worst_z = std::max(worst_z, std::fabs(mean) / (unit / 2 / std::sqrt(double(K))));
        worst_var = std::max(worst_var, var / (unit * unit / 4));
      }
    }
    std::printf(
        "bits %d: worst |mean err| = %.2f sigma-bounds (limit 5), worst var/(unit^2/4) = %.3f "
        "(limit 1)\n",
        bits, worst_z, worst_var);
    EXPECT_LT(worst_z, 5.0);
    EXPECT_LT(worst_var, 1.05);  // sampling noise of the variance estimate
  }
}

TEST(CompressCodec, DeterministicForFixedKey) {
  auto x = gaussian(1000, 5);
  CodecOptions o{3, 64, true};
  std::vector<uint8_t> a(size_t(encoded_bytes(1000, o))), b(a.size()), c(a.size());
  encode(x.data(), 1000, o, {1, 2, 3, 1}, 10, a.data());
  encode(x.data(), 1000, o, {1, 2, 3, 1}, 10, b.data());
  encode(x.data(), 1000, o, {1, 3, 3, 1}, 10, c.data());
  EXPECT_EQ(a, b);
  EXPECT_NE(a, c);
  // Encoding the second half alone with the right first_bucket gives the same codes.
  std::vector<uint8_t> h(size_t(encoded_bytes(500, o)));
  encode(x.data() + 512, 488, o, {1, 2, 3, 1}, 10 + 8, h.data());
  std::vector<float> full(1000), half(488);
  decode(a.data(), 1000, o, full.data());
  decode(h.data(), 488, o, half.data());
  for (int i = 0; i < 488; ++i) ASSERT_EQ(full[size_t(512 + i)], half[size_t(i)]);
}

TEST(CompressCodec, HalfAndBFloat16Inputs) {
  auto x = gaussian(5000, 9, 1e-3f);  // small values: scales would underflow fp16 metadata
  CodecOptions o{4, 128, true};
  for (auto dt : {c10::kBFloat16, c10::kHalf}) {
    std::vector<uint16_t> raw(x.size());
    std::vector<float> xf(x.size());
    for (size_t i = 0; i < x.size(); ++i) {
      if (dt == c10::kBFloat16) {
        c10::BFloat16 v(x[i]);
        std::memcpy(&raw[i], &v, 2);
        xf[i] = float(v);
      } else {
        c10::Half v(x[i]);
        std::memcpy(&raw[i], &v, 2);
        xf[i] = float(v);
      }
    }
    std::vector<uint8_t> a(size_t(encoded_bytes(5000, o))), b(a.size());
    encode(raw.data(), dt, 5000, o, {}, 0, a.data());
    encode(xf.data(), 5000, o, {}, 0, b.data());
    EXPECT_EQ(a, b) << "16-bit input must encode exactly as its float32 value";
    std::vector<uint16_t> out(x.size());
    decode(a.data(), 5000, o, out.data(), dt);
    std::vector<float> yf(x.size());
    decode(a.data(), 5000, o, yf.data());
    for (size_t i = 0; i < x.size(); ++i) {
      float back;
      if (dt == c10::kBFloat16) {
        c10::BFloat16 v;
        std::memcpy(&v, &out[i], 2);
        back = float(v);
      } else {
        c10::Half v;
        std::memcpy(&v, &out[i], 2);
        back = float(v);
      }
      ASSERT_NEAR(back, yf[i], std::fabs(yf[i]) * 1e-2 + 1e-7);
    }
  }
}

TEST(CompressCodec, NanAndInfAreMarked) {
  auto x = gaussian(1000, 1);
  x[300] = NAN;
  x[900] = INFINITY;
  CodecOptions o{4, 128, true};
  std::vector<uint8_t> buf(size_t(encoded_bytes(1000, o)));
  EXPECT_EQ(encode(x.data(), 1000, o, {}, 0, buf.data()), 2);  // bucket of element 300
  std::vector<float> y(1000);
  EXPECT_EQ(decode(buf.data(), 1000, o, y.data()), 2);
  EXPECT_TRUE(std::isnan(y[256]) && std::isnan(y[383]) && std::isnan(y[900]));
  EXPECT_FALSE(std::isnan(y[0]) || std::isnan(y[400]));
  EXPECT_FALSE(all_finite(x.data(), 1000));
  x[300] = 0;
  x[900] = 0;
  EXPECT_TRUE(all_finite(x.data(), 1000));
}

TEST(CompressCodec, RejectsBadOptions) {
  std::vector<float> x(10);
  std::vector<uint8_t> buf(1024);
  EXPECT_THROW(encode(x.data(), 10, CodecOptions{9, 128, true}, {}, 0, buf.data()),
               lockstep::InvalidArgument);
  EXPECT_THROW(encode(x.data(), 10, CodecOptions{4, 0, true}, {}, 0, buf.data()),
               lockstep::InvalidArgument);
}

}  // namespace
