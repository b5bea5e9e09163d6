#include "tessera/app/dataset.hpp"

#include <algorithm>
#include <array>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <new>
#include <optional>
#include <random>
#include <system_error>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
// zlib then declares its input pointers const, so a buffer in memory needs no cast.
#define ZLIB_CONST
#include <zlib.h>

#include "half.hpp"
#include "input_file.hpp"
#include "json_reader.hpp"
#include "safetensors.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

constexpr unsigned char kGzipMagic0 = 0x1f;
constexpr unsigned char kGzipMagic1 = 0x8b;
constexpr unsigned char kIdxUnsignedByte = 0x08;
constexpr std::size_t kChunkBytes = std::size_t{1} << 16;

[[noreturn]] void throwUnreadable(const std::string& path, int error) {
  throw IoError(ErrorCode::FileUnreadable, path,
                fmt::format("cannot read the file: {}", std::generic_category().message(error)));
}

[[noreturn]] void throwCorrupt(const std::string& path, std::string_view message) {
  throw IoError(ErrorCode::CorruptDataset, path, message);
}

struct FileCloser {
  void operator()(std::FILE* file) const noexcept { std::fclose(file); }
};

// The bytes of a file or of a buffer in memory, inflated when they start
// with the gzip magic. A file is read in fixed chunks, so memory stays bounded
// whatever it holds; offsets in messages are those of the (inflated) data.
class ByteSource {
 public:
  explicit ByteSource(const std::string& path) : name_(path), input_(kChunkBytes) {
    detail::InputFile file(path);
    errno = 0;
    file_.reset(::fdopen(file.fd(), "rb"));
    if (!file_) throwUnreadable(path, errno);
    file.release();
    stream_.next_in = input_.data();
    start();
  }
  // `bytes` must outlive the source; inflate reads them in place.
  ByteSource(std::span<const unsigned char> bytes, std::string name)
      : name_(std::move(name)), memory_(bytes) {
    stream_.next_in = bytes.data();
    start();
  }
  ByteSource(const ByteSource&) = delete;
  ByteSource& operator=(const ByteSource&) = delete;
  ~ByteSource() {
    if (gzip_) inflateEnd(&stream_);
  }

  // The file, or the name the caller gave the buffer.
  const std::string& name() const noexcept { return name_; }
  bool gzip() const noexcept { return gzip_; }
  // Bytes of data delivered so far.
  uint64_t offset() const noexcept { return delivered_; }

  // Fills `out` and returns its size, or fewer bytes at the end of the data.
  std::size_t read(std::span<unsigned char> out) {
    const std::size_t n = gzip_ ? inflateInto(out) : copyInto(out);
    delivered_ += n;
    return n;
  }

 private:
  void start() {
    stream_.avail_in = 0;
    while (stream_.avail_in < 2 && refill()) {
    }
    gzip_ = startsWithGzipMagic();
    // 15 + 16: the largest window, gzip framing only. It fails only for want of memory.
    if (gzip_ && inflateInit2(&stream_, 15 + 16) != Z_OK) throw std::bad_alloc();
  }

  // Makes more input available after the unread input; false at the end of
  // the data.
  bool refill() { return file_ ? refillFromFile() : refillFromMemory(); }

  // Moves the unread input to the front of the buffer and appends what the
  // file holds next.
  bool refillFromFile() {
    if (eof_) return false;
    std::memmove(input_.data(), stream_.next_in, stream_.avail_in);
    stream_.next_in = input_.data();
    const std::size_t space = input_.size() - stream_.avail_in;
    errno = 0;
    const std::size_t n = std::fread(input_.data() + stream_.avail_in, 1, space, file_.get());
    if (n < space) {
      if (std::ferror(file_.get())) throwUnreadable(name_, errno);
      eof_ = true;
    }
    stream_.avail_in += static_cast<uInt>(n);
    inputBytes_ += n;
    return n > 0;
  }

  // The unread input always ends where `memory_` begins, so making more of
  // the buffer available only moves that boundary; zlib counts input in
  // uInt, hence the steps.
  bool refillFromMemory() {
    const std::size_t n =
        std::min<std::size_t>(memory_.size(), std::numeric_limits<uInt>::max() - stream_.avail_in);
    stream_.avail_in += static_cast<uInt>(n);
    memory_ = memory_.subspan(n);
    inputBytes_ += n;
    return n > 0;
  }

  bool startsWithGzipMagic() const noexcept {
    return stream_.avail_in >= 2 && stream_.next_in[0] == kGzipMagic0 && stream_.next_in[1] == kGzipMagic1;
  }

  // Offset in the input of the next compressed byte inflate would read.
  uint64_t compressedOffset() const noexcept { return inputBytes_ - stream_.avail_in; }

