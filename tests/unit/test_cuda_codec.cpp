// The CUDA QSGD codec against the CPU codec (needs a GPU; skips without one): for random
// inputs of sizes 0, 1, 127, 128, 129 and 10^6 + 3, every bit width and both rounding
// modes, the encoded bytes are identical, and decoding either side's bytes on either side
// (the CPU's bytes on the GPU, the GPU's on the CPU) gives identical floats (tolerance 0:
// bit-exact; the max difference is printed).
#include <lockstep/compress/cuda_codec.h>
#include <lockstep/compress/qsgd_codec.h>

#include <ATen/ATen.h>
#include <gtest/gtest.h>
#include <torch/cuda.h>

#include <cstdio>
#include <cstring>
#include <limits>
#include <vector>

using namespace lockstep::compress;

namespace {

#define NEED_GPU()                                    \
  if (!torch::cuda::is_available()) {                 \
    GTEST_SKIP() << "needs a CUDA GPU: none visible"; \
  }

const at::TensorOptions kCuda = at::TensorOptions().device(at::kCUDA);

// Encodes x (CPU float32) on both sides; returns {cpu bytes, gpu bytes}.
std::pair<std::vector<uint8_t>, std::vector<uint8_t>> both(const at::Tensor& x,
                                                           const CodecOptions& o,
                                                           const StreamKey& key) {
  const int64_t n = x.numel(), bytes = encoded_bytes(n, o);
  std::vector<uint8_t> cpu(size_t(bytes) + 1);
  const int64_t bad_cpu = encode(x.data_ptr<float>(), n, o, key, 5, cpu.data());
  auto xd = x.to(kCuda);
  auto out = at::full({bytes + 1}, 0xAB, kCuda.dtype(at::kByte));  // +1: nothing beyond
  auto bad = at::empty({1}, kCuda.dtype(at::kLong));
  lockstep::compress::cuda::encode(xd.data_ptr(), at::kFloat, n, o, key, 5, out.data_ptr<uint8_t>(),
                                   nullptr, bad.data_ptr<int64_t>());
  auto host = out.cpu();
  std::vector<uint8_t> gpu(host.data_ptr<uint8_t>(), host.data_ptr<uint8_t>() + bytes + 1);
  EXPECT_EQ(gpu[size_t(bytes)], 0xAB) << "wrote past encoded_bytes";
  EXPECT_EQ(bad.cpu().item<int64_t>(), bad_cpu);
  cpu.pop_back();
  gpu.pop_back();
  return {cpu, gpu};
}

at::Tensor random_input(int64_t n, int seed) {
  at::manual_seed(seed);
  auto x = at::randn({n}) * 3.0 + 0.25;
  if (n > 200) x.narrow(0, 130, 40).zero_();  // a constant bucket, with zeros
  return x;
}

TEST(CudaCodec, EncodeBytesEqualCpuEverySizeBitsRounding) {
  NEED_GPU();
  const StreamKey key{42, 7, 1, 2};
  for (int64_t n : {0, 1, 127, 128, 129, 1000003}) {
    const auto x = random_input(n, int(n % 1000));
    for (int bits = 1; bits <= 8; ++bits) {
      for (bool stochastic : {true, false}) {
        CodecOptions o;
        o.bits = bits;
        o.bucket_size = bits % 2 ? 100 : (n > 1000 ? 512 : 128);  // 100: a part-filled last group
        o.stochastic = stochastic;
        const auto [cpu, gpu] = both(x, o, key);
        int64_t differ = 0;
        for (size_t i = 0; i < cpu.size(); ++i) differ += cpu[i] != gpu[i];
        EXPECT_EQ(differ, 0) << "n " << n << " bits " << bits << " stochastic " << stochastic;
      }
    }
  }
}

// Every layout of the kernels (qsgd_codec.cu): 1, 2, 4, 8, 16 and 32 lanes a bucket
// (part-filled lane sets and last groups among them), a block per bucket above 256, and
// the decoder's flat grid over each: the CPU's bytes and floats.
TEST(CudaCodec, EncodeBytesEqualCpuEveryBucketLayout) {
  NEED_GPU();
  const StreamKey key{5, 3, 0, 1};
  for (int64_t n : {129, 100003}) {
    const auto x = random_input(n, 11);
    for (int64_t bucket : {1, 8, 13, 24, 64, 120, 256, 300, 2048}) {
      for (int bits : {1, 4, 8}) {
        CodecOptions o;
        o.bits = bits;
        o.bucket_size = bucket;
        const auto [cpu, gpu] = both(x, o, key);
        int64_t differ = 0;
        for (size_t i = 0; i < cpu.size(); ++i) differ += cpu[i] != gpu[i];
        EXPECT_EQ(differ, 0) << "n " << n << " bucket " << bucket << " bits " << bits;
        std::vector<float> ref(static_cast<size_t>(n));  // and decoded alike
        decode(cpu.data(), n, o, ref.data());
        auto in = at::from_blob(const_cast<uint8_t*>(cpu.data()), {int64_t(cpu.size())}, at::kByte)
                      .to(kCuda);
        auto y = at::empty({n}, kCuda);
        lockstep::compress::cuda::decode(in.data_ptr<uint8_t>(), n, o, y.data_ptr(), at::kFloat,
                                         nullptr);
        EXPECT_TRUE(at::equal(y.cpu(), at::from_blob(ref.data(), {n})))
            << "decode, n " << n << " bucket " << bucket << " bits " << bits;
      }
    }
  }
}

TEST(CudaCodec, DecodeEitherSideGivesTheSameFloats) {
  NEED_GPU();
  const StreamKey key{3, 1, 0, 1};
  for (int64_t n : {1, 129, 1000003}) {
    const auto x = random_input(n, 9);
    for (int bits : {1, 3, 4, 8}) {
      CodecOptions o;
      o.bits = bits;
      const auto [cpu_bytes, gpu_bytes] = both(x, o, key);
      std::vector<float> ref(static_cast<size_t>(n));
      decode(gpu_bytes.data(), n, o, ref.data());  // the GPU's bytes on the CPU
      auto in = at::from_blob(const_cast<uint8_t*>(cpu_bytes.data()), {int64_t(cpu_bytes.size())},
                              at::kByte)
                    .to(kCuda);
      auto y = at::empty({n}, kCuda);
      lockstep::compress::cuda::decode(in.data_ptr<uint8_t>(), n, o, y.data_ptr(), at::kFloat,
                                       nullptr);
      auto acc = at::ones({n}, kCuda);
      lockstep::compress::cuda::decode_add(in.data_ptr<uint8_t>(), n, o, acc.data_ptr<float>(),
                                           nullptr);
      std::vector<float> ref_acc(size_t(n), 1.0f);
      decode_add(gpu_bytes.data(), n, o, ref_acc.data());
      const auto r = at::from_blob(ref.data(), {n});
      const auto ra = at::from_blob(ref_acc.data(), {n});
      const double d = (y.cpu() - r).abs().max().item<double>();
      const double da = (acc.cpu() - ra).abs().max().item<double>();
      std::printf("n %lld bits %d: max |gpu decode - cpu decode| %g, decode_add %g\n", (long long)n,
                  bits, d, da);
      EXPECT_TRUE(at::equal(y.cpu(), r)) << "decode, n " << n << " bits " << bits;
      EXPECT_TRUE(at::equal(acc.cpu(), ra)) << "decode_add, n " << n << " bits " << bits;
    }
  }
}

TEST(CudaCodec, HalfInputsAndNonFiniteBuckets) {
  NEED_GPU();
  const StreamKey key{1, 2, 3, 1};
  CodecOptions o;
  auto x = random_input(1000, 4);
  x[300] = std::numeric_limits<float>::quiet_NaN();
  x[700] = std::numeric_limits<float>::infinity();
  for (auto dt : {at::kBFloat16, at::kHalf, at::kFloat}) {
    const auto xt = x.to(dt);
    const int64_t bytes = encoded_bytes(1000, o);
    std::vector<uint8_t> cpu(static_cast<size_t>(bytes));
    const int64_t bad_cpu = encode(xt.data_ptr(), dt, 1000, o, key, 0, cpu.data());
    EXPECT_EQ(bad_cpu, 2);
    auto out = at::empty({bytes}, kCuda.dtype(at::kByte));
    auto bad = at::empty({1}, kCuda.dtype(at::kLong));
    const auto xd = xt.to(kCuda);
    lockstep::compress::cuda::encode(xd.data_ptr(), dt, 1000, o, key, 0, out.data_ptr<uint8_t>(),
                                     nullptr, bad.data_ptr<int64_t>());
    EXPECT_EQ(bad.cpu().item<int64_t>(), bad_cpu);
    const auto host = out.cpu();
    EXPECT_EQ(std::memcmp(host.data_ptr(), cpu.data(), size_t(bytes)), 0) << c10::toString(dt);
  }
}

TEST(CudaCodec, RefusesWhatTheCpuCodecRefuses) {
  // Argument checks come before any CUDA call: no GPU needed.
  CodecOptions o;
  o.bits = 9;
  EXPECT_THROW(lockstep::compress::cuda::encode(nullptr, at::kFloat, 0, o, {}, 0, nullptr, nullptr),
               lockstep::InvalidArgument);
  o.bits = 4;
  EXPECT_THROW(
      lockstep::compress::cuda::encode(nullptr, at::kDouble, 0, o, {}, 0, nullptr, nullptr),
      lockstep::InvalidArgument);
  EXPECT_THROW(lockstep::compress::cuda::decode(nullptr, 10, o, nullptr, at::kFloat, nullptr),
               lockstep::InvalidArgument);
}

}  // namespace
