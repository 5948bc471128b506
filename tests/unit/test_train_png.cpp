// The loss-curve PNG is written in-process: a valid PNG (signature, IHDR, chunk CRCs,
// a zlib stream that inflates to the scanlines) with the plotted lines in it.
#include "train/report/loss_plot.h"
#include "train/report/png_image.h"

#include <gtest/gtest.h>
#include <zlib.h>

#include <unistd.h>
#include <filesystem>
#include <fstream>

using namespace lockstep::train;

namespace {

uint32_t be32(const std::string& s, size_t at) {
  return uint32_t(uint8_t(s[at])) << 24 | uint32_t(uint8_t(s[at + 1])) << 16 |
         uint32_t(uint8_t(s[at + 2])) << 8 | uint32_t(uint8_t(s[at + 3]));
}

struct Chunk {
  std::string type, data;
};

// Splits a PNG into chunks, checking the signature and every chunk's CRC.
std::vector<Chunk> chunks_of(const std::string& png) {
  std::vector<Chunk> out;
  EXPECT_EQ(png.substr(0, 8), std::string("\x89PNG\r\n\x1a\n", 8));
  size_t at = 8;
  while (at + 12 <= png.size()) {
    const uint32_t len = be32(png, at);
    EXPECT_LE(at + 12 + len, png.size());
    const std::string body = png.substr(at + 4, 4 + len);
    const uint32_t crc =
        uint32_t(::crc32(0L, reinterpret_cast<const Bytef*>(body.data()), uInt(body.size())));
    EXPECT_EQ(be32(png, at + 8 + len), crc) << "chunk " << body.substr(0, 4);
    out.push_back({body.substr(0, 4), body.substr(4)});
    at += 12 + len;
  }
  EXPECT_EQ(at, png.size());
  return out;
}

// The decoded RGB pixels of a PNG written by encode_png (filter 0 on every row).
std::vector<uint8_t> pixels_of(const std::string& png, int& width, int& height) {
  const auto chunks = chunks_of(png);
  EXPECT_GE(chunks.size(), 3u);
  EXPECT_EQ(chunks.front().type, "IHDR");
  EXPECT_EQ(chunks.back().type, "IEND");
  const std::string& ihdr = chunks.front().data;
  EXPECT_EQ(ihdr.size(), 13u);
  width = int(be32(ihdr, 0));
  height = int(be32(ihdr, 4));
  EXPECT_EQ(ihdr.substr(8), std::string("\x08\x02\x00\x00\x00", 5));  // 8-bit RGB, no interlace
  std::string idat;
  for (const auto& c : chunks)
    if (c.type == "IDAT") idat += c.data;
  std::vector<uint8_t> raw(size_t(width * 3 + 1) * size_t(height));
  uLongf raw_size = raw.size();
  EXPECT_EQ(uncompress(raw.data(), &raw_size, reinterpret_cast<const Bytef*>(idat.data()),
                       uLong(idat.size())),
            Z_OK);
  EXPECT_EQ(raw_size, raw.size());
  std::vector<uint8_t> rgb;
  for (int y = 0; y < height; ++y) {
    EXPECT_EQ(raw[size_t(y) * (width * 3 + 1)], 0) << "row " << y << " filter";
    const auto* row = &raw[size_t(y) * (width * 3 + 1) + 1];
    rgb.insert(rgb.end(), row, row + width * 3);
  }
  return rgb;
}

size_t count_color(const std::vector<uint8_t>& rgb, Rgb c) {
  size_t n = 0;
  for (size_t i = 0; i + 2 < rgb.size(); i += 3)
    n += rgb[i] == c.r && rgb[i + 1] == c.g && rgb[i + 2] == c.b;
  return n;
}

TEST(TrainPng, EncodesWhatWasDrawn) {
  RgbImage img(7, 3);
  img.set(2, 1, {10, 20, 30});
  img.set(99, 99, {1, 2, 3});  // clipped
  int w = 0, h = 0;
  const auto rgb = pixels_of(encode_png(img), w, h);
  ASSERT_EQ(w, 7);
  ASSERT_EQ(h, 3);
  ASSERT_EQ(rgb, img.pixels());
  EXPECT_EQ(img.at(2, 1), (Rgb{10, 20, 30}));
  EXPECT_EQ(count_color(rgb, {10, 20, 30}), 1u);
}

TEST(TrainPng, LossCurvesFromCsv) {
  const auto dir =
      std::filesystem::temp_directory_path() / ("lockstep_png_" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  for (int r = 0; r < 2; ++r) {
    std::ofstream f(dir / ("loss-rank-" + std::to_string(r) + ".csv"));
    f << "step,epoch,loss,lr,step_s\n";
    for (int s = 1; s <= 40; ++s)
      f << s << ",0," << 0.7 / (1 + 0.1 * s) + 0.01 * r << ",0.001,0.01\n";
  }
  const std::string png = (dir / "loss.png").string();
  ASSERT_TRUE(plot_loss_curves(dir.string(), 2, png));
  std::ifstream in(png, std::ios::binary);
  const std::string bytes((std::istreambuf_iterator<char>(in)), {});
  int w = 0, h = 0;
  const auto rgb = pixels_of(bytes, w, h);
  EXPECT_EQ(w, 900);
  EXPECT_EQ(h, 500);
  // Both ranks' lines are drawn (each in its colour, more than the legend's swatch), and
  // the axes and labels in black.
  EXPECT_GT(count_color(rgb, series_color(0)), 500u);
  EXPECT_GT(count_color(rgb, series_color(1)), 500u);
  EXPECT_GT(count_color(rgb, {0, 0, 0}), 800u);
  // Nothing to plot: no file, no failure.
  EXPECT_FALSE(plot_loss_curves((dir / "none").string(), 1, (dir / "none.png").string()));
  EXPECT_FALSE(std::filesystem::exists(dir / "none.png"));
  std::filesystem::remove_all(dir);
}

}  // namespace