  std::size_t copyInto(std::span<unsigned char> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      if (stream_.avail_in == 0 && !refill()) break;
      const std::size_t n = std::min<std::size_t>(stream_.avail_in, out.size() - done);
      std::copy_n(stream_.next_in, n, out.data() + done);
      stream_.next_in += n;
      stream_.avail_in -= static_cast<uInt>(n);
      done += n;
    }
    return done;
  }

  std::size_t inflateInto(std::span<unsigned char> out) {
    std::size_t done = 0;
    while (done < out.size()) {
      if (memberEnded_) {
        // gzip allows several members back to back; anything else after the
        // end of a member is damage.
        if (stream_.avail_in == 0 && !refill()) break;
        while (stream_.avail_in < 2 && refill()) {
        }
        if (!startsWithGzipMagic()) {
          throwCorrupt(name_, fmt::format("unexpected bytes after the end of the gzip stream at compressed "
                                          "byte offset {}",
                                          compressedOffset()));
        }
        inflateReset(&stream_);
        memberEnded_ = false;
      }
      if (stream_.avail_in == 0 && !refill()) {
        throwCorrupt(name_,
                     fmt::format("the gzip stream is truncated: the file ends at compressed byte offset "
                                 "{} (after {} bytes of data) before the stream's end",
                                 compressedOffset(), delivered_ + done));
      }
      const std::size_t space = std::min<std::size_t>(out.size() - done, std::numeric_limits<uInt>::max());
      stream_.next_out = out.data() + done;
      stream_.avail_out = static_cast<uInt>(space);
      const int status = inflate(&stream_, Z_NO_FLUSH);
      done += space - stream_.avail_out;
      if (status == Z_STREAM_END) {
        memberEnded_ = true;
      } else if (status != Z_OK && status != Z_BUF_ERROR) {
        // Z_BUF_ERROR only means inflate needs more input, which the loop
        // provides; anything else is a damaged stream.
        throwCorrupt(name_, fmt::format("corrupt gzip stream near compressed byte offset {}: {}",
                                        compressedOffset(), stream_.msg ? stream_.msg : zError(status)));
      }
    }
    return done;
  }

  std::string name_;
  std::unique_ptr<std::FILE, FileCloser> file_;
  std::vector<unsigned char> input_;     // the file's chunk buffer
  std::span<const unsigned char> memory_;  // the buffer's bytes not yet given to zlib
  z_stream stream_{};
  bool gzip_ = false;
  bool eof_ = false;
  bool memberEnded_ = false;
  uint64_t inputBytes_ = 0;
  uint64_t delivered_ = 0;
};

// One kind of IDX file tessera reads.
struct IdxKind {
  std::string_view what;  // "image", "label"
  int dimensions;
  std::array<std::string_view, 3> dimensionNames;
};

constexpr IdxKind kImageFile{"image", 3, {"count", "rows", "cols"}};
constexpr IdxKind kLabelFile{"label", 1, {"count", "", ""}};

std::string_view dataTypeName(unsigned code) {
  switch (code) {
    case 0x08: return "unsigned byte";
    case 0x09: return "signed byte";
    case 0x0B: return "int16";
    case 0x0C: return "int32";
    case 0x0D: return "float32";
    case 0x0E: return "float64";
    default: return "unknown";
  }
}

// An opened IDX file whose header has been checked: the dimensions are
// positive and their product is at most the limit.
struct IdxHeader {
  std::array<int64_t, 3> dims{};
  int64_t items = 0;
  int64_t headerBytes = 0;
};

IdxHeader readIdxHeader(ByteSource& source, const IdxKind& kind, int64_t maxItems) {
  const std::string& path = source.name();
  const uint32_t expectedMagic = (uint32_t{kIdxUnsignedByte} << 8) | static_cast<uint32_t>(kind.dimensions);
  std::array<unsigned char, 4> magic{};
  const std::size_t got = source.read(magic);
  if (got < magic.size()) {
    throwCorrupt(path, fmt::format("the data is {} bytes long, too short for the 4-byte IDX magic 0x{:08x}",
                                   got, expectedMagic));
  }
  const uint32_t found = (uint32_t{magic[0]} << 24) | (uint32_t{magic[1]} << 16) | (uint32_t{magic[2]} << 8) |
                         uint32_t{magic[3]};
  if (magic[0] != 0 || magic[1] != 0) {
    throwCorrupt(path,
                 fmt::format("not an IDX file: expected the IDX magic 0x{:08x} ({} file of unsigned bytes), "
                             "found 0x{:08x}",
                             expectedMagic, kind.what, found));
  }
  if (magic[2] != kIdxUnsignedByte) {
    throwCorrupt(
        path,
        fmt::format("IDX data type 0x{:02x} ({}) is not supported; expected 0x{:02x} (unsigned "
                    "byte) in magic 0x{:08x}",
                    unsigned{magic[2]}, dataTypeName(magic[2]), unsigned{kIdxUnsignedByte}, expectedMagic));
  }
  if (magic[3] != kind.dimensions) {
    throwCorrupt(path, fmt::format("expected a {} file with {} dimension{} (magic 0x{:08x}), found {} "
                                   "dimension{} (magic 0x{:08x})",
                                   kind.what, kind.dimensions, kind.dimensions == 1 ? "" : "s", expectedMagic,
                                   unsigned{magic[3]}, magic[3] == 1 ? "" : "s", found));
  }

  IdxHeader header;
  header.headerBytes = 4 + 4 * kind.dimensions;
  uint64_t items = 1;
  bool overflow = false;
  for (int d = 0; d < kind.dimensions; ++d) {
    std::array<unsigned char, 4> bytes{};
    const uint64_t at = source.offset();
    if (source.read(bytes) < bytes.size()) {
      throwCorrupt(path,
                   fmt::format("the header is truncated: it needs {} bytes for {} dimensions but the data "
                               "ends at byte offset {}",
                               header.headerBytes, kind.dimensions, source.offset()));
    }
    const uint32_t size = (uint32_t{bytes[0]} << 24) | (uint32_t{bytes[1]} << 16) |
                          (uint32_t{bytes[2]} << 8) | uint32_t{bytes[3]};
    if (size == 0) {
      throwCorrupt(
          path, fmt::format("dimension {} ({}) at byte offset {} is 0; every dimension must be at least 1", d,
                            kind.dimensionNames[static_cast<std::size_t>(d)], at));
    }
    header.dims[static_cast<std::size_t>(d)] = size;
    overflow = overflow || __builtin_mul_overflow(items, uint64_t{size}, &items);
  }
  const std::string shape = kind.dimensions == 3 ? fmt::format("{} images of {}x{} pixels", header.dims[0],
                                                               header.dims[1], header.dims[2])
                                                 : fmt::format("{} labels", header.dims[0]);
  if (overflow) {
    throwCorrupt(path, fmt::format("the header declares {}, a size that overflows 64 bits", shape));
  }
  if (items > static_cast<uint64_t>(std::max<int64_t>(maxItems, 0))) {
    throwCorrupt(path, fmt::format("the header declares {} = {} bytes of data, more than the limit of {} "
                                   "(maxItems); a damaged header, or a dataset larger than this reader "
                                   "accepts",
                                   shape, items, maxItems));
  }
  header.items = static_cast<int64_t>(items);
  return header;
}

