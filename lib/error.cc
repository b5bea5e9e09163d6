#include "tessera/lib/error.hpp"

#include <array>
#include <utility>

#include <fmt/format.h>

namespace tessera {
namespace {

struct CodeName {
  ErrorCode code;
  std::string_view name;
};

#define TESSERA_CODE(Name) CodeName{ErrorCode::Name, #Name}
constexpr std::array kCodeNames = {
    TESSERA_CODE(JsonSyntax),
    TESSERA_CODE(InvalidEnumValue),
    TESSERA_CODE(WrongType),
    TESSERA_CODE(UnknownKey),
    TESSERA_CODE(DuplicateKey),
    TESSERA_CODE(OutOfRange),
    TESSERA_CODE(BadOverride),
    TESSERA_CODE(DocumentLimit),
    TESSERA_CODE(ReplicationDisabledButCount),
    TESSERA_CODE(AccumulationDisabledButFactor),
    TESSERA_CODE(GlobalReplicationFactorTooSmall),
    TESSERA_CODE(GlobalReplicaOffsetNegative),
    TESSERA_CODE(GlobalReplicaOffsetTooLarge),
    TESSERA_CODE(LocalReplicationFactorOne),
    TESSERA_CODE(LocalLargerThanGlobal),
    TESSERA_CODE(GlobalNotMultipleOfLocal),
    TESSERA_CODE(GlobalReplicaOffsetMisaligned),
    TESSERA_CODE(InvalidIOTileCount),
    TESSERA_CODE(IOTilesExceedTiles),
    TESSERA_CODE(IOTileSetWithoutIOTiles),
    TESSERA_CODE(ShardingDomainDoesNotDivide),
    TESSERA_CODE(LinkedShardingDomainsDiffer),
    TESSERA_CODE(NegativeThreshold),
    TESSERA_CODE(UnsupportedCombination),
    TESSERA_CODE(StorageTileSetWithoutIOLoad),
    TESSERA_CODE(DistributedSettingsWithoutDistribution),
    TESSERA_CODE(InvalidLossScaling),
    TESSERA_CODE(InvalidReplicaGrouping),
    TESSERA_CODE(ReplicaGroupingNotDivisible),
    TESSERA_CODE(ReplicaIndexOutOfRange),
    TESSERA_CODE(GroupIndexOutOfRange),
    TESSERA_CODE(TransposeNotRepresentable),
    TESSERA_CODE(NotACommGroup),
    TESSERA_CODE(InvalidCommGroup),
    TESSERA_CODE(InvalidShardLayout),
    TESSERA_CODE(ShardBufferSizeMismatch),
    TESSERA_CODE(StridedGroupingNotTiling),
    TESSERA_CODE(InvalidModel),
    TESSERA_CODE(InvalidOptimizer),
    TESSERA_CODE(InvalidData),
    TESSERA_CODE(InvalidDeviceSpec),
    TESSERA_CODE(ShapeTooLarge),
    TESSERA_CODE(InvalidOutput),
    TESSERA_CODE(RecomputationNeedsPipelining),
    TESSERA_CODE(InvalidBatchesPerStep),
    TESSERA_CODE(InvalidAnchorReturnType),
    TESSERA_CODE(InvalidAnchor),
    TESSERA_CODE(IpusPerReplicaWithoutVirtualGraphs),
    TESSERA_CODE(VirtualGraphWithModeOff),
    TESSERA_CODE(ManualWithoutVirtualGraphs),
    TESSERA_CODE(PartialVirtualGraphs),
    TESSERA_CODE(VirtualGraphOutOfRange),
    TESSERA_CODE(UnknownHostStream),
    TESSERA_CODE(HostStreamIOTilesWithoutIOTiles),
    TESSERA_CODE(UnsupportedExchangeStrategy),
    TESSERA_CODE(InvalidOption),
    TESSERA_CODE(ExecutionPhasesWithoutPhases),
    TESSERA_CODE(PhasesWithoutExecutionPhases),
    TESSERA_CODE(InvalidExecutionPhaseStages),
    TESSERA_CODE(ExecutionPhasesWithPipelining),
    TESSERA_CODE(PipeliningWithoutVirtualGraphs),
    TESSERA_CODE(PipeliningAccumulationTooLow),
    TESSERA_CODE(PartialPipelineStages),
    TESSERA_CODE(PipelineStageOnTwoIpus),
    TESSERA_CODE(PipelineStagesOutOfOrder),
    TESSERA_CODE(ShapeMismatch),
    TESSERA_CODE(InvalidOperand),
    TESSERA_CODE(UnknownTensor),
    TESSERA_CODE(DuplicateTensorName),
    TESSERA_CODE(InvalidAxis),
    TESSERA_CODE(HostShapeMismatch),
    TESSERA_CODE(InvalidProgramOrder),
    TESSERA_CODE(InvalidCollective),
    TESSERA_CODE(InvalidRemoteBuffer),
    TESSERA_CODE(ReplicationFactorMismatch),
    TESSERA_CODE(UnknownStream),
    TESSERA_CODE(DTypeMismatch),
    TESSERA_CODE(InvalidRecompute),
    TESSERA_CODE(InvalidRecurrence),
    TESSERA_CODE(InvalidVirtualGraph),
    TESSERA_CODE(InvalidInputSettings),
    TESSERA_CODE(InvalidPipelineStage),
    TESSERA_CODE(PipelineStageBackwards),
    TESSERA_CODE(InvalidExecutionPhase),
    TESSERA_CODE(ExecutionPhaseOutOfRange),
    TESSERA_CODE(PartialExecutionPhases),
    TESSERA_CODE(ExecutionPhaseBackwards),
    TESSERA_CODE(NoGradient),
    TESSERA_CODE(LossNotScalar),
    TESSERA_CODE(OutOfMemory),
    TESSERA_CODE(InvalidProgram),
    TESSERA_CODE(TrainingDiverged),
    TESSERA_CODE(InvalidHostStream),
    TESSERA_CODE(HostMemoryLimit),
    TESSERA_CODE(InconsistentDistEnv),
    TESSERA_CODE(InstanceMismatch),
    TESSERA_CODE(InstanceLost),
    TESSERA_CODE(MpiUnavailable),
    TESSERA_CODE(InconsistentIpusPerReplica),
    TESSERA_CODE(InstancesNotJoined),
    TESSERA_CODE(TooManyInstances),
    TESSERA_CODE(FileUnreadable),
    TESSERA_CODE(FileUnwritable),
    TESSERA_CODE(CorruptCheckpoint),
    TESSERA_CODE(CheckpointMismatch),
    TESSERA_CODE(CorruptDataset),
    TESSERA_CODE(UnsupportedCheckpoint),
    TESSERA_CODE(OutputUnwritable),
    TESSERA_CODE(DatasetTensorMissing),
    TESSERA_CODE(DatasetTensorMismatch),
    TESSERA_CODE(DatasetLengthMismatch),
    TESSERA_CODE(NonFiniteCheckpoint),
    TESSERA_CODE(OnnxUnavailable),
    TESSERA_CODE(OnnxMalformed),
    TESSERA_CODE(OnnxUnsupportedOpset),
    TESSERA_CODE(OnnxUnsupportedOp),
    TESSERA_CODE(OnnxUnsupportedFeature),
    TESSERA_CODE(OnnxUnboundDimension),
    TESSERA_CODE(OnnxInvalidGraph),
    TESSERA_CODE(OnnxNodeShape),
    TESSERA_CODE(OnnxTooLarge),
    TESSERA_CODE(OnnxExportMismatch),
    TESSERA_CODE(OnnxInvalidRecompute),
    TESSERA_CODE(OnnxUnsupportedRecurrence),
    TESSERA_CODE(OnnxInvalidIpuNumber),
    TESSERA_CODE(OnnxBuilderUnknown),
    TESSERA_CODE(OnnxBuilderInvalid),
    TESSERA_CODE(OnnxUnsupportedScatterReduction),
    TESSERA_CODE(Internal),
};
#undef TESSERA_CODE

constexpr auto kAllCodes = [] {
  std::array<ErrorCode, kCodeNames.size()> codes{};
  for (std::size_t i = 0; i < kCodeNames.size(); ++i) codes[i] = kCodeNames[i].code;
  return codes;
}();

std::string formatWhat(ErrorCode code, const std::string& subject, std::string_view message) {
  if (subject.empty()) return fmt::format("[{}] {}", errorId(code), message);
  return fmt::format("[{}] {}: {}", errorId(code), subject, message);
}

std::string boundedSubject(std::string subject) {
  return subject.size() > kMaxSubjectBytes ? boundedText(subject, kMaxSubjectBytes) : subject;
}

}  // namespace

std::string_view kindName(ErrorKind kind) noexcept {
  switch (kind) {
    case ErrorKind::Config: return "config";
    case ErrorKind::Graph: return "graph";
    case ErrorKind::Autodiff: return "autodiff";
    case ErrorKind::Device: return "device";
    case ErrorKind::Dist: return "dist";
    case ErrorKind::Io: return "io";
    case ErrorKind::Onnx: return "onnx";
    case ErrorKind::Internal: return "internal";
  }
  return "internal";
}

ErrorKind kindOf(ErrorCode code) noexcept {
  switch (static_cast<int>(code) / 100) {
    case 1: return ErrorKind::Config;
    case 2: return ErrorKind::Graph;
    case 3: return ErrorKind::Autodiff;
    case 4: return ErrorKind::Device;
    case 5: return ErrorKind::Dist;
    case 6: return ErrorKind::Io;
    case 7: return ErrorKind::Onnx;
    default: return ErrorKind::Internal;
  }
}

std::string errorId(ErrorCode code) {
  return fmt::format("tessera.{}.{}", kindName(kindOf(code)), static_cast<int>(code));
}

std::string_view errorCodeName(ErrorCode code) noexcept {
  for (const auto& entry : kCodeNames)
    if (entry.code == code) return entry.name;
  return "Unknown";
}

std::span<const ErrorCode> allErrorCodes() noexcept { return kAllCodes; }

std::string boundedText(std::string_view text, std::size_t maxBytes) {
  if (text.size() <= maxBytes) return std::string(text);
  std::size_t cut = maxBytes;
  // Back to the start of a UTF-8 sequence (continuation bytes are 10xxxxxx).
  while (cut > 0 && (static_cast<unsigned char>(text[cut]) & 0xc0) == 0x80) --cut;
  return fmt::format("{}... ({} bytes)", text.substr(0, cut), text.size());
}

Error::Error(ErrorCode code, std::string subject, std::string_view message)
    : std::runtime_error(formatWhat(code, boundedSubject(subject), message)), code_(code),
      subject_(boundedSubject(std::move(subject))), detail_(message) {}

}  // namespace tessera
