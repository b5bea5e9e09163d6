#include "tessera/app/dataset.hpp"

#include <sys/stat.h>

#include <doctest/doctest.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <zlib.h>

#include "half.hpp"
#include "safetensors.hpp"
#include "support/process.hpp"
#include "tessera/lib/error.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

using Bytes = std::vector<unsigned char>;

// A folder of its own under the system's temporary folder, removed at the end.
class TempFolder {
 public:
  TempFolder() {
    std::string pattern = (std::filesystem::temp_directory_path() / "tessera-dataset-XXXXXX").string();
    REQUIRE(mkdtemp(pattern.data()) != nullptr);
    path_ = pattern;
  }
  TempFolder(const TempFolder&) = delete;
  TempFolder& operator=(const TempFolder&) = delete;
  ~TempFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  std::string file(const std::string& name) const { return (path_ / name).string(); }
  std::string str() const { return path_.string(); }

 private:
  std::filesystem::path path_;
};

void appendU32(Bytes& bytes, uint32_t value) {
  for (int shift = 24; shift >= 0; shift -= 8) bytes.push_back(static_cast<unsigned char>(value >> shift));
}

Bytes idxHeader(uint32_t magic, const std::vector<uint32_t>& dims) {
  Bytes bytes;
  appendU32(bytes, magic);
  for (const uint32_t d : dims) appendU32(bytes, d);
  return bytes;
}

// An IDX image file of `count` images whose pixel i is (i * 7 + image) % 256.
Bytes imageFile(uint32_t count, uint32_t rows, uint32_t cols) {
  Bytes bytes = idxHeader(0x00000803, {count, rows, cols});
  for (uint32_t n = 0; n < count; ++n)
    for (uint32_t i = 0; i < rows * cols; ++i) bytes.push_back(static_cast<unsigned char>((i * 7 + n) % 256));
  return bytes;
}

Bytes labelFile(const std::vector<unsigned char>& labels) {
  Bytes bytes = idxHeader(0x00000801, {static_cast<uint32_t>(labels.size())});
  bytes.insert(bytes.end(), labels.begin(), labels.end());
  return bytes;
}

std::string writeRaw(const std::string& path, const Bytes& bytes) {
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  REQUIRE(out.good());
  return path;
}

std::string writeGzip(const std::string& path, const Bytes& bytes) {
  gzFile file = gzopen(path.c_str(), "wb");
  REQUIRE(file != nullptr);
  const int written = gzwrite(file, bytes.data(), static_cast<unsigned>(bytes.size()));
  CHECK(written == static_cast<int>(bytes.size()));
  REQUIRE(gzclose(file) == Z_OK);
  return path;
}

Bytes readBytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return Bytes(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

// Writes the four files of an IDX dataset (train: 5 samples, test: 3).
void writeIdxDataset(const TempFolder& folder, bool gzip) {
  const auto write = [&](const std::string& name, const Bytes& bytes) {
    if (gzip) {
      writeGzip(folder.file(name + ".gz"), bytes);
    } else {
      writeRaw(folder.file(name), bytes);
    }
  };
  write("train-images-idx3-ubyte", imageFile(5, 28, 28));
  write("train-labels-idx1-ubyte", labelFile({3, 1, 4, 1, 5}));
  write("t10k-images-idx3-ubyte", imageFile(3, 28, 28));
  write("t10k-labels-idx1-ubyte", labelFile({9, 2, 6}));
}

template <class Fn>
IoError expectIoError(Fn&& fn, ErrorCode code, const std::string& subject, const std::string& fragment) {
  const auto error = test::catchError<IoError>(fn);
  REQUIRE_MESSAGE(error.has_value(), "expected an IoError containing: " << fragment);
  INFO(error->what());
  CHECK(error->code() == code);
  CHECK(error->subject() == subject);
  CHECK(error->detail().find(fragment) != std::string::npos);
  return *error;
}

template <class E, class Fn>
void expectError(Fn&& fn, ErrorCode code, const std::string& subject, const std::string& fragment) {
  const auto error = test::catchError<E>(fn);
  REQUIRE_MESSAGE(error.has_value(), "expected an error containing: " << fragment);
  INFO(error->what());
  CHECK(error->code() == code);
  CHECK(error->subject() == subject);
  CHECK(error->detail().find(fragment) != std::string::npos);
}

bool isPermutation(const std::vector<int64_t>& order) {
  std::vector<int64_t> sorted = order;
  std::sort(sorted.begin(), sorted.end());
  for (std::size_t i = 0; i < sorted.size(); ++i)
    if (sorted[i] != static_cast<int64_t>(i)) return false;
  return true;
}

}  // namespace

TEST_CASE("IDX files round trip, raw and gzip'd") {
  TempFolder folder;
  const Bytes images = imageFile(4, 3, 5);
  const Bytes labels = labelFile({0, 9, 3, 7});
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    // The name never decides: the gzip'd files have no .gz suffix and the raw ones do.
    const std::string imagesPath = folder.file(gzip ? "images-gz" : "images.gz");
    const std::string labelsPath = folder.file(gzip ? "labels-gz" : "labels.gz");
    if (gzip) {
      writeGzip(imagesPath, images);
      writeGzip(labelsPath, labels);
      CHECK(readBytes(imagesPath).at(0) == 0x1f);
    } else {
      writeRaw(imagesPath, images);
      writeRaw(labelsPath, labels);
    }
    const IdxImages read = readIdxImages(imagesPath);
    CHECK(read.count == 4);
    CHECK(read.rows == 3);
    CHECK(read.cols == 5);
    REQUIRE(read.pixels.size() == 60);
    for (std::size_t k = 0; k < read.pixels.size(); ++k) {
      CHECK(read.pixels[k] == static_cast<float>(images[16 + k]) / 255.0f);
    }
    CHECK(readIdxLabels(labelsPath) == std::vector<int32_t>{0, 9, 3, 7});

    const DatasetSplit split = readIdxSplit(imagesPath, labelsPath);
    CHECK(split.count == 4);
    CHECK(split.sampleElements() == 15);
    CHECK(split.images == read.pixels);
    CHECK(split.labels == std::vector<int32_t>{0, 9, 3, 7});
  }
}