// Reads the header's items, passing each chunk of bytes and the index of its
// first item to `consume`, then checks that the data ends there.
template <class Consume>
void readIdxItems(ByteSource& source, const IdxHeader& header, Consume&& consume) {
  const std::string& path = source.name();
  std::array<unsigned char, kChunkBytes> chunk{};
  const uint64_t items = static_cast<uint64_t>(header.items);
  uint64_t done = 0;
  while (done < items) {
    const std::size_t want = static_cast<std::size_t>(std::min<uint64_t>(chunk.size(), items - done));
    const std::size_t got = source.read(std::span(chunk).first(want));
    if (got < want) {
      throwCorrupt(path, fmt::format("the file is truncated: the header declares {} bytes of data after the "
                                     "{}-byte header, but the {}data ends at byte offset {} after {} of them",
                                     items, header.headerBytes, source.gzip() ? "inflated " : "",
                                     source.offset(), done + got));
    }
    consume(std::span<const unsigned char>(chunk.data(), got), done);
    done += got;
  }
  std::array<unsigned char, 1> extra{};
  if (source.read(extra) != 0) {
    throwCorrupt(path,
                 fmt::format("unexpected bytes after the last item: the header declares {} bytes of data, so "
                             "the {}data should end at byte offset {}",
                             items, source.gzip() ? "inflated " : "",
                             static_cast<uint64_t>(header.headerBytes) + items));
  }
}

constexpr std::array<float, 256> kByteToUnit = [] {
  std::array<float, 256> table{};
  for (std::size_t b = 0; b < table.size(); ++b) table[b] = static_cast<float>(b) / 255.0f;
  return table;
}();

// Makes room for `needed` values, growing geometrically up to `declared`:
// values are stored as the data arrives, so a header that claims more than
// the data holds costs at most twice the data actually present.
template <class T>
void reserveFor(std::vector<T>& values, std::size_t needed, int64_t declared) {
  if (needed <= values.capacity()) return;
  values.reserve(std::min(static_cast<std::size_t>(declared), std::max(needed, 2 * values.capacity())));
}

IdxImages readImages(ByteSource& source, int64_t maxItems) {
  const IdxHeader header = readIdxHeader(source, kImageFile, maxItems);
  IdxImages images;
  images.count = header.dims[0];
  images.rows = header.dims[1];
  images.cols = header.dims[2];
  std::vector<float>& pixels = images.pixels;
  readIdxItems(source, header, [&](std::span<const unsigned char> bytes, uint64_t first) {
    reserveFor(pixels, static_cast<std::size_t>(first) + bytes.size(), header.items);
    for (const unsigned char b : bytes) pixels.push_back(kByteToUnit[b]);
  });
  return images;
}

std::vector<int32_t> readLabels(ByteSource& source, int32_t numClasses, int64_t maxItems) {
  const IdxHeader header = readIdxHeader(source, kLabelFile, maxItems);
  std::vector<int32_t> labels;
  readIdxItems(source, header, [&](std::span<const unsigned char> bytes, uint64_t first) {
    reserveFor(labels, static_cast<std::size_t>(first) + bytes.size(), header.items);
    for (std::size_t i = 0; i < bytes.size(); ++i) {
      const int32_t label = bytes[i];
      if (label >= numClasses) {
        throwCorrupt(source.name(),
                     fmt::format("label {} of sample {} (byte offset {}) is outside 0..{}", label, first + i,
                                 static_cast<uint64_t>(header.headerBytes) + first + i, numClasses - 1));
      }
      labels.push_back(label);
    }
  });
  return labels;
}

// ---------------------------------------------------------------------------
// Deterministic random numbers. The engines' outputs are fixed by their
// definitions; the distributions of <random> are not, so the mapping to
// ranges is done here.

