// Datasets: IDX files (MNIST, Fashion-MNIST), a synthetic stand-in, and the
// order in which a training run visits the samples.
//
// Loading: loadDataset(DataConfig) returns the train and test splits in host
// memory as float pixels in [0, 1] and int32 labels. IDX files may be gzip'd
// (recognised by their magic bytes, not their name). Damaged files are
// IoError(CorruptDataset) naming the file. The sizes a header declares are
// checked against a limit (maxItems) before anything is allocated, and
// memory then grows with the data actually read, so a header that claims
// more than its file holds costs nothing.
//
// Batching: a run with P instances, L local replicas per instance (R = P x L
// replicas in total), micro-batch B (DataConfig::batchSize) and gradient
// accumulation factor A consumes a global batch of B x R x A samples per
// step. Every instance reads its own contiguous part of each global batch:
//
//   order = epochOrder(N, seed, epoch, shuffle)     same on every instance
//   S     = B x L x A                               samples per step per instance
//   first = instanceStepOffset(k, S, P, i)          = (k x P + i) x S
//
// Instance i's step k reads positions first .. first + S of `order`, for
// k < N / (S x P); within them, accumulation micro-batch m of local replica
// r is the B positions from first + (m*L + r)*B. fillBatch copies any such
// run of positions into caller-owned host buffers. Step k's global batch is
// thus positions k x P x S onwards whatever P is, so a run trains on the same
// batches however its replicas are split between instances (with A = 1, each
// global replica even reads the same samples). Samples past the last whole
// global batch are not used in that epoch (drop_last), and since the order is
// reshuffled every epoch, a different remainder is left out each time.
//
// Tensor datasets: readTensorSplit reads a .safetensors file whose tensor of
// each graph input's name feeds that input, samples along axis 0 in file
// order (a PyTorch or NumPy program writes one with safetensors' save_file).
// F32 tensors feed float32 inputs, I32 and I64 tensors int32 inputs (int64
// values must fit in 32 bits). The epoch order and the instance split are
// those of the IDX datasets; fillTensorBatch copies a run of positions of a
// tensor into a host buffer as fillBatch does.
//
// instanceRange gives PopTorch's split instead, one contiguous block of the
// epoch per instance, for applications that want it; it allows the same
// number of steps per epoch.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera {

// Where Debian's dataset-fashion-mnist package installs the gzip'd IDX files;
// loadDataset reads Fashion-MNIST from here when DataConfig::path is empty.
inline constexpr std::string_view kFashionMnistFolder = "/usr/share/datasets/fashion-mnist";

// The largest number of items (pixels, or labels) an IDX file may declare
// unless the caller allows more: 1 GiB of unsigned bytes, i.e. 4 GiB of
// float pixels once read (Fashion-MNIST's training images are 47 million).
inline constexpr int64_t kDefaultMaxIdxItems = int64_t{1} << 30;

// Shape of the samples of every dataset loadDataset returns.
inline constexpr int64_t kImageRows = 28;
inline constexpr int64_t kImageCols = 28;
inline constexpr int32_t kNumClasses = 10;

// Size of the synthetic dataset when no limit is set (that of Fashion-MNIST).
inline constexpr int64_t kSyntheticTrainSamples = 60000;
inline constexpr int64_t kSyntheticTestSamples = 10000;

// The images of an IDX image file (magic 0x00000803).
struct IdxImages {
  int64_t count = 0;
  int64_t rows = 0;
  int64_t cols = 0;
  // count x rows x cols, row-major; each byte b becomes b / 255.
  std::vector<float> pixels;
};

// Reads an IDX image file (unsigned bytes, 3 dimensions), raw or gzip'd.
// At most `maxItems` pixels are accepted. IoError(FileUnreadable) when the
// file cannot be read, IoError(CorruptDataset) when it is not a valid file
// of that kind.
IdxImages readIdxImages(const std::string& path, int64_t maxItems = kDefaultMaxIdxItems);

// Reads an IDX label file (unsigned bytes, 1 dimension), raw or gzip'd.
// Every label must be below `numClasses`. Errors as for readIdxImages.
std::vector<int32_t> readIdxLabels(const std::string& path, int32_t numClasses = kNumClasses,
                                   int64_t maxItems = kDefaultMaxIdxItems);