TEST_CASE("pixels map bytes 0..255 onto [0, 1]") {
  TempFolder folder;
  Bytes bytes = idxHeader(0x00000803, {1, 16, 16});
  for (int b = 0; b < 256; ++b) bytes.push_back(static_cast<unsigned char>(b));
  const IdxImages images = readIdxImages(writeRaw(folder.file("all-bytes"), bytes));
  REQUIRE(images.pixels.size() == 256);
  CHECK(images.pixels.front() == 0.0f);
  CHECK(images.pixels.back() == 1.0f);
  CHECK(images.pixels[51] == doctest::Approx(0.2f));
  CHECK(std::is_sorted(images.pixels.begin(), images.pixels.end()));
}

TEST_CASE("gzip files made of several members read as one stream") {
  TempFolder folder;
  const Bytes labels = labelFile({1, 2, 3, 4, 5, 6});
  const std::string first = writeGzip(folder.file("first"), Bytes(labels.begin(), labels.begin() + 9));
  const std::string second = writeGzip(folder.file("second"), Bytes(labels.begin() + 9, labels.end()));
  Bytes joined = readBytes(first);
  const Bytes tail = readBytes(second);
  joined.insert(joined.end(), tail.begin(), tail.end());
  CHECK(readIdxLabels(writeRaw(folder.file("joined"), joined)) == std::vector<int32_t>{1, 2, 3, 4, 5, 6});
}