uint64_t mix64(uint64_t x) noexcept {
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

constexpr uint64_t kGolden = 0x9e3779b97f4a7c15ULL;

// One 64-bit seed per (seed, stream), so that streams never overlap in practice.
uint64_t streamSeed(int64_t seed, uint64_t stream) noexcept {
  return mix64(mix64(static_cast<uint64_t>(seed) + kGolden) ^ mix64(stream + kGolden));
}

// SplitMix64: several times faster than std::mt19937_64, which matters for
// the tens of millions of noise bytes of the synthetic set.
class SplitMix64 {
 public:
  explicit SplitMix64(uint64_t seed) noexcept : state_(seed) {}
  uint64_t operator()() noexcept { return mix64(state_ += kGolden); }

 private:
  uint64_t state_;
};

// Uniform in [0, bound), bound >= 1: draws at or above the largest multiple
// of `bound` are rejected so that every value is equally likely.
template <class Generator>
uint64_t uniformBelow(Generator& generator, uint64_t bound) noexcept {
  constexpr uint64_t kMax = std::numeric_limits<uint64_t>::max();
  const uint64_t limit = kMax - kMax % bound;
  uint64_t x = 0;
  do {
    x = generator();
  } while (x >= limit);
  return x % bound;
}

// Uniform in [0, 1) from 16 bits, exactly representable as a float.
float unit16(uint64_t bits) noexcept { return static_cast<float>(bits & 0xffffu) * (1.0f / 65536.0f); }

// Synthetic streams: one for the prototypes, one per split.
constexpr uint64_t kPrototypeStream = 1;
constexpr uint64_t kTrainStream = 2;
constexpr uint64_t kTestStream = 3;
// Epoch orders use streams from here on.
constexpr uint64_t kEpochStreamBase = uint64_t{1} << 32;

// Prototype cells are 4x4 pixels, so classes differ in shapes, not in single pixels.
constexpr int64_t kCellPixels = 4;
constexpr float kNoiseAmplitude = 0.5f;
constexpr float kMinBrightness = 0.6f;

using Prototypes = std::vector<float>;  // kNumClasses x rows x cols

Prototypes makePrototypes(int64_t seed) {
  SplitMix64 generator(streamSeed(seed, kPrototypeStream));
  const int64_t cellCols = kImageCols / kCellPixels;
  std::vector<float> cells(static_cast<std::size_t>(kImageRows / kCellPixels * cellCols));
  Prototypes prototypes(static_cast<std::size_t>(kNumClasses * kImageRows * kImageCols));
  for (int64_t c = 0; c < kNumClasses; ++c) {
    for (float& cell : cells) cell = unit16(generator());
    float* image = prototypes.data() + c * kImageRows * kImageCols;
    for (int64_t r = 0; r < kImageRows; ++r) {
      for (int64_t col = 0; col < kImageCols; ++col) {
        const int64_t cell = (r / kCellPixels) * cellCols + col / kCellPixels;
        image[r * kImageCols + col] = cells[static_cast<std::size_t>(cell)];
      }
    }
  }
  return prototypes;
}

DatasetSplit makeSyntheticSplit(const Prototypes& prototypes, int64_t seed, uint64_t stream, int64_t count) {
  constexpr int64_t kPixels = kImageRows * kImageCols;
  constexpr int64_t kPixelsPerDraw = 4;  // two noise bytes each
  static_assert(kPixels % kPixelsPerDraw == 0);
  constexpr float kNoisePerUnit = kNoiseAmplitude / 255.0f;
  DatasetSplit split;
  split.count = count;
  split.images.resize(static_cast<std::size_t>(count * kPixels));
  split.labels.resize(static_cast<std::size_t>(count));
  SplitMix64 generator(streamSeed(seed, stream));
  for (int64_t i = 0; i < count; ++i) {
    const auto label = static_cast<int32_t>(uniformBelow(generator, kNumClasses));
    split.labels[static_cast<std::size_t>(i)] = label;
    const float brightness = kMinBrightness + (1.0f - kMinBrightness) * unit16(generator());
    const float* prototype = prototypes.data() + label * kPixels;
    float* image = split.images.data() + i * kPixels;
    for (int64_t p = 0; p < kPixels; p += kPixelsPerDraw) {
      uint64_t bits = generator();
      for (int64_t k = 0; k < kPixelsPerDraw; ++k, bits >>= 16) {
        // The sum of two uniform bytes: triangular noise in [-amplitude, amplitude].
        const auto sum = static_cast<int>(bits & 0xffu) + static_cast<int>((bits >> 8) & 0xffu) - 255;
        const float value = brightness * prototype[p + k] + static_cast<float>(sum) * kNoisePerUnit;
        image[p + k] = std::clamp(value, 0.0f, 1.0f);
      }
    }
  }
  return split;
}

// ---------------------------------------------------------------------------
// IDX datasets in a folder.

struct IdxFileSet {
  std::string trainImages, trainLabels, testImages, testLabels;
};

constexpr std::array<std::string_view, 4> kIdxBaseNames = {
    "train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"};

bool isFile(const std::filesystem::path& path) {
  std::error_code error;
  return std::filesystem::is_regular_file(path, error);
}

// The four files in `folder` (each raw or .gz; raw preferred when both
// exist), or the names of those missing.
std::pair<std::optional<IdxFileSet>, std::vector<std::string>> findIdxFiles(const std::string& folder) {
  std::array<std::string, 4> found;
  std::vector<std::string> missing;
  for (std::size_t i = 0; i < kIdxBaseNames.size(); ++i) {
    const std::filesystem::path raw = std::filesystem::path(folder) / std::string(kIdxBaseNames[i]);
    std::filesystem::path gz = raw;
    gz += ".gz";
    if (isFile(raw)) {
      found[i] = raw.string();
    } else if (isFile(gz)) {
      found[i] = gz.string();
    } else {
      missing.push_back(fmt::format("{}[.gz]", kIdxBaseNames[i]));
    }
  }
  if (!missing.empty()) return {std::nullopt, std::move(missing)};
  return {IdxFileSet{found[0], found[1], found[2], found[3]}, {}};
}

void requireMnistShape(const DatasetSplit& split, const std::string& path) {
  if (split.rows == kImageRows && split.cols == kImageCols) return;
  throwCorrupt(path, fmt::format("images are {}x{} pixels but MNIST-style datasets have {}x{}", split.rows,
                                 split.cols, kImageRows, kImageCols));
}

Dataset readIdxDataset(const IdxFileSet& files) {
  Dataset dataset;
  dataset.train = readIdxSplit(files.trainImages, files.trainLabels);
  requireMnistShape(dataset.train, files.trainImages);
  dataset.test = readIdxSplit(files.testImages, files.testLabels);
  requireMnistShape(dataset.test, files.testImages);
  return dataset;
}

std::string joined(const std::vector<std::string>& names) {
  return fmt::format("{}", fmt::join(names, ", "));
}

[[noreturn]] void throwMissingFiles(std::string_view dataset, const std::string& folder,
                                    const std::vector<std::string>& missing) {
  throw ConfigError(
      ErrorCode::InvalidData, "/data/path",
      fmt::format("the {} IDX files are not in \"{}\": missing {}; set /data/path to the folder "
                  "holding {{train,t10k}}-{{images-idx3,labels-idx1}}-ubyte[.gz]",
                  dataset, folder, joined(missing)));
}

void keepFirst(DatasetSplit& split, int64_t limit, std::string_view field) {
  if (limit < 0) {
    throw ConfigError(ErrorCode::OutOfRange, fmt::format("/data/{}", field),
                      fmt::format("{} is {}; it must be >= 0 (0 keeps every sample)", field, limit));
  }
  if (limit == 0 || limit >= split.count) return;
  split.count = limit;
  split.images.resize(static_cast<std::size_t>(limit * split.sampleElements()));
  split.images.shrink_to_fit();
  split.labels.resize(static_cast<std::size_t>(limit));
  split.labels.shrink_to_fit();
}

int64_t syntheticSize(int64_t limit, int64_t full) { return limit > 0 ? std::min(limit, full) : full; }

}  // namespace

