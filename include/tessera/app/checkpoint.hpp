// Checkpoints: a training session's weights and optimizer state in a
// .safetensors file, with what it takes to continue training as if it had
// never stopped.
//
//   tessera::saveCheckpoint(session, "out/model.safetensors");
//   ...
//   tessera::CheckpointLoadReport report = tessera::loadCheckpoint(other, "out/model.safetensors");
//   for (const tessera::CheckpointWarning& w : report.warnings) std::cerr << "warning: " << w.text << '\n';
//
// The file is plain safetensors (8-byte little-endian header length, a JSON
// header, raw little-endian data), readable by the Python ecosystem. Tensors
// are logical: every variable in the host shape readVariable() returns with
// RetrievalMode::OnePerGroup ([numGroups, ...] for a grouped variable, RTS
// shards reassembled, streaming-memory variables read from their buffer).
// So a checkpoint loads into any replication factor, sharding setting,
// sharding domain, tensor location or instance count whose model has the
// same tensors.
//
// Saved: the variables of category Weight and OptimizerState, except the
// optimizer's hyper-parameter scalars ("optimizer.<name>", recomputed from the
// step and the learning rate before every step), so the float32 master
// weights "W.master" of float16 weights are saved. Not saved: Accumulator
// variables, which carry nothing from one step to the next (the first
// micro-batch of a step overwrites them), and activations.
//
// Dtypes: a float32 variable is stored as F32, a float16 one as F16 (the
// exact half bits), an int32 one as I32. Loading converts between the two
// float types: an F32 tensor into a float16 variable is rounded to nearest
// even; an F16 tensor into a float32 variable is widened exactly. A float16
// run's master weight that the checkpoint does not hold (a checkpoint of a
// float32 run) takes its weight's checkpoint value exactly; master weights
// that the run does not keep are not loaded (the weights take the F16
// values). Integer and float tensors never convert into each other.
//
// Metadata ("__metadata__", all values strings):
//   format             "tessera.checkpoint"
//   formatVersion      "1" (kCheckpointFormatVersion)
//   tesseraVersion     the version of the tessera that wrote it
//   step               steps run when saved
//   optimizerStep      the step the optimizer's step-dependent values (SGD's
//                      first-step momentum, Adam's bias correction) continue
//                      from; equal to step
//   optimizer          the optimizer as run config JSON, learningRate being the
//                      current one: {"type": "SGD", "learningRate": 0.05, ...}
//   sessionOptions     the canonical JSON dump of the SessionOptions
//   sessionOptionsHash sessionOptionsHash() of those options
//   tensors            JSON {NAME: {"category": "Weight", "shardLayoutVersion": 1}, ...}
//                      (ShardLayout::kVersion when written)
// plus any extra keys the writer added (the trainer adds "runConfig" and
// "globalBatch").
//
// Writes are atomic: the bytes go to "FILE.tmp.<pid>" in the same folder,
// which is synced and renamed over FILE, and the folder is synced; a failure
// at any point removes the temporary file and leaves a previous FILE as it
// was. A process killed while writing leaves FILE intact (and possibly its
// temporary file, which nothing reads).
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/lib/shard_layout.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

inline constexpr int kCheckpointFormatVersion = 1;

struct CheckpointTensor {
  std::string name;
  DType dtype = DType::Float32;  // stored as F32, F16 or I32
  TensorCategory category = TensorCategory::Weight;
  int shardLayoutVersion = ShardLayout::kVersion;
  // Logical host shape; int32 and float16 values as exact floats (a float16
  // tensor's values are rounded to half when encoded).
  HostTensor value;
  bool operator==(const CheckpointTensor&) const = default;
};

struct Checkpoint {
  int formatVersion = kCheckpointFormatVersion;
  std::string tesseraVersion;
  int64_t step = 0;
  int64_t optimizerStep = 0;
  // With the learning rate at the time of saving.
  OptimizerConfig optimizer;
  // Canonical JSON of the SessionOptions and sessionOptionsHash() of it.
  std::string sessionOptions;
  std::string sessionOptionsHash;
  // In data order.
  std::vector<CheckpointTensor> tensors;
  // Metadata keys other than tessera's own (listed above).
  std::map<std::string, std::string> extraMetadata;
  bool operator==(const Checkpoint&) const = default;
};

// What a warning of restoreCheckpoint() is about, so that a caller can pick
// warnings without reading their text.
enum class CheckpointWarningKind {
  SessionOptions,            // written with other session options: only where tensors live changes
  LearningRate,              // the checkpoint's learning rate replaces the session's
  OptimizerHyperParameters,  // other hyper-parameters: the session keeps its own
  RoundedToHalf,             // float16 variables took F32 values rounded to half
  WidenedFromHalf,           // float32 variables took F16 values (exactly)
  MastersFromWeights,        // no master weights saved: they took their weight's value
  UnusedMasters,             // the model keeps no master weights: the saved ones were not loaded
};

template <>
struct EnumNames<CheckpointWarningKind> {
  static constexpr std::string_view kTypeName = "CheckpointWarningKind";
  static constexpr std::array kNames = {
      std::pair{CheckpointWarningKind::SessionOptions, std::string_view{"SessionOptions"}},
      std::pair{CheckpointWarningKind::LearningRate, std::string_view{"LearningRate"}},
      std::pair{CheckpointWarningKind::OptimizerHyperParameters,
                std::string_view{"OptimizerHyperParameters"}},
      std::pair{CheckpointWarningKind::RoundedToHalf, std::string_view{"RoundedToHalf"}},
      std::pair{CheckpointWarningKind::WidenedFromHalf, std::string_view{"WidenedFromHalf"}},
      std::pair{CheckpointWarningKind::MastersFromWeights, std::string_view{"MastersFromWeights"}},
      std::pair{CheckpointWarningKind::UnusedMasters, std::string_view{"UnusedMasters"}}};
};