TEST_CASE("damaged IDX files are CorruptDataset errors naming the file") {
  TempFolder folder;
  const Bytes goodImages = imageFile(2, 4, 4);
  struct Row {
    std::string name;
    Bytes bytes;
    bool images;  // read as images, else as labels
    std::string fragment;
  };
  Bytes trailing = goodImages;
  trailing.push_back(0);
  Bytes truncated = goodImages;
  truncated.resize(truncated.size() - 5);
  const std::vector<Row> rows = {
      {"empty", {}, true, "the data is 0 bytes long"},
      {"short magic", {0, 0, 8}, true, "the data is 3 bytes long"},
      {"not idx", idxHeader(0x12345678, {1, 1, 1}), true, "expected the IDX magic 0x00000803"},
      {"float data", idxHeader(0x00000d03, {1, 1, 1}), true, "IDX data type 0x0d (float32) is not supported"},
      {"labels read as images", labelFile({1, 2}), true, "found 1 dimension (magic 0x00000801)"},
      {"images read as labels", goodImages, false, "expected a label file with 1 dimension"},
      {"truncated header", Bytes(goodImages.begin(), goodImages.begin() + 10), true,
       "the header is truncated"},
      {"zero count", idxHeader(0x00000803, {0, 28, 28}), true, "dimension 0 (count) at byte offset 4 is 0"},
      {"zero rows", idxHeader(0x00000803, {5, 0, 28}), true, "dimension 1 (rows) at byte offset 8 is 0"},
      {"zero cols", idxHeader(0x00000803, {5, 28, 0}), true, "dimension 2 (cols) at byte offset 12 is 0"},
      {"zero labels", idxHeader(0x00000801, {0}), false, "dimension 0 (count) at byte offset 4 is 0"},
      {"overflow", idxHeader(0x00000803, {0xffffffff, 0xffffffff, 0xffffffff}), true, "overflows 64 bits"},
      {"over the limit", idxHeader(0x00000803, {0x10000, 0x1000, 0x1000}), true,
       "65536 images of 4096x4096 pixels = 1099511627776 bytes of data, more than the limit of 1073741824"},
      {"truncated data", truncated, true,
       "the header declares 32 bytes of data after the 16-byte header, but the data ends at byte offset 43 "
       "after 27 of them"},
      {"trailing bytes", trailing, true, "unexpected bytes after the last item"},
      {"label out of range", labelFile({1, 10, 2}), false,
       "label 10 of sample 1 (byte offset 9) is outside 0..9"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const std::string path = writeRaw(folder.file("bad"), row.bytes);
    if (row.images) {
      expectIoError([&] { readIdxImages(path); }, ErrorCode::CorruptDataset, path, row.fragment);
    } else {
      expectIoError([&] { readIdxLabels(path); }, ErrorCode::CorruptDataset, path, row.fragment);
    }
  }
}

TEST_CASE("damaged gzip streams are CorruptDataset errors") {
  TempFolder folder;
  const Bytes images = imageFile(20, 28, 28);
  const Bytes gz = readBytes(writeGzip(folder.file("good"), images));
  REQUIRE(gz.size() > 64);

  Bytes flipped = gz;
  for (std::size_t i = 20; i < 40; ++i) flipped[i] ^= 0x5a;
  Bytes badCrc = gz;
  badCrc[gz.size() - 6] ^= 0xff;  // the CRC-32 is in the last 8 bytes
  Bytes truncated(gz.begin(), gz.begin() + static_cast<std::ptrdiff_t>(gz.size() - 4));
  Bytes garbage = gz;
  garbage.push_back('x');
  garbage.push_back('y');
  const Bytes header(gz.begin(), gz.begin() + 5);

  struct Row {
    std::string name;
    Bytes bytes;
    std::string fragment;
  };
  const std::vector<Row> rows = {
      {"flipped data", flipped, "corrupt gzip stream near compressed byte offset"},
      {"bad checksum", badCrc, "incorrect data check"},
      {"truncated stream", truncated, "the gzip stream is truncated"},
      {"only a header", header, "the gzip stream is truncated"},
      {"garbage after the stream", garbage,
       "unexpected bytes after the end of the gzip stream at compressed byte"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.name);
    const std::string path = writeRaw(folder.file("bad.gz"), row.bytes);
    expectIoError([&] { readIdxImages(path); }, ErrorCode::CorruptDataset, path, row.fragment);
  }
}

TEST_CASE("the size limit is checked before reading the data") {
  TempFolder folder;
  const std::string images = writeRaw(folder.file("images"), imageFile(3, 4, 4));
  CHECK(readIdxImages(images, 48).count == 3);
  expectIoError([&] { readIdxImages(images, 47); }, ErrorCode::CorruptDataset, images,
                "3 images of 4x4 pixels = 48 bytes of data, more than the limit of 47");
  const std::string labels = writeRaw(folder.file("labels"), labelFile({1, 2, 3}));
  CHECK(readIdxLabels(labels, 10, 3).size() == 3);
  expectIoError([&] { readIdxLabels(labels, 10, 2); }, ErrorCode::CorruptDataset, labels,
                "3 labels = 3 bytes of data, more than the limit of 2");
  // A header that claims a huge, within-limit size but holds no data fails
  // as truncated, without the reader trusting the claim beyond the limit.
  const std::string liar = writeRaw(folder.file("liar"), idxHeader(0x00000803, {1000, 28, 28}));
  expectIoError([&] { readIdxImages(liar); }, ErrorCode::CorruptDataset, liar, "the file is truncated");
}

TEST_CASE("labels are checked against the number of classes") {
  TempFolder folder;
  const std::string path = writeRaw(folder.file("labels"), labelFile({0, 1, 2, 3}));
  CHECK(readIdxLabels(path, 4).size() == 4);
  expectIoError([&] { readIdxLabels(path, 3); }, ErrorCode::CorruptDataset, path,
                "label 3 of sample 3 (byte offset 11) is outside 0..2");
}

TEST_CASE("images and labels must have the same count") {
  TempFolder folder;
  const std::string images = writeRaw(folder.file("images"), imageFile(3, 28, 28));
  const std::string labels = writeRaw(folder.file("labels"), labelFile({1, 2}));
  expectIoError([&] { readIdxSplit(images, labels); }, ErrorCode::CorruptDataset, labels,
                fmt::format("holds 2 labels but {} holds 3 images", images));
}

TEST_CASE("missing or unreadable files are FileUnreadable errors with the reason") {
  TempFolder folder;
  const std::string missing = folder.file("nothing-here");
  expectIoError([&] { readIdxImages(missing); }, ErrorCode::FileUnreadable, missing,
                "No such file or directory");
  expectIoError([&] { readIdxLabels(missing); }, ErrorCode::FileUnreadable, missing,
                "No such file or directory");
  expectIoError([&] { readIdxImages(folder.str()); }, ErrorCode::FileUnreadable, folder.str(),
                "it is a folder, not a regular file");
  // Special files are refused when opened: a FIFO without a writer does not block, a device is not read.
  const std::string fifo = folder.file("fifo");
  REQUIRE(::mkfifo(fifo.c_str(), 0600) == 0);
  expectIoError([&] { readIdxImages(fifo); }, ErrorCode::FileUnreadable, fifo,
                "it is a FIFO (named pipe), not a regular file");
  expectIoError([&] { readIdxLabels("/dev/zero"); }, ErrorCode::FileUnreadable, "/dev/zero",
                "it is a character device, not a regular file");
  const std::vector<DataInput> inputs = {{"x", DType::Float32, {2, 3}}};
  expectIoError([&] { readTensorSplit("/dev/urandom", inputs); }, ErrorCode::FileUnreadable, "/dev/urandom",
                "it is a character device, not a regular file");
}

TEST_CASE("loadDataset reads IDX folders, raw or gzip'd") {
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    TempFolder folder;
    writeIdxDataset(folder, gzip);
    for (const DatasetKind kind : {DatasetKind::FashionMnist, DatasetKind::Mnist}) {
      CAPTURE(toString(kind));
      DataConfig config;
      config.dataset = kind;
      config.path = folder.str();
      const Dataset dataset = loadDataset(config);
      CHECK(dataset.train.count == 5);
      CHECK(dataset.test.count == 3);
      CHECK(dataset.train.images.size() == 5 * 784);
      CHECK(dataset.train.labels == std::vector<int32_t>{3, 1, 4, 1, 5});
      CHECK(dataset.test.labels == std::vector<int32_t>{9, 2, 6});
      CHECK(dataset.source == fmt::format("{} from {}", toString(kind), folder.str()));
      CHECK(dataset.notice.empty());

      config.limitTrainSamples = 2;
      config.limitTestSamples = 100;  // more than there are: all of them
      const Dataset limited = loadDataset(config);
      CHECK(limited.train.count == 2);
      CHECK(limited.train.labels == std::vector<int32_t>{3, 1});
      CHECK(limited.train.images ==
            std::vector<float>(dataset.train.images.begin(), dataset.train.images.begin() + 2 * 784));
      CHECK(limited.test.count == 3);
    }
  }
}

TEST_CASE("loadDataset rejects folders without the IDX files it was asked for") {
  TempFolder empty;
  TempFolder partial;
  writeRaw(partial.file("train-images-idx3-ubyte"), imageFile(1, 28, 28));
  struct Row {
    DatasetKind kind;
    std::string path;
    std::string fragment;
  };
  const std::vector<Row> rows = {
      {DatasetKind::Mnist, "", "the Mnist dataset needs a path to its IDX files"},
      {DatasetKind::Mnist, empty.str(), "missing train-images-idx3-ubyte[.gz], train-labels-idx1-ubyte[.gz]"},
      {DatasetKind::Mnist, partial.str(),
       "missing train-labels-idx1-ubyte[.gz], t10k-images-idx3-ubyte[.gz], t10k-labels-idx1-ubyte[.gz]"},
      {DatasetKind::FashionMnist, empty.str(), "the fashion-mnist IDX files are not in"},
  };
  for (const Row& row : rows) {
    CAPTURE(row.path);
    DataConfig config;
    config.dataset = row.kind;
    config.path = row.path;
    expectError<ConfigError>([&] { loadDataset(config); }, ErrorCode::InvalidData, "/data/path",
                             row.fragment);
  }
}