IdxImages readIdxImages(const std::string& path, int64_t maxItems) {
  ByteSource source(path);
  return readImages(source, maxItems);
}

std::vector<int32_t> readIdxLabels(const std::string& path, int32_t numClasses, int64_t maxItems) {
  ByteSource source(path);
  return readLabels(source, numClasses, maxItems);
}

IdxImages parseIdxImages(std::span<const unsigned char> bytes, const std::string& name, int64_t maxItems) {
  ByteSource source(bytes, name);
  return readImages(source, maxItems);
}

std::vector<int32_t> parseIdxLabels(std::span<const unsigned char> bytes, const std::string& name,
                                    int32_t numClasses, int64_t maxItems) {
  ByteSource source(bytes, name);
  return readLabels(source, numClasses, maxItems);
}

DatasetSplit readIdxSplit(const std::string& imagesPath, const std::string& labelsPath, int64_t maxItems) {
  IdxImages images = readIdxImages(imagesPath, maxItems);
  std::vector<int32_t> labels = readIdxLabels(labelsPath, kNumClasses, maxItems);
  if (static_cast<int64_t>(labels.size()) != images.count) {
    throwCorrupt(labelsPath,
                 fmt::format("holds {} labels but {} holds {} images; the two files must describe the "
                             "same samples",
                             labels.size(), imagesPath, images.count));
  }
  DatasetSplit split;
  split.count = images.count;
  split.rows = images.rows;
  split.cols = images.cols;
  split.images = std::move(images.pixels);
  split.labels = std::move(labels);
  return split;
}

Dataset makeSyntheticDataset(int64_t seed, int64_t trainSamples, int64_t testSamples) {
  if (trainSamples < 0 || testSamples < 0) {
    throw ConfigError(
        ErrorCode::OutOfRange, "makeSyntheticDataset",
        fmt::format("sample counts must be >= 0, found {} train and {} test", trainSamples, testSamples));
  }
  const Prototypes prototypes = makePrototypes(seed);
  Dataset dataset;
  dataset.train = makeSyntheticSplit(prototypes, seed, kTrainStream, trainSamples);
  dataset.test = makeSyntheticSplit(prototypes, seed, kTestStream, testSamples);
  dataset.source = fmt::format("Synthetic (seed {})", seed);
  return dataset;
}

Dataset loadDataset(const DataConfig& config, std::string_view defaultFolder) {
  Dataset dataset;
  switch (config.dataset) {
    case DatasetKind::Synthetic:
      dataset =
          makeSyntheticDataset(config.seed, syntheticSize(config.limitTrainSamples, kSyntheticTrainSamples),
                               syntheticSize(config.limitTestSamples, kSyntheticTestSamples));
      break;
    case DatasetKind::Mnist: {
      if (config.path.empty()) {
        throw ConfigError(
            ErrorCode::InvalidData, "/data/path",
            "the Mnist dataset needs a path to its IDX files; set /data/path to the folder holding "
            "{train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz]");
      }
      const auto [files, missing] = findIdxFiles(config.path);
      if (!files) throwMissingFiles("mnist", config.path, missing);
      dataset = readIdxDataset(*files);
      dataset.source = fmt::format("Mnist from {}", config.path);
      break;
    }
    case DatasetKind::Tensors:
      throw ConfigError(ErrorCode::InvalidData, "/data/dataset",
                        "the Tensors dataset is read with loadTensorDataset, which checks it against the "
                        "inputs of the graph it feeds");
    case DatasetKind::FashionMnist: {
      const bool useDefault = config.path.empty();
      const std::string folder = useDefault ? std::string(defaultFolder) : config.path;
      const auto [files, missing] = findIdxFiles(folder);
      if (files) {
        dataset = readIdxDataset(*files);
        dataset.source = fmt::format("FashionMnist from {}", folder);
        break;
      }
      if (!useDefault) throwMissingFiles("fashion-mnist", folder, missing);
      dataset =
          makeSyntheticDataset(config.seed, syntheticSize(config.limitTrainSamples, kSyntheticTrainSamples),
                               syntheticSize(config.limitTestSamples, kSyntheticTestSamples));
      dataset.notice = fmt::format(
          "Fashion-MNIST is not installed (looked in {} for {}), so the synthetic dataset (seed {}) stands "
          "in "
          "for it. Install it with `apt-get install dataset-fashion-mnist`, set /data/path to a folder "
          "holding "
          "the IDX files, or set /data/dataset to \"Synthetic\" to choose that set explicitly.",
          folder, joined(missing), config.seed);
      break;
    }
  }
  keepFirst(dataset.train, config.limitTrainSamples, "limitTrainSamples");
  keepFirst(dataset.test, config.limitTestSamples, "limitTestSamples");
  return dataset;
}

