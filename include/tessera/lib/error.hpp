// Errors with stable ids.
//
// Every error tessera reports is an exception derived from tessera::Error and
// carries an ErrorCode. The code's number never changes meaning once released;
// its printed id is "tessera.KIND.NNN" (e.g. "tessera.config.102"). Messages
// have the form
//
//   [tessera.config.102] /sessionOptions/weightTensorLocationSettings/location/storage:
//   invalid value "onchip"; expected one of "OnChip", "OffChip" (did you mean "OnChip"?)
//
// i.e. the id, the subject (a JSON path, a tensor name, a file), what was
// found, what is allowed and, where one exists, a fix. docs/errors.md lists
// every code with an example message; a test keeps that list complete.
//
// The library never prints and never exits: callers decide.
#pragma once

#include <cstdint>
#include <span>
#include <stdexcept>
#include <string>
#include <string_view>

namespace tessera {

enum class ErrorKind { Config, Graph, Autodiff, Device, Dist, Io, Onnx, Internal };

// The number's hundreds digit is the kind: 1xx config, 2xx graph,
// 3xx autodiff, 4xx device, 5xx dist, 6xx io, 7xx onnx, 9xx internal.
enum class ErrorCode : int {
  // --- JSON documents and overrides (1xx) ---
  JsonSyntax = 101,        // malformed JSON, trailing garbage, invalid UTF-8
  InvalidEnumValue = 102,  // a string that names no enumerator
  WrongType = 103,         // e.g. a string where a number is expected
  UnknownKey = 104,        // a key the schema does not have
  DuplicateKey = 105,      // the same key twice in one object
  OutOfRange = 106,        // a number outside the allowed range
  BadOverride = 107,       // a malformed --set PATH=VALUE
  DocumentLimit = 108,     // nesting depth or document size over the limit
  // --- SessionOptions rules (11x-13x) ---
  ReplicationDisabledButCount = 110,    // enableReplicatedGraphs false, count > 1
  AccumulationDisabledButFactor = 111,  // enableGradientAccumulation false, factor > 1
  GlobalReplicationFactorTooSmall = 112,
  GlobalReplicaOffsetNegative = 113,
  GlobalReplicaOffsetTooLarge = 114,
  LocalReplicationFactorOne = 115,  // local replication enabled with count 1
  LocalLargerThanGlobal = 116,
  GlobalNotMultipleOfLocal = 117,
  GlobalReplicaOffsetMisaligned = 118,  // offset not a multiple of the local count
  InvalidIOTileCount = 119,             // odd or below 32
  IOTilesExceedTiles = 120,             // numIOTiles >= tilesPerIpu
  IOTileSetWithoutIOTiles = 121,
  ShardingDomainDoesNotDivide = 122,
  LinkedShardingDomainsDiffer = 123,
  NegativeThreshold = 124,
  UnsupportedCombination = 125,
  StorageTileSetWithoutIOLoad = 126,  // storageTileSet IO has no effect with loadTileSet Compute
  DistributedSettingsWithoutDistribution = 127,
  InvalidLossScaling = 128,  // loss scaling bounds that contradict each other or the initial scale
  // --- Groupings and shard layouts (14x) ---
  InvalidReplicaGrouping = 140,       // a non-positive count, stride or group size
  ReplicaGroupingNotDivisible = 141,  // numReplicas % (stride * groupSize) != 0
  ReplicaIndexOutOfRange = 142,
  GroupIndexOutOfRange = 143,
  TransposeNotRepresentable = 144,
  NotACommGroup = 145,  // a grouping that has no CommGroup equivalent
  InvalidCommGroup = 146,
  InvalidShardLayout = 147,  // negative elements or fewer than one shard
  ShardBufferSizeMismatch = 148,
  StridedGroupingNotTiling = 149,  // stride != 1 and stride * groupSize != numReplicas (PopXL's rule)
  // --- Run config sections (15x) ---
  InvalidModel = 150,
  InvalidOptimizer = 151,
  InvalidData = 152,
  InvalidDeviceSpec = 153,
  ShapeTooLarge = 154,  // a size the run config implies overflows or exceeds /limits/maxTensorBytes
  InvalidOutput = 155,  // an output section that asks for what it cannot do
  // --- Recomputation and larger-than-a-chip options (16x) ---
  RecomputationNeedsPipelining = 160,  // autoRecomputation Pipeline without pipelining
  // --- Batches per step and anchors (17x) ---
  InvalidBatchesPerStep = 170,    // batchesPerStep < 1, or more batches than the run has
  InvalidAnchorReturnType = 171,  // an unknown return type, or EveryN's period not dividing batchesPerStep
  InvalidAnchor = 172,            // an anchor naming no output, or named twice
  // --- Virtual graphs: several IPUs per replica (173-181) ---
  VirtualGraphModeUnsupported = 173,       // retired: ExecutionPhases is phased execution (191-194)
  IpusPerReplicaWithoutVirtualGraphs = 174,  // ipusPerReplica > 1 with virtualGraphMode Off
  VirtualGraphWithModeOff = 175,           // an op names an IPU but virtualGraphMode is Off
  ManualWithoutVirtualGraphs = 176,        // virtualGraphMode Manual but no op names an IPU
  PartialVirtualGraphs = 177,              // some ops name an IPU, others do not
  VirtualGraphOutOfRange = 178,            // an op's IPU at or above ipusPerReplica
  // --- Host streams (182-184) ---
  UnknownHostStream = 182,           // io settings for a stream the model does not have
  HostStreamIOTilesWithoutIOTiles = 183,  // a stream on TileSet IO with numIOTiles 0
  UnsupportedExchangeStrategy = 184,  // OverlapStep: PopART declares it and does not support it
  // --- Command-line options (19x) ---
  InvalidOption = 190,  // a command-line option's value outside its range (a usage error, exit 2)
  // --- Phased execution (191-194) ---
  ExecutionPhasesWithoutPhases = 191,   // virtualGraphMode ExecutionPhases with executionPhaseSettings.phases < 2
  PhasesWithoutExecutionPhases = 192,   // executionPhaseSettings.phases >= 2 with another virtualGraphMode
  InvalidExecutionPhaseStages = 193,    // stages not 1 or 2, or ipusPerReplica not equal to stages
  ExecutionPhasesWithPipelining = 194,  // virtualGraphMode ExecutionPhases with enablePipelining
  // --- Pipelining (195-199) ---
  PipeliningWithoutVirtualGraphs = 195,  // enablePipelining with virtualGraphMode Off or one IPU per replica
  PipeliningAccumulationTooLow = 196,    // accumulationFactor below the pipeline's stages (2 x forward stages - 1)
  PartialPipelineStages = 197,           // some ops name a pipeline stage, others do not
  PipelineStageOnTwoIpus = 198,          // the ops of one pipeline stage on two IPUs
  PipelineStagesOutOfOrder = 199,        // stages not numbered 0, 1, ... or not in the order of their IPUs
  // --- Graph construction (2xx) ---
  ShapeMismatch = 201,
  InvalidOperand = 202,
  UnknownTensor = 203,
  DuplicateTensorName = 204,
  InvalidAxis = 205,
  HostShapeMismatch = 206,
  InvalidProgramOrder = 207,
  InvalidCollective = 208,
  InvalidRemoteBuffer = 209,
  ReplicationFactorMismatch = 210,  // a graph built for another replication factor
  UnknownStream = 211,              // a step input or output name the program does not have
  DTypeMismatch = 212,              // float16 and float32 operands of one op (cast one of them)
  InvalidRecompute = 220,           // a recompute annotation on an op that cannot be recomputed
  InvalidRecurrence = 221,          // a recurrence's weights or states that do not fit its cell and direction
  InvalidVirtualGraph = 230,        // a negative IPU given to Graph::setVirtualGraph
  InvalidInputSettings = 240,       // input settings for a tensor that is not a graph input
  InvalidPipelineStage = 250,       // a negative stage given to Graph::setPipelineStage
  PipelineStageBackwards = 251,     // a forward op reading a value of a later pipeline stage
  InvalidExecutionPhase = 252,      // a negative phase given to Graph::setExecutionPhase
  ExecutionPhaseOutOfRange = 253,   // an op's execution phase at or above executionPhaseSettings.phases
  PartialExecutionPhases = 254,     // some forward ops name an execution phase, others do not
  ExecutionPhaseBackwards = 255,    // a forward op reading a value of a later execution phase
  // --- Autodiff (3xx) ---
  NoGradient = 301,
  LossNotScalar = 302,
  // --- Device (4xx) ---
  OutOfMemory = 401,
  InvalidProgram = 402,
  TrainingDiverged = 403,  // a non-finite training loss: training stopped at that step
  InvalidHostStream = 410,  // a program's host stream the device cannot model
  HostMemoryLimit = 415,   // the host memory train would allocate exceeds /limits/maxHostBytes
  // --- Distributed (5xx) ---
  InconsistentDistEnv = 501,
  InstanceMismatch = 502,
  InstanceLost = 503,
  MpiUnavailable = 504,
  InconsistentIpusPerReplica = 505,  // tessera launch --ipus-per-replica against /device/ipusPerReplica
  InstancesNotJoined = 507,  // not every instance started MPI within the launcher's timeout
  TooManyInstances = 508,    // more instances than the machine's limits let mpirun start
  // --- Files (6xx) ---
  FileUnreadable = 601,
  FileUnwritable = 602,
  CorruptCheckpoint = 603,
  CheckpointMismatch = 604,
  CorruptDataset = 605,
  UnsupportedCheckpoint = 606,  // a well-formed file this tessera cannot use
  OutputUnwritable = 607,       // an output path where no file can be created, found before the run
  DatasetTensorMissing = 608,   // a graph input that the tensors dataset has no tensor for
  DatasetTensorMismatch = 609,  // a dataset tensor whose dtype, shape or values do not fit its graph input
  DatasetLengthMismatch = 610,  // dataset tensors with different numbers of samples
  NonFiniteCheckpoint = 611,    // a checkpoint tensor holding NaN or infinity, refused on load unless allowed
  // --- ONNX import and export (7xx) ---
  OnnxUnavailable = 701,         // this build has no ONNX support
  OnnxMalformed = 702,           // not a ModelProto / TensorProto, truncated, inconsistent tensor data
  OnnxUnsupportedOpset = 703,    // a domain other than the default one, or an opset outside 11-17
  OnnxUnsupportedOp = 704,       // an op type with no mapping onto tessera's ops
  OnnxUnsupportedFeature = 705,  // a supported op type used in a way the mapping cannot run exactly
  OnnxUnboundDimension = 706,    // a symbolic dimension without a value
  OnnxInvalidGraph = 707,        // a cycle, a value with no producer, a missing attribute or input
  OnnxNodeShape = 708,           // a node whose operands do not fit the op
  OnnxTooLarge = 709,            // a value computed at import over the size limit
  OnnxExportMismatch = 710,      // values to write that do not fit the model's initializers
  OnnxInvalidRecompute = 720,    // a __recompute_output_in_backward_pass value that is no RecomputeType
  OnnxUnsupportedRecurrence = 721,  // an RNN, GRU or LSTM attribute or input the recurrences do not take
  OnnxInvalidIpuNumber = 730,    // an __ipu_number that is not a non-negative integer
  OnnxBuilderUnknown = 735,      // OnnxBuilder: an op type, attribute or tensor name it does not know
  OnnxBuilderInvalid = 736,      // OnnxBuilder: an element type, count, attribute value or model it refuses
  OnnxUnsupportedScatterReduction = 737,  // a ScatterElements reduction other than none and add
  // --- Internal (9xx) ---
  Internal = 901,
};

// "config", "graph", ...
std::string_view kindName(ErrorKind kind) noexcept;
ErrorKind kindOf(ErrorCode code) noexcept;
// "tessera.config.102"
std::string errorId(ErrorCode code);
// The enumerator's name, e.g. "InvalidEnumValue".
std::string_view errorCodeName(ErrorCode code) noexcept;
// Every code, in numeric order; for documentation and tests.
std::span<const ErrorCode> allErrorCodes() noexcept;

// How much of an input value a message quotes: a key, an enum string, a name
// or a path of any length is quoted as its first bytes, then "...", then its
// length, so that a huge input never makes a huge message.
inline constexpr std::size_t kMaxQuotedBytes = 200;
// The same for an error's subject (a JSON path or file name).
inline constexpr std::size_t kMaxSubjectBytes = 1024;

// `text` when it has at most `maxBytes` bytes, else its first `maxBytes`
// bytes (not cutting a UTF-8 sequence) followed by "... (N bytes)".
std::string boundedText(std::string_view text, std::size_t maxBytes = kMaxQuotedBytes);

class Error : public std::runtime_error {
 public:
  // `subject` is the JSON path, tensor name or file the message is about;
  // it may be empty when there is none. A subject longer than
  // kMaxSubjectBytes is kept as boundedText(subject, kMaxSubjectBytes).
  Error(ErrorCode code, std::string subject, std::string_view message);

  ErrorCode code() const noexcept { return code_; }
  ErrorKind kind() const noexcept { return kindOf(code_); }
  std::string id() const { return errorId(code_); }
  const std::string& subject() const noexcept { return subject_; }
  // The message without the "[id] subject: " prefix.
  const std::string& detail() const noexcept { return detail_; }

 private:
  ErrorCode code_;
  std::string subject_;
  std::string detail_;
};

// One class per kind so callers can catch by kind; the code passed in must be
// of that kind (tests check every throw site's id).
class ConfigError : public Error {
 public:
  using Error::Error;
};
class GraphError : public Error {
 public:
  using Error::Error;
};
class AutodiffError : public Error {
 public:
  using Error::Error;
};
class DeviceError : public Error {
 public:
  using Error::Error;
};
class DistError : public Error {
 public:
  using Error::Error;
};
class IoError : public Error {
 public:
  using Error::Error;
};
class OnnxError : public Error {
 public:
  using Error::Error;
};
class InternalError : public Error {
 public:
  using Error::Error;
};

}  // namespace tessera