// The same readers over bytes already in memory (a file read or received by
// the caller), raw or gzip'd; `name` stands for the file in errors. They
// share the file readers' code, checks and limit.
IdxImages parseIdxImages(std::span<const unsigned char> bytes, const std::string& name,
                         int64_t maxItems = kDefaultMaxIdxItems);
std::vector<int32_t> parseIdxLabels(std::span<const unsigned char> bytes, const std::string& name,
                                    int32_t numClasses = kNumClasses, int64_t maxItems = kDefaultMaxIdxItems);

// Samples of one split (train or test).
struct DatasetSplit {
  int64_t count = 0;
  int64_t rows = kImageRows;
  int64_t cols = kImageCols;
  // count x rows x cols floats in [0, 1], row-major.
  std::vector<float> images;
  // count labels in [0, kNumClasses).
  std::vector<int32_t> labels;

  int64_t sampleElements() const noexcept { return rows * cols; }
};

// An image file and its label file, which must hold the same number of
// samples (IoError(CorruptDataset) naming the label file otherwise).
DatasetSplit readIdxSplit(const std::string& imagesPath, const std::string& labelsPath,
                          int64_t maxItems = kDefaultMaxIdxItems);

struct Dataset {
  DatasetSplit train;
  DatasetSplit test;
  int32_t numClasses = kNumClasses;
  // What was loaded, e.g. `fashion-mnist from /data/fmnist` or `synthetic (seed 7)`.
  std::string source;
  // Empty, or something the user should be told: that Fashion-MNIST was not
  // installed and the synthetic set stands in for it, and how to install it.
  std::string notice;
};

// Loads the dataset `config` names, then keeps the first
// config.limitTrainSamples / limitTestSamples samples of each split (0: all).
// - fashion-mnist: {train,t10k}-{images-idx3,labels-idx1}-ubyte[.gz] from
//   config.path, or from `defaultFolder` when the path is empty. When the
//   default folder lacks the files, the synthetic set stands in and `notice`
//   says so; files missing from an explicit path are ConfigError(InvalidData)
//   at /data/path, since the user asked for that folder.
// - mnist: the same files from config.path, which must be set and hold them
//   (ConfigError(InvalidData) at /data/path).
// - synthetic: makeSyntheticDataset(config.seed, ...).
// Files that exist but are damaged are IoErrors; they never fall back.
Dataset loadDataset(const DataConfig& config, std::string_view defaultFolder = kFashionMnistFolder);

// A deterministic, learnable 10-class set of 28x28 images: each class has a
// blocky random prototype, and each sample is its class's prototype at a
// random brightness plus noise, clamped to [0, 1]. The same seed gives the
// same bytes on every platform; the first n samples do not depend on how many
// are made.
Dataset makeSyntheticDataset(int64_t seed, int64_t trainSamples = kSyntheticTrainSamples,
                             int64_t testSamples = kSyntheticTestSamples);

// Fills `order` with the sample indices 0..order.size()-1 in the order epoch
// `epoch` visits them: a Fisher-Yates shuffle driven by std::mt19937_64
// seeded from (seed, epoch) when `shuffle` is set, ascending otherwise. The
// result is the same with every standard library.
void fillEpochOrder(std::span<int64_t> order, int64_t seed, int64_t epoch, bool shuffle);
std::vector<int64_t> epochOrder(int64_t numSamples, int64_t seed, int64_t epoch, bool shuffle);

// A run of positions in an epoch order.
struct SampleRange {
  int64_t offset = 0;
  int64_t count = 0;
  bool operator==(const SampleRange&) const = default;
};

// The first position of the epoch order that instance `instanceIndex` of
// `numInstances` reads at step `step`, each instance reading `stepSamples`
// positions per step: (step x numInstances + instanceIndex) x stepSamples.
// ConfigError(OutOfRange) for a negative step, stepSamples or numInstances
// below 1, or an index outside [0, numInstances).
int64_t instanceStepOffset(int64_t step, int64_t stepSamples, int64_t numInstances, int64_t instanceIndex);

