#include "train/report/png_image.h"

#include <lockstep/error.h>

#include <zlib.h>

#include <algorithm>
#include <cstdlib>

namespace lockstep::train {
namespace {

// 3x5 glyphs, five rows of three pixels ('#' set), top row first.
const char* glyph(char ch) {
  switch (ch) {
    case '0':
      return "####.##.##.####";
    case '1':
      return ".#.##..#..#.###";
    case '2':
      return "###..#####..###";
    case '3':
      return "###..####..####";
    case '4':
      return "#.##.####..#..#";
    case '5':
      return "####..###..####";
    case '6':
      return "####..####.####";
    case '7':
      return "###..#..#..#..#";
    case '8':
      return "####.#####.####";
    case '9':
      return "####.####..####";
    case '.':
      return ".............#.";
    case '-':
      return "......###......";
    case '+':
      return "....#.###.#....";
    case ' ':
      return "...............";
    case 'a':
      return "...###.#####.##";
    case 'b':
      return "#..#..####.####";
    case 'c':
      return "...####..#..###";
    case 'd':
      return "..#..#####.####";
    case 'e':
      return "...##########..";
    case 'f':
      return ".###..###.#..#.";
    case 'g':
      return "...####.####..#";
    case 'h':
      return "#..#..####.##.#";
    case 'i':
      return ".#.....#..#..#.";
    case 'j':
      return "..#.....#.#####";
    case 'k':
      return "#..#.###.#.##.#";
    case 'l':
      return "##..#..#..#.###";
    case 'm':
      return "...#########.##";
    case 'n':
      return "...##.#.##.##.#";
    case 'o':
      return "...####.##.####";
    case 'p':
      return "...####.#####..";
    case 'q':
      return "...####.####..#";
    case 'r':
      return "...####..#..#..";
    case 's':
      return "....###.#.###..";
    case 't':
      return ".#.###.#..#..##";
    case 'u':
      return "...#.##.##.####";
    case 'v':
      return "...#.##.##.#.#.";
    case 'w':
      return "...#.##.#######";
    case 'x':
      return "...#.#.#.#.##.#";
    case 'y':
      return "...#.####..####";
    case 'z':
      return "...###.#.#..###";
    default:
      return "####.##.##.####";
  }
}

void put_u32(std::string& out, uint32_t v) {
  for (int s = 24; s >= 0; s -= 8) out += char((v >> s) & 0xFF);
}

void put_chunk(std::string& out, const char type[4], const std::string& data) {
  put_u32(out, uint32_t(data.size()));
  std::string body(type, 4);
  body += data;
  out += body;
  const uLong crc = ::crc32(::crc32(0L, Z_NULL, 0), reinterpret_cast<const Bytef*>(body.data()),
                            uInt(body.size()));
  put_u32(out, uint32_t(crc));
}

}  // namespace

RgbImage::RgbImage(int width, int height, Rgb background)
    : width_(width),
      height_(height),
      pixels_(size_t(std::max(width, 0)) * size_t(std::max(height, 0)) * 3) {
  LOCKSTEP_CHECK(width > 0 && height > 0, "image size ", width, "x", height);
  fill_rect(0, 0, width - 1, height - 1, background);
}

Rgb RgbImage::at(int x, int y) const {
  LOCKSTEP_CHECK(x >= 0 && y >= 0 && x < width_ && y < height_, "pixel (", x, ", ", y,
                 ") outside the image");
  const uint8_t* p = &pixels_[(size_t(y) * size_t(width_) + size_t(x)) * 3];
  return {p[0], p[1], p[2]};
}

void RgbImage::set(int x, int y, Rgb c) {
  if (x < 0 || y < 0 || x >= width_ || y >= height_) return;
  uint8_t* p = &pixels_[(size_t(y) * size_t(width_) + size_t(x)) * 3];
  p[0] = c.r;
  p[1] = c.g;
  p[2] = c.b;
}

void RgbImage::fill_rect(int x0, int y0, int x1, int y1, Rgb c) {
  for (int y = std::max(0, std::min(y0, y1)); y <= std::min(height_ - 1, std::max(y0, y1)); ++y)
    for (int x = std::max(0, std::min(x0, x1)); x <= std::min(width_ - 1, std::max(x0, x1)); ++x)
      set(x, y, c);
}

void RgbImage::line(int x0, int y0, int x1, int y1, Rgb c, int thickness) {
  const int dx = std::abs(x1 - x0), dy = -std::abs(y1 - y0);
  const int sx = x0 < x1 ? 1 : -1, sy = y0 < y1 ? 1 : -1;
  const int lo = -(thickness - 1) / 2, hi = thickness / 2;
  int err = dx + dy;
  for (;;) {
    fill_rect(x0 + lo, y0 + lo, x0 + hi, y0 + hi, c);
    if (x0 == x1 && y0 == y1) break;
    const int e2 = 2 * err;
    if (e2 >= dy) {
      err += dy;
      x0 += sx;
    }
    if (e2 <= dx) {
      err += dx;
      y0 += sy;
    }
  }
}

void RgbImage::text(int x, int y, const std::string& s, Rgb c, int scale) {
  for (size_t i = 0; i < s.size(); ++i) {
    const char* g = glyph(s[i]);
    const int gx = x + int(i) * 4 * scale;
    for (int row = 0; row < 5; ++row)
      for (int col = 0; col < 3; ++col)
        if (g[row * 3 + col] == '#')
          fill_rect(gx + col * scale, y + row * scale, gx + (col + 1) * scale - 1,
                    y + (row + 1) * scale - 1, c);
  }
}

std::string encode_png(const RgbImage& image) {
  const size_t row = size_t(image.width()) * 3;
  std::string raw;
  raw.reserve((row + 1) * size_t(image.height()));
  for (int y = 0; y < image.height(); ++y) {
    raw += '\0';  // filter type 0: the row as is
    raw.append(reinterpret_cast<const char*>(image.pixels().data()) + size_t(y) * row, row);
  }
  uLongf packed_size = compressBound(uLong(raw.size()));
  std::string packed(packed_size, '\0');
  const int rc =
      compress2(reinterpret_cast<Bytef*>(&packed[0]), &packed_size,
                reinterpret_cast<const Bytef*>(raw.data()), uLong(raw.size()), Z_BEST_COMPRESSION);
  if (rc != Z_OK) throw Error("PNG encoding: zlib compress2 failed (" + std::to_string(rc) + ")");
  packed.resize(packed_size);

  std::string out("\x89PNG\r\n\x1a\n", 8);
  std::string ihdr;
  put_u32(ihdr, uint32_t(image.width()));
  put_u32(ihdr, uint32_t(image.height()));
  ihdr +=
      std::string("\x08\x02\x00\x00\x00", 5);  // 8 bits, truecolor, deflate, filter 0, no interlace
  put_chunk(out, "IHDR", ihdr);
  put_chunk(out, "IDAT", packed);
  put_chunk(out, "IEND", "");
  return out;
}

}  // namespace lockstep::train