TEST_CASE("loadDataset passes on damage in the files instead of falling back") {
  TempFolder folder;
  writeIdxDataset(folder, false);
  const std::string labels = writeRaw(folder.file("t10k-labels-idx1-ubyte"), labelFile({1, 2}));
  DataConfig config;
  config.path = folder.str();
  expectIoError([&] { loadDataset(config); }, ErrorCode::CorruptDataset, labels, "holds 2 labels");

  writeRaw(folder.file("t10k-labels-idx1-ubyte"), labelFile({1, 2, 3}));
  const std::string images = writeRaw(folder.file("t10k-images-idx3-ubyte"), imageFile(3, 32, 32));
  expectIoError([&] { loadDataset(config); }, ErrorCode::CorruptDataset, images,
                "images are 32x32 pixels but MNIST-style datasets have 28x28");
}

TEST_CASE("without Fashion-MNIST installed, the synthetic set stands in with a notice") {
  TempFolder folder;
  const std::string absent = folder.file("not-installed");
  DataConfig config;
  config.seed = 3;
  config.limitTrainSamples = 50;
  config.limitTestSamples = 20;
  const Dataset dataset = loadDataset(config, absent);
  CHECK(dataset.source == "Synthetic (seed 3)");
  CHECK(dataset.train.count == 50);
  CHECK(dataset.test.count == 20);
  CHECK(dataset.notice.find(fmt::format("looked in {} for train-images-idx3-ubyte[.gz]", absent)) !=
        std::string::npos);
  CHECK(dataset.notice.find("apt-get install dataset-fashion-mnist") != std::string::npos);

  config.dataset = DatasetKind::Synthetic;
  const Dataset synthetic = loadDataset(config);
  CHECK(synthetic.notice.empty());
  CHECK(synthetic.train.images == dataset.train.images);
  CHECK(synthetic.train.labels == dataset.train.labels);
}

TEST_CASE("Fashion-MNIST from the dataset-fashion-mnist package") {
  DataConfig config;
  const Dataset dataset = loadDataset(config);
  if (std::filesystem::exists(std::string(kFashionMnistFolder))) {
    CHECK(dataset.notice.empty());
    CHECK(dataset.source == fmt::format("FashionMnist from {}", kFashionMnistFolder));
    CHECK(dataset.train.count == 60000);
    CHECK(dataset.test.count == 10000);
    for (const DatasetSplit* split : {&dataset.train, &dataset.test}) {
      CHECK(split->rows == 28);
      CHECK(split->cols == 28);
      CHECK(split->images.size() == static_cast<std::size_t>(split->count * 784));
      CHECK(split->labels.size() == static_cast<std::size_t>(split->count));
      const auto [low, high] = std::minmax_element(split->labels.begin(), split->labels.end());
      CHECK(*low == 0);
      CHECK(*high == 9);
      const auto [dark, bright] = std::minmax_element(split->images.begin(), split->images.end());
      CHECK(*dark == 0.0f);
      CHECK(*bright == 1.0f);
    }
    // Fashion-MNIST is balanced: 6000 training samples per class.
    std::array<int64_t, 10> perClass{};
    for (const int32_t label : dataset.train.labels) ++perClass[static_cast<std::size_t>(label)];
    CHECK(perClass == std::array<int64_t, 10>{6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000, 6000});
  } else {
    CHECK(dataset.source == fmt::format("Synthetic (seed {})", config.seed));
    CHECK(dataset.notice.find("apt-get install dataset-fashion-mnist") != std::string::npos);
    CHECK(dataset.train.count == kSyntheticTrainSamples);
  }
}

TEST_CASE("the synthetic set is deterministic per seed and learnable") {
  const Dataset full = makeSyntheticDataset(7);
  CHECK(full.train.count == 60000);
  CHECK(full.test.count == 10000);
  CHECK(full.train.images.size() == 60000u * 784u);
  CHECK(full.source == "Synthetic (seed 7)");
  CHECK(std::all_of(full.train.images.begin(), full.train.images.end(),
                    [](float p) { return p >= 0.0f && p <= 1.0f; }));

  const Dataset same = makeSyntheticDataset(7, 1000, 500);
  CHECK(same.train.labels ==
        std::vector<int32_t>(full.train.labels.begin(), full.train.labels.begin() + 1000));
  CHECK(same.train.images ==
        std::vector<float>(full.train.images.begin(), full.train.images.begin() + 1000 * 784));
  CHECK(same.test.labels == std::vector<int32_t>(full.test.labels.begin(), full.test.labels.begin() + 500));
  const Dataset other = makeSyntheticDataset(8, 1000, 500);
  CHECK(other.train.images != same.train.images);
  CHECK(other.train.labels != same.train.labels);
  // Train and test are different samples of the same classes.
  CHECK(std::vector<float>(full.test.images.begin(), full.test.images.begin() + 784) !=
        std::vector<float>(full.train.images.begin(), full.train.images.begin() + 784));

  // Every class occurs, roughly equally often.
  std::array<int64_t, 10> perClass{};
  for (const int32_t label : full.train.labels) ++perClass[static_cast<std::size_t>(label)];
  for (const int64_t n : perClass) CHECK((n > 5500 && n < 6500));

  // Learnable: the class means of the training set classify the test set.
  std::vector<double> means(10 * 784, 0.0);
  for (int64_t i = 0; i < full.train.count; ++i) {
    const auto label = static_cast<std::size_t>(full.train.labels[static_cast<std::size_t>(i)]);
    for (std::size_t p = 0; p < 784; ++p)
      means[label * 784 + p] +=
          full.train.images[static_cast<std::size_t>(i) * 784 + p] / static_cast<double>(perClass[label]);
  }
  int64_t correct = 0;
  for (int64_t i = 0; i < full.test.count; ++i) {
    std::size_t best = 0;
    double bestDistance = 1e300;
    for (std::size_t c = 0; c < 10; ++c) {
      double distance = 0.0;
      for (std::size_t p = 0; p < 784; ++p) {
        const double d = full.test.images[static_cast<std::size_t>(i) * 784 + p] - means[c * 784 + p];
        distance += d * d;
      }
      if (distance < bestDistance) {
        bestDistance = distance;
        best = c;
      }
    }
    correct += static_cast<int32_t>(best) == full.test.labels[static_cast<std::size_t>(i)];
  }
  CHECK(correct > 9000);
}