void fillEpochOrder(std::span<int64_t> order, int64_t seed, int64_t epoch, bool shuffle) {
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = static_cast<int64_t>(i);
  if (!shuffle || order.size() < 2) return;
  std::mt19937_64 generator(streamSeed(seed, kEpochStreamBase + static_cast<uint64_t>(epoch)));
  for (std::size_t i = order.size() - 1; i > 0; --i) {
    const auto j = static_cast<std::size_t>(uniformBelow(generator, i + 1));
    std::swap(order[i], order[j]);
  }
}

std::vector<int64_t> epochOrder(int64_t numSamples, int64_t seed, int64_t epoch, bool shuffle) {
  if (numSamples < 0) {
    throw ConfigError(ErrorCode::OutOfRange, "epochOrder",
                      fmt::format("numSamples is {}; it must be >= 0", numSamples));
  }
  std::vector<int64_t> order(static_cast<std::size_t>(numSamples));
  fillEpochOrder(order, seed, epoch, shuffle);
  return order;
}

int64_t instanceStepOffset(int64_t step, int64_t stepSamples, int64_t numInstances, int64_t instanceIndex) {
  if (step < 0) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceStepOffset",
                      fmt::format("step is {}; it must be >= 0", step));
  }
  if (stepSamples < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceStepOffset",
                      fmt::format("stepSamples is {}; it must be >= 1 (batchSize x local replicas x "
                                  "accumulationFactor)",
                                  stepSamples));
  }
  if (numInstances < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceStepOffset",
                      fmt::format("numInstances is {}; it must be >= 1", numInstances));
  }
  if (instanceIndex < 0 || instanceIndex >= numInstances) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceStepOffset",
                      fmt::format("instanceIndex is {}; it must be in [0, {})", instanceIndex, numInstances));
  }
  return (step * numInstances + instanceIndex) * stepSamples;
}

SampleRange instanceRange(int64_t numSamples, int64_t stepSamples, int64_t numInstances,
                          int64_t instanceIndex) {
  if (numSamples < 0) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceRange",
                      fmt::format("numSamples is {}; it must be >= 0", numSamples));
  }
  if (stepSamples < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceRange",
                      fmt::format("stepSamples is {}; it must be >= 1 (batchSize x local replicas x "
                                  "accumulationFactor)",
                                  stepSamples));
  }
  if (numInstances < 1) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceRange",
                      fmt::format("numInstances is {}; it must be >= 1", numInstances));
  }
  if (instanceIndex < 0 || instanceIndex >= numInstances) {
    throw ConfigError(ErrorCode::OutOfRange, "instanceRange",
                      fmt::format("instanceIndex is {}; it must be in [0, {})", instanceIndex, numInstances));
  }
  // floor(N / (S * P)) == floor(floor(N / P) / S), without the product's overflow.
  const int64_t perInstance = numSamples / numInstances / stepSamples * stepSamples;
  return SampleRange{instanceIndex * perInstance, perInstance};
}

void fillBatch(const DatasetSplit& split, std::span<const int64_t> order, int64_t first,
               std::span<float> images, std::span<int32_t> labels) {
  const auto n = static_cast<int64_t>(labels.size());
  const int64_t sampleElements = split.sampleElements();
  if (static_cast<int64_t>(images.size()) != n * sampleElements) {
    throw GraphError(ErrorCode::HostShapeMismatch, "fillBatch",
                     fmt::format("the images buffer holds {} floats but {} samples of {}x{} need {}",
                                 images.size(), n, split.rows, split.cols, n * sampleElements));
  }
  const auto positions = static_cast<int64_t>(order.size());
  if (first < 0 || first > positions || n > positions - first) {
    throw ConfigError(
        ErrorCode::OutOfRange, "fillBatch",
        fmt::format("positions {}..{} are outside the order of {} samples", first, first + n, positions));
  }
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sample = order[static_cast<std::size_t>(first + i)];
    if (sample < 0 || sample >= split.count) {
      throw ConfigError(
          ErrorCode::OutOfRange, "fillBatch",
          fmt::format("order[{}] is {} but the split has {} samples", first + i, sample, split.count));
    }
    std::copy_n(split.images.data() + sample * sampleElements, sampleElements,
                images.data() + i * sampleElements);
    labels[static_cast<std::size_t>(i)] = split.labels[static_cast<std::size_t>(sample)];
  }
}

// --- Tensor datasets ---------------------------------------------------------------