// The positions instance `instanceIndex` of `numInstances` reads each epoch:
// stepSamples * floor(numSamples / (stepSamples * numInstances)) of them,
// starting at instanceIndex times that count (PopTorch's drop_last split).
// The count is 0 when the dataset holds less than one step per instance.
// ConfigError(OutOfRange) for a negative numSamples, stepSamples or
// numInstances below 1, or an index outside [0, numInstances).
SampleRange instanceRange(int64_t numSamples, int64_t stepSamples, int64_t numInstances,
                          int64_t instanceIndex);

// Copies the samples at positions first .. first + labels.size() of `order`
// into `images` (labels.size() x split.sampleElements() floats) and `labels`.
// Allocates nothing. GraphError(HostShapeMismatch) when `images` has the
// wrong size; ConfigError(OutOfRange) when the positions run past `order` or
// an index in `order` is not a sample of `split`.
void fillBatch(const DatasetSplit& split, std::span<const int64_t> order, int64_t first,
               std::span<float> images, std::span<int32_t> labels);

// --- Tensor datasets ---------------------------------------------------------------

// A graph input that a tensor dataset feeds: its name, dtype and
// per-replica micro-batch shape [batch, ...sample shape].
struct DataInput {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
};

// The inputs of `graph` named `names`, with their dtypes and shapes.
// GraphError(UnknownTensor) for a name the graph does not have.
std::vector<DataInput> graphDataInputs(const Graph& graph, std::span<const std::string> names);

// The samples of one graph input: shape [count, ...sample shape].
struct DataTensor {
  std::string name;
  DType dtype = DType::Float32;
  Shape shape;
  std::vector<float> floats;  // Float32 and Float16 tensors (fed as floats)
  std::vector<int32_t> ints;  // Int32 tensors
  // Elements of one sample: the product of shape[1..].
  int64_t sampleElements() const noexcept;
};

// One split (train or test) of a tensor dataset: a tensor per graph input,
// in the order of the inputs, all with `count` samples.
struct TensorSplit {
  std::string source;  // the file
  int64_t count = 0;
  std::vector<DataTensor> tensors;
  // The tensor feeding input `name`; nullptr when there is none.
  const DataTensor* find(std::string_view name) const noexcept;
};

// Reads the tensors of a .safetensors file that feed `inputs`; the file's
// other tensors are not read. Errors name the file and the tensor:
// IoError(FileUnreadable) for a file that cannot be read,
// IoError(CorruptDataset) for one that is not a well-formed safetensors
// file, IoError(DatasetTensorMissing) for an input without a tensor of its
// name, IoError(DatasetTensorMismatch) for a tensor whose dtype or sample
// shape does not fit its input or whose int64 values do not fit in 32
// bits, IoError(DatasetLengthMismatch) for tensors with different numbers
// of samples.
TensorSplit readTensorSplit(const std::string& path, std::span<const DataInput> inputs);
// The same over the bytes of a file in memory; `name` stands for the file.
TensorSplit parseTensorSplit(std::span<const unsigned char> bytes, const std::string& name,
                             std::span<const DataInput> inputs);

struct TensorDataset {
  TensorSplit train;
  TensorSplit test;  // count 0 when there is no test set
  std::string source;
};

// The tensors dataset of `config` (dataset "Tensors"): config.path for
// training, config.test for testing when set, each checked against
// `inputs` (only their sample shapes matter, not their batch size), then the
// first config.limitTrainSamples / limitTestSamples samples kept.
TensorDataset loadTensorDataset(const DataConfig& config, std::span<const DataInput> inputs);

// Copies the samples of `tensor` at positions first .. first + n of `order`
// into `out` (n x sampleElements() values, n = out.size() / sampleElements()).
// Allocates nothing. GraphError(HostShapeMismatch) when `out` is not a whole
// number of samples or the dtype differs; ConfigError(OutOfRange) when the
// positions run past `order` or an index is not a sample of the tensor.
void fillTensorBatch(const DataTensor& tensor, std::span<const int64_t> order, int64_t first,
                     std::span<float> out);
void fillTensorBatch(const DataTensor& tensor, std::span<const int64_t> order, int64_t first,
                     std::span<int32_t> out);

}  // namespace tessera