TEST_CASE("loadDataset's synthetic set honours the limits") {
  DataConfig config;
  config.dataset = DatasetKind::Synthetic;
  config.seed = 11;
  config.limitTrainSamples = 640;
  const Dataset dataset = loadDataset(config);
  CHECK(dataset.train.count == 640);
  CHECK(dataset.test.count == kSyntheticTestSamples);
  CHECK(dataset.train.labels == makeSyntheticDataset(11, 640, 0).train.labels);

  config.limitTestSamples = -1;
  expectError<ConfigError>([&] { loadDataset(config); }, ErrorCode::OutOfRange, "/data/limitTestSamples",
                           "limitTestSamples is -1; it must be >= 0");
}

TEST_CASE("epoch orders are deterministic permutations, reshuffled every epoch") {
  const std::vector<int64_t> order = epochOrder(1000, 42, 0, true);
  CHECK(isPermutation(order));
  CHECK(order == epochOrder(1000, 42, 0, true));
  CHECK(order != epochOrder(1000, 42, 1, true));
  CHECK(order != epochOrder(1000, 43, 0, true));
  std::vector<int64_t> identity(1000);
  std::iota(identity.begin(), identity.end(), 0);
  CHECK(order != identity);
  CHECK(epochOrder(1000, 42, 3, false) == identity);
  for (const int64_t epoch : {1, 2, 5}) CHECK(isPermutation(epochOrder(1000, 42, epoch, true)));
  CHECK(epochOrder(0, 1, 0, true).empty());
  CHECK(epochOrder(1, 1, 0, true) == std::vector<int64_t>{0});

  // The span overload fills the caller's buffer the same way.
  std::vector<int64_t> buffer(1000, -1);
  fillEpochOrder(buffer, 42, 0, true);
  CHECK(buffer == order);

  // Pinned values, also computed by an independent implementation of the
  // same steps: the order must not change between standard libraries or releases.
  CHECK(epochOrder(10, 0, 0, true) == std::vector<int64_t>{6, 5, 2, 4, 8, 3, 7, 1, 0, 9});
  CHECK(epochOrder(10, 42, 3, true) == std::vector<int64_t>{2, 3, 6, 1, 5, 4, 0, 8, 9, 7});

  // Every position is about equally likely to receive every sample.
  std::array<std::array<int, 4>, 4> counts{};
  for (int64_t epoch = 0; epoch < 4000; ++epoch) {
    const std::vector<int64_t> small = epochOrder(4, 9, epoch, true);
    for (std::size_t p = 0; p < 4; ++p) ++counts[p][static_cast<std::size_t>(small[p])];
  }
  for (const auto& row : counts)
    for (const int n : row) CHECK((n > 850 && n < 1150));

  expectError<ConfigError>([] { epochOrder(-1, 0, 0, true); }, ErrorCode::OutOfRange, "epochOrder",
                           "numSamples is -1");
}

TEST_CASE("instance ranges split the epoch the way PopTorch does, dropping the remainder") {
  struct Row {
    int64_t samples, step, instances;
    int64_t perInstance;
  };
  const std::vector<Row> rows = {
      {60000, 64, 1, 59968},                       // 937 steps of 64
      {60000, 64, 2, 29952},                       // 468 steps each
      {60000, 64, 4, 14976},                       // 234 steps each
      {60000, 128, 3, 19968}, {1000, 10, 4, 250},  // exact: nothing dropped
      {1000, 300, 4, 0},                           // less than one step per instance
      {7, 1, 3, 2},           {0, 8, 2, 0},       {12, 12, 1, 12},
  };
  for (const Row& row : rows) {
    CAPTURE(row.samples);
    CAPTURE(row.step);
    CAPTURE(row.instances);
    int64_t expectedOffset = 0;
    for (int64_t index = 0; index < row.instances; ++index) {
      const SampleRange range = instanceRange(row.samples, row.step, row.instances, index);
      CHECK(range == SampleRange{expectedOffset, row.perInstance});
      CHECK(range.count % row.step == 0);
      CHECK(range.offset + range.count <= row.samples);
      expectedOffset += range.count;
    }
    // The dropped remainder is less than one global step.
    CHECK(row.samples - expectedOffset < row.step * row.instances);
  }

  struct BadRow {
    int64_t samples, step, instances, index;
    std::string fragment;
  };
  const std::vector<BadRow> bad = {
      {-1, 1, 1, 0, "numSamples is -1"},     {10, 0, 1, 0, "stepSamples is 0; it must be >= 1"},
      {10, 1, 0, 0, "numInstances is 0"},    {10, 1, 2, 2, "instanceIndex is 2; it must be in [0, 2)"},
      {10, 1, 2, -1, "instanceIndex is -1"},
  };
  for (const BadRow& row : bad) {
    CAPTURE(row.fragment);
    expectError<ConfigError>([&] { instanceRange(row.samples, row.step, row.instances, row.index); },
                             ErrorCode::OutOfRange, "instanceRange", row.fragment);
  }
}