namespace {

std::string tensorSubject(const std::string& file, std::string_view tensor) {
  return fmt::format("{}: tensor {}", file, tensor);
}

std::string shapeText(std::span<const int64_t> shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

// A tensors dataset is read whole; files over the default tensor limit are
// refused before anything is allocated.
std::vector<unsigned char> readWholeFile(const std::string& path) {
  const detail::InputFile file(path);
  return file.readAll<std::vector<unsigned char>>(
      static_cast<uint64_t>(kDefaultMaxTensorBytes), [&path](uint64_t size) {
        throw ConfigError(
            ErrorCode::ShapeTooLarge, path,
            fmt::format("the dataset file has {} bytes, more than the limit of {} bytes; split it or "
                        "use a smaller subset",
                        size, kDefaultMaxTensorBytes));
      });
}

// The dtypes a graph input of `dtype` can be fed from: a float input (float32
// or float16) from F32 or F16, fed as floats (F16 widens exactly; the device
// rounds what a float16 input stores); int64 narrows to int32 when the value
// fits (checked).
bool fits(DType dtype, std::string_view stored) {
  return isFloating(dtype) ? stored == "F32" || stored == "F16" : stored == "I32" || stored == "I64";
}

// Reads the little-endian bytes of `view` into `tensor` (dtype set).
void convert(const safetensors::TensorView& view, std::span<const uint8_t> data, const std::string& file,
             DataTensor& tensor) {
  const std::span<const uint8_t> bytes = data.subspan(view.begin, view.end - view.begin);
  const auto load = [&bytes](std::size_t index, std::size_t size) {
    uint64_t value = 0;
    for (std::size_t b = 0; b < size; ++b) value |= uint64_t{bytes[index * size + b]} << (8 * b);
    return value;
  };
  if (view.dtype == "F32") {
    tensor.floats.resize(bytes.size() / 4);
    for (std::size_t i = 0; i < tensor.floats.size(); ++i) {
      tensor.floats[i] = std::bit_cast<float>(static_cast<uint32_t>(load(i, 4)));
    }
    return;
  }
  if (view.dtype == "F16") {
    std::vector<uint16_t> halves(bytes.size() / 2);
    for (std::size_t i = 0; i < halves.size(); ++i) halves[i] = static_cast<uint16_t>(load(i, 2));
    tensor.floats.resize(halves.size());
    halvesToFloats(halves.data(), tensor.floats.data(), halves.size());
    return;
  }
  const std::size_t size = view.dtype == "I64" ? 8 : 4;
  tensor.ints.resize(bytes.size() / size);
  for (std::size_t i = 0; i < tensor.ints.size(); ++i) {
    if (size == 4) {
      tensor.ints[i] = std::bit_cast<int32_t>(static_cast<uint32_t>(load(i, 4)));
      continue;
    }
    const auto value = std::bit_cast<int64_t>(load(i, 8));
    if (value < std::numeric_limits<int32_t>::min() || value > std::numeric_limits<int32_t>::max()) {
      const int64_t perSample = std::max<int64_t>(tensor.sampleElements(), 1);
      throw IoError(ErrorCode::DatasetTensorMismatch, tensorSubject(file, tensor.name),
                    fmt::format("value {} of sample {} does not fit in 32 bits; tessera's integer inputs are "
                                "int32, so int64 values must lie in [-2147483648, 2147483647]",
                                value, static_cast<int64_t>(i) / perSample));
    }
    tensor.ints[i] = static_cast<int32_t>(value);
  }
}

template <class T>
void fillSamples(const DataTensor& tensor, const std::vector<T>& values, std::span<const int64_t> order,
                 int64_t first, std::span<T> out) {
  const int64_t elements = tensor.sampleElements();
  if (elements < 1 || static_cast<int64_t>(out.size()) % elements != 0 ||
      values.size() != static_cast<std::size_t>(tensor.shape.empty() ? 0 : tensor.shape[0] * elements)) {
    throw GraphError(ErrorCode::HostShapeMismatch, tensor.name,
                     fmt::format("the buffer of {} values is not a whole number of samples of {} {} values "
                                 "(tensor shape {})",
                                 out.size(), elements, toString(tensor.dtype), shapeText(tensor.shape)));
  }
  const int64_t n = static_cast<int64_t>(out.size()) / elements;
  const auto positions = static_cast<int64_t>(order.size());
  if (first < 0 || first > positions || n > positions - first) {
    throw ConfigError(
        ErrorCode::OutOfRange, "fillTensorBatch",
        fmt::format("positions {}..{} are outside the order of {} samples", first, first + n, positions));
  }
  const int64_t count = tensor.shape[0];
  for (int64_t i = 0; i < n; ++i) {
    const int64_t sample = order[static_cast<std::size_t>(first + i)];
    if (sample < 0 || sample >= count) {
      throw ConfigError(
          ErrorCode::OutOfRange, "fillTensorBatch",
          fmt::format("order[{}] is {} but tensor {} has {} samples", first + i, sample, tensor.name, count));
    }
    std::copy_n(values.data() + sample * elements, elements, out.data() + i * elements);
  }
}

void keepFirstSamples(TensorSplit& split, int64_t limit) {
  if (limit <= 0 || limit >= split.count) return;
  split.count = limit;
  for (DataTensor& tensor : split.tensors) {
    tensor.shape[0] = limit;
    const auto keep = static_cast<std::size_t>(limit * tensor.sampleElements());
    if (isFloating(tensor.dtype))
      tensor.floats.resize(keep);
    else
      tensor.ints.resize(keep);
  }
}

}  // namespace

int64_t DataTensor::sampleElements() const noexcept {
  int64_t elements = 1;
  for (std::size_t axis = 1; axis < shape.size(); ++axis) elements *= shape[axis];
  return elements;
}

const DataTensor* TensorSplit::find(std::string_view name) const noexcept {
  for (const DataTensor& tensor : tensors)
    if (tensor.name == name) return &tensor;
  return nullptr;
}

std::vector<DataInput> graphDataInputs(const Graph& graph, std::span<const std::string> names) {
  std::vector<DataInput> inputs;
  for (const std::string& name : names) {
    const TensorNode& node = graph.tensor(graph.find(name));
    inputs.push_back({name, node.dtype, node.shape});
  }
  return inputs;
}

TensorSplit parseTensorSplit(std::span<const unsigned char> bytes, const std::string& name,
                             std::span<const DataInput> inputs) {
  safetensors::FileView file;
  try {
    file = safetensors::parse(std::span<const uint8_t>(bytes.data(), bytes.size()), name);
  } catch (const IoError& error) {
    if (error.code() != ErrorCode::CorruptCheckpoint) throw;
    throw IoError(ErrorCode::CorruptDataset, name, error.detail());
  }
  TensorSplit split;
  split.source = name;
  const std::string* firstName = nullptr;
  for (const DataInput& input : inputs) {
    const auto view =
        std::find_if(file.tensors.begin(), file.tensors.end(),
                     [&input](const safetensors::TensorView& t) { return t.name == input.name; });
    const std::string subject = tensorSubject(name, input.name);
    if (view == file.tensors.end()) {
      std::vector<std::string_view> names;
      for (const safetensors::TensorView& t : file.tensors) names.push_back(t.name);
      std::sort(names.begin(), names.end());
      const auto closest = jsonio::closestMatch(input.name, names);
      throw IoError(ErrorCode::DatasetTensorMissing, subject,
                    fmt::format("the file has no tensor \"{}\" for the graph input of that name ({} {}); it "
                                "holds {}{}",
                                input.name, toString(input.dtype), shapeText(input.shape),
                                names.empty() ? std::string("no tensors") : jsonio::quotedList(names),
                                closest ? fmt::format(" (did you mean \"{}\"?)", *closest) : std::string()));
    }
    if (!fits(input.dtype, view->dtype)) {
      throw IoError(
          ErrorCode::DatasetTensorMismatch, subject,
          fmt::format("the tensor is {} but graph input {} is {}; store it as {}", view->dtype, input.name,
                      toString(input.dtype), isFloating(input.dtype) ? "F32 or F16" : "I32 or I64"));
    }
    DataTensor tensor;
    tensor.name = input.name;
    tensor.dtype = input.dtype;
    tensor.shape.assign(view->shape.begin(), view->shape.end());
    const bool rankFits = !input.shape.empty() && tensor.shape.size() == input.shape.size();
    if (!rankFits || !std::equal(input.shape.begin() + 1, input.shape.end(), tensor.shape.begin() + 1)) {
      Shape sample(input.shape.empty() ? input.shape.begin() : input.shape.begin() + 1, input.shape.end());
      throw IoError(
          ErrorCode::DatasetTensorMismatch, subject,
          input.shape.empty()
              ? fmt::format("graph input {} is a scalar; a tensors dataset feeds inputs whose first "
                            "axis is the batch",
                            input.name)
              : fmt::format("the tensor has shape {} but graph input {} takes samples of shape {} "
                            "(its shape {} without the batch axis); store [N, {}]",
                            shapeText(tensor.shape), input.name, shapeText(sample), shapeText(input.shape),
                            fmt::join(sample, ", ")));
    }
    if (firstName == nullptr) {
      split.count = tensor.shape[0];
      firstName = &input.name;
    } else if (tensor.shape[0] != split.count) {
      throw IoError(ErrorCode::DatasetLengthMismatch, subject,
                    fmt::format("the tensor has {} samples but tensor {} has {}; every input's tensor must "
                                "hold the same samples",
                                tensor.shape[0], *firstName, split.count));
    }
    convert(*view, file.data, name, tensor);
    split.tensors.push_back(std::move(tensor));
  }
  return split;
}

TensorSplit readTensorSplit(const std::string& path, std::span<const DataInput> inputs) {
  const std::vector<unsigned char> bytes = readWholeFile(path);
  return parseTensorSplit(bytes, path, inputs);
}

TensorDataset loadTensorDataset(const DataConfig& config, std::span<const DataInput> inputs) {
  if (config.path.empty()) {
    throw ConfigError(ErrorCode::InvalidData, "/data/path",
                      "the Tensors dataset needs the path of its training .safetensors file");
  }
  TensorDataset dataset;
  dataset.train = readTensorSplit(config.path, inputs);
  keepFirstSamples(dataset.train, config.limitTrainSamples);
  dataset.source = fmt::format("Tensors from {}", config.path);
  if (!config.test.empty()) {
    dataset.test = readTensorSplit(config.test, inputs);
    keepFirstSamples(dataset.test, config.limitTestSamples);
    dataset.source += fmt::format(" (test {})", config.test);
  }
  return dataset;
}

void fillTensorBatch(const DataTensor& tensor, std::span<const int64_t> order, int64_t first,
                     std::span<float> out) {
  if (!isFloating(tensor.dtype)) {
    throw GraphError(ErrorCode::HostShapeMismatch, tensor.name,
                     "the tensor holds int32 values; fill an int32 buffer");
  }
  fillSamples(tensor, tensor.floats, order, first, out);
}

void fillTensorBatch(const DataTensor& tensor, std::span<const int64_t> order, int64_t first,
                     std::span<int32_t> out) {
  if (tensor.dtype != DType::Int32) {
    throw GraphError(ErrorCode::HostShapeMismatch, tensor.name,
                     "the tensor holds float32 values; fill a float buffer");
  }
  fillSamples(tensor, tensor.ints, order, first, out);
}

}  // namespace tessera