// A warning about the training state only (where tensors live, the learning
// rate, the optimizer's hyper-parameters), not about the values of the
// model: evaluating the checkpoint's weights can leave it out.
constexpr bool concernsTrainingOnly(CheckpointWarningKind kind) noexcept {
  return kind == CheckpointWarningKind::SessionOptions || kind == CheckpointWarningKind::LearningRate ||
         kind == CheckpointWarningKind::OptimizerHyperParameters;
}

struct CheckpointWarning {
  CheckpointWarningKind kind = CheckpointWarningKind::SessionOptions;
  std::string text;
  bool operator==(const CheckpointWarning&) const = default;
};

// What loadCheckpoint() restored, and what a caller may want to tell a user.
struct CheckpointLoadReport {
  int64_t step = 0;
  double learningRate = 0.0;
  // Differences that do not stop training: session options (replication,
  // RTS, locations, ...: the tensors are logical), optimizer hyper-parameters
  // that are compiled into the session (the session's values are kept), the
  // learning rate (the checkpoint's is restored), values converted between
  // float16 and float32, master weights made or left out. In this order.
  std::vector<CheckpointWarning> warnings;
};

// A stable hash of the canonical JSON dump of `options` (64-bit FNV-1a):
// "fnv1a64:" and 16 hex digits.
std::string sessionOptionsHash(const SessionOptions& options);

// The checkpoint of `session` now. `extraMetadata` is stored too; a key of
// tessera's own is ConfigError(DuplicateKey) with the key as subject. Throws
// ConfigError(InvalidOptimizer) for an optimizer other than Sgd and Adam.
Checkpoint makeCheckpoint(const TrainingSession& session,
                          std::map<std::string, std::string> extraMetadata = {});

// The .safetensors bytes of `checkpoint`.
std::vector<uint8_t> encodeCheckpoint(const Checkpoint& checkpoint);

// Reads a checkpoint from bytes, strictly; `source` names them in errors
// (a file name). Throws IoError only: CorruptCheckpoint for a damaged or
// malformed file (the container format, missing or invalid tessera
// metadata, metadata that disagrees with the tensors), UnsupportedCheckpoint
// for a well-formed file tessera cannot use (not a tessera checkpoint, a newer
// format or shard layout version, a dtype other than F32, F16 and I32).
Checkpoint decodeCheckpoint(std::span<const uint8_t> bytes, std::string_view source);

// The default bound of readCheckpoint(path): 4 GiB.
inline constexpr uint64_t kDefaultMaxCheckpointBytes = uint64_t{4} << 30;

// decodeCheckpoint of a file. IoError(FileUnreadable) when it cannot be read
// or is not a regular file (a folder, a FIFO, a device: refused without
// waiting or reading); CorruptCheckpoint when its header length does not fit
// the file; UnsupportedCheckpoint when the file is larger than `maxBytes`.
// Sizes are checked before anything is allocated.
Checkpoint readCheckpoint(const std::string& path, uint64_t maxBytes = kDefaultMaxCheckpointBytes);
// The same for a checkpoint to restore into `session`: the bound is what a
// checkpoint of the session's variables can hold (all of them float32, with
// float32 masters, plus the largest header), so a file far larger than the
// model is refused before it is read.
Checkpoint readCheckpoint(const std::string& path, const TrainingSession& session);
// A checkpoint file's header alone, as readCheckpoint(path) checks it (its
// metadata, and every tensor's name, dtype, shape and byte range against the
// file's size), without reading the tensors' data: each tensor's `value`
// has its shape and no data. At most 8 bytes + the header (64 MiB) are read
// and kept, whatever the file's size.
Checkpoint readCheckpointHeader(const std::string& path);
// Writes encodeCheckpoint(checkpoint) atomically (see above);
// IoError(FileUnwritable) naming the file and the system's reason.
void writeCheckpoint(const Checkpoint& checkpoint, const std::string& path);

// writeCheckpoint(makeCheckpoint(session, extraMetadata), path).
void saveCheckpoint(const TrainingSession& session, const std::string& path,
                    std::map<std::string, std::string> extraMetadata = {});

// Restores `checkpoint` into `session`: every saved variable, the learning
// rate and the step count, so that the next run() computes what the saving
// session's next run() would have (when the dtypes agree). Nothing is written
// unless everything matches: IoError(CheckpointMismatch) with subject
// `source` for another optimizer type, a tensor of the checkpoint the session
// does not have, a variable of the session the checkpoint does not have, or a
// different category or host shape, or an integer dtype where the other side
// has a float one (F32 and F16 convert as described above; each conversion
// is listed in the report's warnings). A tensor holding a NaN or an infinity
// (the checkpoint of a run that diverged) is IoError(NonFiniteCheckpoint)
// naming the tensor and the element unless `allowNonFinite`.
CheckpointLoadReport restoreCheckpoint(TrainingSession& session, const Checkpoint& checkpoint,
                                       std::string_view source, bool allowNonFinite = false);

// restoreCheckpoint(session, readCheckpoint(path, session), path, allowNonFinite).
CheckpointLoadReport loadCheckpoint(TrainingSession& session, const std::string& path,
                                    bool allowNonFinite = false);

}  // namespace tessera