TEST_CASE("fillBatch copies a run of the epoch order into host buffers") {
  const Dataset dataset = makeSyntheticDataset(5, 100, 0);
  const DatasetSplit& train = dataset.train;
  const std::vector<int64_t> order = epochOrder(train.count, 5, 0, true);
  std::vector<float> images(4 * 784, -1.0f);
  std::vector<int32_t> labels(4, -1);
  fillBatch(train, order, 10, images, labels);
  for (std::size_t i = 0; i < 4; ++i) {
    const auto sample = static_cast<std::size_t>(order[10 + i]);
    CHECK(labels[i] == train.labels[sample]);
    CHECK(std::equal(images.begin() + static_cast<std::ptrdiff_t>(i * 784),
                     images.begin() + static_cast<std::ptrdiff_t>((i + 1) * 784),
                     train.images.begin() + static_cast<std::ptrdiff_t>(sample * 784)));
  }
  // The last positions of the order, exactly.
  fillBatch(train, order, 96, images, labels);
  CHECK(labels[3] == train.labels[static_cast<std::size_t>(order[99])]);

  std::vector<float> small(3 * 784);
  expectError<GraphError>([&] { fillBatch(train, order, 0, small, labels); }, ErrorCode::HostShapeMismatch,
                          "fillBatch",
                          "the images buffer holds 2352 floats but 4 samples of 28x28 need 3136");
  expectError<ConfigError>([&] { fillBatch(train, order, 97, images, labels); }, ErrorCode::OutOfRange,
                           "fillBatch", "positions 97..101 are outside the order of 100 samples");
  expectError<ConfigError>([&] { fillBatch(train, order, -1, images, labels); }, ErrorCode::OutOfRange,
                           "fillBatch", "positions -1..3");
  const std::vector<int64_t> wrong = {0, 1, 100, 2};
  expectError<ConfigError>([&] { fillBatch(train, wrong, 0, images, labels); }, ErrorCode::OutOfRange,
                           "fillBatch", "order[2] is 100 but the split has 100 samples");
}

TEST_CASE("IDX bytes in memory read as the same files do, with the same errors") {
  TempFolder folder;
  const Bytes images = imageFile(3, 5, 4);
  const Bytes labels = labelFile({7, 0, 9});
  for (const bool gzip : {false, true}) {
    CAPTURE(gzip);
    const std::string imagesPath =
        gzip ? writeGzip(folder.file("images.gz"), images) : writeRaw(folder.file("images"), images);
    const std::string labelsPath =
        gzip ? writeGzip(folder.file("labels.gz"), labels) : writeRaw(folder.file("labels"), labels);
    const Bytes imageBytes = readBytes(imagesPath);
    const IdxImages fromFile = readIdxImages(imagesPath);
    const IdxImages fromMemory = parseIdxImages(imageBytes, "images in memory");
    CHECK(fromMemory.count == fromFile.count);
    CHECK(fromMemory.rows == fromFile.rows);
    CHECK(fromMemory.cols == fromFile.cols);
    CHECK(fromMemory.pixels == fromFile.pixels);
    CHECK(parseIdxLabels(readBytes(labelsPath), "labels in memory") == std::vector<int32_t>{7, 0, 9});

    // The name stands for the file in errors; the limit and the classes apply as to files.
    expectIoError([&] { parseIdxImages(imageBytes, "images in memory", 59); }, ErrorCode::CorruptDataset,
                  "images in memory", "more than the limit of 59");
    expectIoError([&] { parseIdxLabels(readBytes(labelsPath), "labels in memory", 9); },
                  ErrorCode::CorruptDataset, "labels in memory", "label 9 of sample 2");
    Bytes truncated = imageBytes;
    truncated.resize(truncated.size() - 3);
    expectIoError([&] { parseIdxImages(truncated, "cut"); }, ErrorCode::CorruptDataset, "cut",
                  gzip ? "the gzip stream is truncated" : "the file is truncated");
  }
  expectIoError([&] { parseIdxImages({}, "nothing"); }, ErrorCode::CorruptDataset, "nothing",
                "the data is 0 bytes long");
}

TEST_CASE("a header that claims more data than the file holds fails without trusting the claim") {
  // 60000 images of 28x28 are 188 MB as floats; the reader must stop at the
  // end of the 100 bytes of data without having made room for the claim.
  Bytes liar = idxHeader(0x00000803, {60000, 28, 28});
  liar.resize(liar.size() + 100, 0);
  expectIoError([&] { parseIdxImages(liar, "liar"); }, ErrorCode::CorruptDataset, "liar",
                "the header declares 47040000 bytes of data after the 16-byte header, but the data ends at "
                "byte offset 116 after 100 of them");
}

// --- Tensor datasets -------------------------------------------------------------------

namespace {

template <class T>
std::vector<uint8_t> bytesOf(const std::vector<T>& values) {
  std::vector<uint8_t> bytes(values.size() * sizeof(T));
  std::memcpy(bytes.data(), values.data(), bytes.size());
  return bytes;
}

struct FileTensor {
  std::string name;
  std::string dtype;
  std::vector<uint64_t> shape;
  std::vector<uint8_t> bytes;
};

Bytes tensorFile(const std::vector<FileTensor>& tensors) {
  std::vector<safetensors::TensorBytes> views;
  for (const FileTensor& t : tensors) views.push_back({t.name, t.dtype, t.shape, t.bytes});
  const std::vector<uint8_t> encoded = safetensors::encode(views, {});
  return Bytes(encoded.begin(), encoded.end());
}

// The MLP export's inputs: x [batch, 2, 3] float, labels [batch] int.
const std::vector<DataInput> kInputs = {{"x", DType::Float32, {4, 2, 3}}, {"labels", DType::Int32, {4}}};

std::vector<float> iotaFloats(std::size_t n) {
  std::vector<float> v(n);
  std::iota(v.begin(), v.end(), 0.0f);
  return v;
}

}  // namespace

