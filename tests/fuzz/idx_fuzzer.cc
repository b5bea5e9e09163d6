// The IDX readers on arbitrary bytes, read as an image file and as a label
// file. Bytes that are not gzip'd are also read gzip'd, so every input
// reaches the IDX parser through inflate too: both readings must agree (the
// same values, or an error with the same code).
#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <span>
#include <string>
#include <vector>

#define ZLIB_CONST
#include <zlib.h>

#include "fuzz_support.hpp"
#include "tessera/app/dataset.hpp"
#include "tessera/lib/error.hpp"

namespace {

// Small enough that an input claiming the limit stays fast; the readers'
// own default is checked by the test suites.
constexpr int64_t kMaxItems = int64_t{1} << 20;

struct Outcome {
  std::optional<tessera::ErrorCode> error;
  tessera::IdxImages images;
  std::vector<int32_t> labels;

  bool operator==(const Outcome& other) const {
    return error == other.error && images.count == other.images.count && images.rows == other.images.rows &&
           images.cols == other.images.cols && images.pixels == other.images.pixels && labels == other.labels;
  }
};

template <class Fn>
Outcome outcomeOf(Fn&& fn) {
  Outcome outcome;
  try {
    fn(outcome);
  } catch (const tessera::Error& error) {
    tessera::fuzz::checkError(error);
    outcome = Outcome{};
    outcome.error = error.code();
  }
  return outcome;
}

Outcome readImages(std::span<const unsigned char> bytes) {
  return outcomeOf(
      [&](Outcome& out) { out.images = tessera::parseIdxImages(bytes, "fuzz-images", kMaxItems); });
}

Outcome readLabels(std::span<const unsigned char> bytes) {
  return outcomeOf([&](Outcome& out) {
    out.labels = tessera::parseIdxLabels(bytes, "fuzz-labels", tessera::kNumClasses, kMaxItems);
  });
}

std::vector<unsigned char> gzip(std::span<const unsigned char> bytes) {
  z_stream stream{};
  // 15 + 16: the largest window with gzip framing.
  if (deflateInit2(&stream, Z_BEST_SPEED, Z_DEFLATED, 15 + 16, 8, Z_DEFAULT_STRATEGY) != Z_OK) std::abort();
  std::vector<unsigned char> out(deflateBound(&stream, static_cast<uLong>(bytes.size())));
  stream.next_in = bytes.data();
  stream.avail_in = static_cast<uInt>(bytes.size());
  stream.next_out = out.data();
  stream.avail_out = static_cast<uInt>(out.size());
  if (deflate(&stream, Z_FINISH) != Z_STREAM_END) std::abort();
  out.resize(stream.total_out);
  deflateEnd(&stream);
  return out;
}

void checkSame(const Outcome& raw, const Outcome& gzipped, const char* reader) {
  if (raw == gzipped) return;
  std::fprintf(stderr, "fuzz finding: the %s reader gives different results for raw and gzip'd bytes\n",
               reader);
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, std::size_t size) {
  const std::span<const unsigned char> bytes(data, size);
  const Outcome images = readImages(bytes);
  const Outcome labels = readLabels(bytes);
  if (size >= 2 && data[0] == 0x1f && data[1] == 0x8b) return 0;
  const std::vector<unsigned char> compressed = gzip(bytes);
  checkSame(images, readImages(compressed), "image");
  checkSame(labels, readLabels(compressed), "label");
  return 0;
}
