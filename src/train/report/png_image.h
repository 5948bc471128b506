// train/report/png_image.h: an RGB raster with a few drawing primitives, and its PNG
// encoding (zlib's compress2 and crc32): enough for the trainer's loss curve without a
// plotting program.
//
// The PNG is 8-bit truecolor (color type 2), no interlace, every scanline with filter 0,
// one IDAT chunk; any PNG reader opens it. Coordinates are pixels, (0, 0) top left;
// drawing outside the image is clipped. Not thread-safe.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace lockstep::train {

struct Rgb {
  uint8_t r = 0, g = 0, b = 0;
  bool operator==(const Rgb& o) const { return r == o.r && g == o.g && b == o.b; }
  bool operator!=(const Rgb& o) const { return !(*this == o); }
};

class RgbImage {
 public:
  RgbImage(int width, int height, Rgb background = {255, 255, 255});

  int width() const { return width_; }
  int height() const { return height_; }
  const std::vector<uint8_t>& pixels() const { return pixels_; }  // row-major RGB bytes

  Rgb at(int x, int y) const;
  void set(int x, int y, Rgb c);
  void fill_rect(int x0, int y0, int x1, int y1, Rgb c);  // inclusive corners
  // A straight line (Bresenham) `thickness` pixels wide.
  void line(int x0, int y0, int x1, int y1, Rgb c, int thickness = 1);
  // Text in a 3x5 pixel font scaled by `scale`, top-left at (x, y). Knows digits, '.',
  // '-', '+', space and the lower-case letters a-z; other characters draw as a box.
  void text(int x, int y, const std::string& s, Rgb c, int scale = 2);
  static int text_width(const std::string& s, int scale = 2) { return int(s.size()) * 4 * scale; }

 private:
  int width_, height_;
  std::vector<uint8_t> pixels_;
};

// The PNG file's bytes.
std::string encode_png(const RgbImage& image);

}  // namespace lockstep::train