TEST_CASE("a tensors file feeds each input from its tensor, int64 narrowed exactly") {
  const Bytes file =
      tensorFile({{"labels", "I64", {5}, bytesOf(std::vector<int64_t>{3, 1, -2, 0, 2147483647})},
                  {"unused", "F64", {1}, bytesOf(std::vector<double>{1.0})},
                  {"x", "F32", {5, 2, 3}, bytesOf(iotaFloats(30))}});
  const TensorSplit split = parseTensorSplit(file, "train.safetensors", kInputs);
  CHECK(split.count == 5);
  REQUIRE(split.tensors.size() == 2);
  const DataTensor& x = *split.find("x");
  CHECK(x.shape == Shape{5, 2, 3});
  CHECK(x.sampleElements() == 6);
  CHECK(x.floats == iotaFloats(30));
  const DataTensor& labels = *split.find("labels");
  CHECK(labels.dtype == DType::Int32);
  CHECK(labels.ints == std::vector<int32_t>{3, 1, -2, 0, 2147483647});
  CHECK(split.find("unused") == nullptr);

  // Batches follow the order's positions, as fillBatch does.
  const std::vector<int64_t> order = {4, 2, 0, 1, 3};
  std::vector<float> xs(12);
  std::vector<int32_t> ls(2);
  fillTensorBatch(x, order, 1, xs);
  fillTensorBatch(labels, order, 1, ls);
  CHECK(std::vector<float>(xs.begin(), xs.begin() + 6) == std::vector<float>{12, 13, 14, 15, 16, 17});
  CHECK(std::vector<float>(xs.begin() + 6, xs.end()) == std::vector<float>{0, 1, 2, 3, 4, 5});
  CHECK(ls == std::vector<int32_t>{-2, 3});
  TESSERA_CHECK_ERROR(fillTensorBatch(x, order, 4, xs), ConfigError, ErrorCode::OutOfRange);
  std::vector<float> partial(7);
  TESSERA_CHECK_ERROR(fillTensorBatch(x, order, 0, partial), GraphError, ErrorCode::HostShapeMismatch);
  TESSERA_CHECK_ERROR(fillTensorBatch(x, order, 0, ls), GraphError, ErrorCode::HostShapeMismatch);

  // I32 feeds int inputs as they are.
  const Bytes ints = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{7, -1})},
                                 {"x", "F32", {2, 2, 3}, bytesOf(iotaFloats(12))}});
  CHECK(parseTensorSplit(ints, "f", kInputs).find("labels")->ints == std::vector<int32_t>{7, -1});

  // F16 feeds float inputs, widened exactly: 1, -2, 65504 (the largest half), 2^-24 (the
  // smallest subnormal), -0, 1/3 rounded to a half (0x3555 = 0.333251953125), and six more.
  std::vector<uint16_t> halves = {0x3c00, 0xc000, 0x7bff, 0x0001, 0x8000, 0x3555};
  for (uint16_t h = 0x4000; halves.size() < 12; h += 0x0100) halves.push_back(h);
  const Bytes f16 = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{0, 1})},
                                {"x", "F16", {2, 2, 3}, bytesOf(halves)}});
  const std::vector<float> widened = parseTensorSplit(f16, "f", kInputs).find("x")->floats;
  REQUIRE(widened.size() == 12);
  CHECK(widened[0] == 1.0f);
  CHECK(widened[1] == -2.0f);
  CHECK(widened[2] == 65504.0f);
  CHECK(widened[3] == std::ldexp(1.0f, -24));
  CHECK((widened[4] == 0.0f && std::signbit(widened[4])));
  CHECK(widened[5] == 0.333251953125f);
  CHECK(widened[6] == 2.0f);
  CHECK(widened[7] == 2.5f);  // 0x4100: 2 * (1 + 256 / 1024)
}

TEST_CASE("a float16 input is fed from F16 or F32 tensors as floats, and takes no integers") {
  const std::vector<DataInput> inputs = {{"x", DType::Float16, {4, 2, 3}}, {"labels", DType::Int32, {4}}};
  std::vector<uint16_t> halves;
  for (uint16_t h = 0x3c00; halves.size() < 12; h += 0x0101) halves.push_back(h);
  std::vector<float> expected(halves.size());
  halvesToFloats(halves.data(), expected.data(), halves.size());
  const Bytes f16 = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{0, 1})},
                                {"x", "F16", {2, 2, 3}, bytesOf(halves)}});
  const TensorSplit fromHalves = parseTensorSplit(f16, "f", inputs);
  const DataTensor& x = *fromHalves.find("x");
  CHECK(x.dtype == DType::Float16);
  CHECK(x.floats == expected);
  std::vector<float> batch(6);
  const std::vector<int64_t> order = {1, 0};
  fillTensorBatch(x, order, 0, batch);
  CHECK(batch == std::vector<float>(expected.begin() + 6, expected.end()));
  std::vector<int32_t> ints(6);
  TESSERA_CHECK_ERROR(fillTensorBatch(x, order, 0, ints), GraphError, ErrorCode::HostShapeMismatch);

  // F32 values are fed as they are; the device rounds what a float16 input stores.
  const Bytes f32 = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{0, 1})},
                                {"x", "F32", {2, 2, 3}, bytesOf(iotaFloats(12))}});
  CHECK(parseTensorSplit(f32, "f", inputs).find("x")->floats == iotaFloats(12));

  const Bytes integers = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{0, 1})},
                                     {"x", "I32", {2, 2, 3}, bytesOf(std::vector<int32_t>(12, 1))}});
  const auto error = test::catchError<IoError>([&] { parseTensorSplit(integers, "d.safetensors", inputs); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::DatasetTensorMismatch);
  CHECK(error->detail() == "the tensor is I32 but graph input x is float16; store it as F32 or F16");

  // keepFirstSamples (limitTestSamples) cuts float16 tensors like float32 ones.
  const test::TempDir dir;
  const std::string path = (dir.path() / "h.safetensors").string();
  {
    std::FILE* out = std::fopen(path.c_str(), "wb");
    REQUIRE(out != nullptr);
    std::fwrite(f16.data(), 1, f16.size(), out);
    std::fclose(out);
  }
  DataConfig config;
  config.dataset = DatasetKind::Tensors;
  config.path = path;
  config.limitTrainSamples = 1;
  const TensorDataset limited = loadTensorDataset(config, inputs);
  CHECK(limited.train.count == 1);
  CHECK(limited.train.find("x")->floats == std::vector<float>(expected.begin(), expected.begin() + 6));
}

TEST_CASE("a tensors file that does not fit the inputs names the file and the tensor") {
  const auto x = [](std::vector<uint64_t> shape, std::string dtype = "F32") {
    uint64_t n = 1;
    for (uint64_t d : shape) n *= d;
    return FileTensor{"x", dtype, shape, std::vector<uint8_t>(n * (dtype == "F64" ? 8 : 4), 0)};
  };
  const auto labels = [](uint64_t n, std::string dtype = "I64", int64_t value = 1) {
    return FileTensor{
        "labels",
        dtype,
        {n},
        dtype == "I64" ? bytesOf(std::vector<int64_t>(n, value)) : std::vector<uint8_t>(n * 4, 0)};
  };
  struct Case {
    std::string name;
    Bytes file;
    ErrorCode code;
    std::string subject;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"a missing input",
       tensorFile({x({4, 2, 3}), {"label", "I64", {4}, bytesOf(std::vector<int64_t>(4, 0))}}),
       ErrorCode::DatasetTensorMissing, "d.safetensors: tensor labels", "did you mean \"label\"?"},
      {"float64 for float32", tensorFile({x({4, 2, 3}, "F64"), labels(4)}), ErrorCode::DatasetTensorMismatch,
       "d.safetensors: tensor x", "the tensor is F64 but graph input x is float32; store it as F32 or F16"},
      {"floats for ints", tensorFile({x({4, 2, 3}), labels(4, "F32")}), ErrorCode::DatasetTensorMismatch,
       "d.safetensors: tensor labels", "store it as I32 or I64"},
      {"another sample shape", tensorFile({x({4, 3, 2}), labels(4)}), ErrorCode::DatasetTensorMismatch,
       "d.safetensors: tensor x", "takes samples of shape [2, 3]"},
      {"another rank", tensorFile({x({4, 6}), labels(4)}), ErrorCode::DatasetTensorMismatch,
       "d.safetensors: tensor x", "store [N, 2, 3]"},
      {"an int64 beyond 32 bits", tensorFile({x({4, 2, 3}), labels(4, "I64", int64_t{1} << 31)}),
       ErrorCode::DatasetTensorMismatch, "d.safetensors: tensor labels", "does not fit in 32 bits"},
      {"different lengths", tensorFile({x({4, 2, 3}), labels(3)}), ErrorCode::DatasetLengthMismatch,
       "d.safetensors: tensor labels", "the tensor has 3 samples but tensor x has 4"},
      {"not safetensors", Bytes{'h', 'e', 'l', 'l', 'o', ' ', 'w', 'o', 'r', 'l', 'd'},
       ErrorCode::CorruptDataset, "d.safetensors", "header length"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const auto error =
        test::catchError<IoError>([&] { (void)parseTensorSplit(c.file, "d.safetensors", kInputs); });
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
  const auto missing =
      test::catchError<IoError>([] { (void)readTensorSplit("no/such/file.safetensors", kInputs); });
  REQUIRE(missing.has_value());
  CHECK(missing->code() == ErrorCode::FileUnreadable);
}

TEST_CASE("loadTensorDataset reads the train and test files and keeps the first samples") {
  const test::TempDir dir;
  const Bytes train = tensorFile({{"labels", "I32", {6}, bytesOf(std::vector<int32_t>{0, 1, 2, 3, 0, 1})},
                                  {"x", "F32", {6, 2, 3}, bytesOf(iotaFloats(36))}});
  const Bytes test = tensorFile({{"labels", "I32", {2}, bytesOf(std::vector<int32_t>{3, 2})},
                                 {"x", "F32", {2, 2, 3}, bytesOf(iotaFloats(12))}});
  DataConfig config;
  config.dataset = DatasetKind::Tensors;
  config.path = dir.write("train.safetensors", std::string(train.begin(), train.end()));
  config.test = dir.write("test.safetensors", std::string(test.begin(), test.end()));
  config.limitTrainSamples = 4;
  const TensorDataset dataset = loadTensorDataset(config, kInputs);
  CHECK(dataset.train.count == 4);
  CHECK(dataset.train.find("x")->floats == iotaFloats(24));
  CHECK(dataset.train.find("labels")->ints == std::vector<int32_t>{0, 1, 2, 3});
  CHECK(dataset.test.count == 2);
  CHECK(dataset.source.find("train.safetensors") != std::string::npos);
  config.test.clear();
  CHECK(loadTensorDataset(config, kInputs).test.count == 0);
  // loadDataset reads the IDX kinds only.
  TESSERA_CHECK_ERROR(loadDataset(config), ConfigError, ErrorCode::InvalidData);
}
