// SessionOptions: everything a session needs to know about replication,
// gradient accumulation and where tensors live. Field names, meanings and
// defaults are PopART's, so option code written for PopART ports line by
// line. Defaults live only in the member initializers below; a golden test
// compares the JSON dump of SessionOptions{} with
// samples/configs/session_options.default.json.
//
// Options are plain data: setting a field never fails. validate() checks the
// cross-field rules and rejects (it never adjusts) with a ConfigError naming
// the JSON path under "/sessionOptions".
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "tessera/lib/enum_names.hpp"
#include "tessera/lib/loss_scaling.hpp"
#include "tessera/lib/reduction_type.hpp"
#include "tessera/lib/tensor_location.hpp"

namespace tessera {

// How a Mean reduction over accumulation steps is computed.
enum class MeanReductionStrategy {
  Running,  // s = f/(f+1)*s + g/(f+1) after each micro-batch; never overflows
  Post,     // sum all micro-batches, divide once at the end
};

template <>
struct EnumNames<MeanReductionStrategy> {
  static constexpr std::string_view kTypeName = "MeanReductionStrategy";
  static constexpr std::array kNames = {
      std::pair{MeanReductionStrategy::Running, std::string_view{"Running"}},
      std::pair{MeanReductionStrategy::Post, std::string_view{"Post"}}};
};

// Which forward ops are recomputed in the backward pass instead of keeping
// their outputs (PopART's RecomputationType). Per-op RecomputeType
// annotations (graph.hpp) override the automatic choice.
enum class RecomputationType {
  None,          // only the ops annotated Recompute are recomputed
  Standard,      // checkpoints chosen where few activations are live; the rest recomputed
  NormOnly,      // only normalisation ops are recomputed, every other op is a checkpoint
  Pipeline,      // each forward pipeline stage is recomputed; needs pipelining
  RecomputeAll,  // every forward op, except the last segment before the loss, is recomputed
};

template <>
struct EnumNames<RecomputationType> {
  static constexpr std::string_view kTypeName = "RecomputationType";
  static constexpr std::array kNames = {
      std::pair{RecomputationType::None, std::string_view{"None"}},
      std::pair{RecomputationType::Standard, std::string_view{"Standard"}},
      std::pair{RecomputationType::NormOnly, std::string_view{"NormOnly"}},
      std::pair{RecomputationType::Pipeline, std::string_view{"Pipeline"}},
      std::pair{RecomputationType::RecomputeAll, std::string_view{"RecomputeAll"}}};
};

// How the ops of a replica are placed on its IPUs (PopART's
// VirtualGraphMode; DeviceSpec::ipusPerReplica IPUs per replica).
enum class VirtualGraphMode {
  Off,              // one IPU per replica; no op may name an IPU
  Manual,           // every op names its IPU (ops::virtualGraph, an ONNX node's __ipu_number)
  Auto,             // the forward pass is split over the IPUs by memory; the rest follows
  ExecutionPhases,  // phased execution: ops by execution phase, phases on IPUs by executionPhaseSettings
};

template <>
struct EnumNames<VirtualGraphMode> {
  static constexpr std::string_view kTypeName = "VirtualGraphMode";
  static constexpr std::array kNames = {
      std::pair{VirtualGraphMode::Off, std::string_view{"Off"}},
      std::pair{VirtualGraphMode::Manual, std::string_view{"Manual"}},
      std::pair{VirtualGraphMode::Auto, std::string_view{"Auto"}},
      std::pair{VirtualGraphMode::ExecutionPhases, std::string_view{"ExecutionPhases"}}};
};

// When the tensors a phase streams in are loaded (PopART's
// ExecutionPhaseIOSchedule).
enum class ExecutionPhaseIOSchedule {
  Preload,   // during the previous phase, through the IO tiles beside its compute
  OnDemand,  // in the phase itself, just before the first op that reads them
};

template <>
struct EnumNames<ExecutionPhaseIOSchedule> {
  static constexpr std::string_view kTypeName = "ExecutionPhaseIOSchedule";
  static constexpr std::array kNames = {std::pair{ExecutionPhaseIOSchedule::Preload, std::string_view{"Preload"}},
                                        std::pair{ExecutionPhaseIOSchedule::OnDemand, std::string_view{"OnDemand"}}};
};

// The order of the optimizer's steps within a phase (PopART's
// ExecutionPhaseSchedule). Accepted and reported; tessera runs the steps of
// each weight one after the other whatever it says, which changes no number.
enum class ExecutionPhaseSchedule {
  Interleaving,      // load, update and store each weight's state in turn
  Batch,             // all loads, then all updates, then all stores
  BatchClusteredIO,  // as Batch, the loads and stores grouped into one transfer each
};

template <>
struct EnumNames<ExecutionPhaseSchedule> {
  static constexpr std::string_view kTypeName = "ExecutionPhaseSchedule";
  static constexpr std::array kNames = {
      std::pair{ExecutionPhaseSchedule::Interleaving, std::string_view{"Interleaving"}},
      std::pair{ExecutionPhaseSchedule::Batch, std::string_view{"Batch"}},
      std::pair{ExecutionPhaseSchedule::BatchClusteredIO, std::string_view{"BatchClusteredIO"}}};
};

// Phased execution (PopART's ExecutionPhaseSettings), read when
// virtualGraphMode is ExecutionPhases (sessions/transforms/execution_phases.hpp).
struct ExecutionPhaseSettings {
  // Forward execution phases: the forward pass runs in phases 0 .. phases-1
  // and the backward ops of forward phase p in phase 2 phases - 2 - p, as in
  // PopART. 0 or 1: no phased execution; ExecutionPhases needs >= 2
  // (config error 191), any other mode 0 or 1 (config error 192).
  int64_t phases = 0;
  // IPUs the phases take turns on: phase p runs on IPU p % stages. 1: every
  // phase on one IPU, streaming memory between phases; 2: ping-pong between
  // two IPUs, one computing while the other loads. 1 or 2 (config error 193),
  // and a replica has that many IPUs (/device/ipusPerReplica).
  int64_t stages = 2;
  // When each category's tensors that live off chip (their
  // *TensorLocationSettings OffChip) are loaded for a phase: Preload during
  // the phase before (overlapping its compute when the transfer goes through
  // the IO tiles), OnDemand in the phase itself.
  ExecutionPhaseIOSchedule weightIOSchedule = ExecutionPhaseIOSchedule::Preload;
  ExecutionPhaseIOSchedule activationIOSchedule = ExecutionPhaseIOSchedule::Preload;
  ExecutionPhaseIOSchedule optimizerStateIOSchedule = ExecutionPhaseIOSchedule::OnDemand;
  ExecutionPhaseIOSchedule accumulatorIOSchedule = ExecutionPhaseIOSchedule::Preload;
  // The order of the optimizer's steps within a phase (see the enum).
  ExecutionPhaseSchedule schedule = ExecutionPhaseSchedule::Interleaving;

  // The IO schedule of a tensor category.
  ExecutionPhaseIOSchedule ioSchedule(TensorCategory category) const noexcept;

  bool operator==(const ExecutionPhaseSettings&) const = default;
};

// JSON path of the SessionOptions object inside a run config; every path in
// a validation error or a location reason starts with it.
inline constexpr std::string_view kSessionOptionsPath = "/sessionOptions";

struct SessionOptions {
  // ---------------------------------------------------------------------
  // Replication within this instance
  // ---------------------------------------------------------------------

  // Run replicatedGraphCount copies (replicas) of the program in data
  // parallel. When false, replicatedGraphCount must be 1.
  bool enableReplicatedGraphs = false;

  // Local replication factor: the number of replicas this instance runs.
  // Must be >= 1; > 1 only with enableReplicatedGraphs.
  int64_t replicatedGraphCount = 1;

  // ---------------------------------------------------------------------
  // Replication across instances (launched with `tessera launch`/mpirun)
  // ---------------------------------------------------------------------

  // Replicas are spread over several instances. Usually filled in by
  // configureSessionOptions() from the launcher's environment.
  bool enableDistributedReplicatedGraphs = false;

  // Total replicas over all instances, this instance's included. Must be
  // >= 1 and a multiple of the local replication factor.
  int64_t globalReplicationFactor = 1;

  // Global index of this instance's first replica: a multiple of the local
  // replication factor, with offset + local <= global.
  int64_t globalReplicaOffset = 0;

  // ---------------------------------------------------------------------
  // Gradient accumulation
  // ---------------------------------------------------------------------

  // Accumulate gradients over accumulationFactor micro-batches before each
  // weight update. When false, accumulationFactor must be 1.
  bool enableGradientAccumulation = false;

  // Micro-batches per weight update. Must be >= 1.
  int64_t accumulationFactor = 1;

  // How gradients are reduced over micro-batches and replicas.
  ReductionType accumulationAndReplicationReductionType = ReductionType::Sum;

  // With Mean reduction: average as a running mean or sum then divide.
  MeanReductionStrategy meanAccumulationAndReplicationReductionStrategy = MeanReductionStrategy::Post;

  // ---------------------------------------------------------------------
  // Recomputation (training only)
  // ---------------------------------------------------------------------

  // Which forward ops are recomputed in the backward pass (the recomputation
  // transform, sessions/transforms/recompute.cc). Pipeline needs
  // enablePipelining (config error 160 otherwise, as in PopART).
  RecomputationType autoRecomputation = RecomputationType::None;

  // ---------------------------------------------------------------------
  // Virtual graphs: several IPUs per replica
  // ---------------------------------------------------------------------

  // How ops are placed on the DeviceSpec::ipusPerReplica IPUs of a replica
  // (the virtual graph transform, sessions/transforms/virtual_graph.cc).
  // Off needs ipusPerReplica 1 and no op naming an IPU; Manual needs every
  // forward op to name one (or none to: then all run on IPU 0), each below
  // ipusPerReplica; Auto splits the forward schedule into ipusPerReplica
  // contiguous parts of about equal memory. Backward, accumulation and
  // optimizer ops run on the IPU of their forward op or their weight; values
  // crossing IPUs go through IpuCopy ops. ExecutionPhases places ops by
  // execution phase (executionPhaseSettings), each phase on IPU
  // phase % stages.
  VirtualGraphMode virtualGraphMode = VirtualGraphMode::Off;

  // ---------------------------------------------------------------------
  // Pipelining
  // ---------------------------------------------------------------------

  // Run the IPUs of a replica as a pipeline (PopART's enablePipelining; the
  // pipelining transform, sessions/transforms/pipeline.cc): the forward
  // pipeline stages (OpNode::pipelineStage, by default each op's IPU) run
  // the micro-batches of a step one behind the other, each IPU stashing the
  // activations of the micro-batches in flight. Needs virtualGraphMode
  // Manual or Auto over >= 2 IPUs (config error 195) and, in training,
  // gradient accumulation with accumulationFactor >= 2 x forward stages - 1,
  // the pipeline's stages (config error 196). The numbers are those of the
  // accumulation run without pipelining; the time model runs the step in
  // fill, main and flush phases.
  bool enablePipelining = false;

  // ---------------------------------------------------------------------
  // Phased execution
  // ---------------------------------------------------------------------

  // The phases of virtualGraphMode ExecutionPhases (see the struct). Not
  // with enablePipelining (config error 194).
  ExecutionPhaseSettings executionPhaseSettings{};

  // ---------------------------------------------------------------------
  // Tiles
  // ---------------------------------------------------------------------

  // Tiles per processor set aside to stage transfers with streaming memory
  // (TileSet::IO). 0, or an even number >= 32 and below
  // DeviceSpec::tilesPerIpu. Any TileSet::IO setting needs it > 0.
  int64_t numIOTiles = 0;

  // ---------------------------------------------------------------------
  // Tensor locations, one setting per TensorCategory
  // ---------------------------------------------------------------------

  TensorLocationSettings activationTensorLocationSettings{};
  TensorLocationSettings weightTensorLocationSettings{};
  TensorLocationSettings optimizerStateTensorLocationSettings{};
  TensorLocationSettings accumulatorTensorLocationSettings{};

  // Per-tensor locations, by tensor name. Applied verbatim: thresholds and
  // downgrades do not apply to them.
  std::map<std::string, TensorLocation> tensorLocationSettingsOverride{};

  // ---------------------------------------------------------------------
  // Loss scaling (training only)
  // ---------------------------------------------------------------------

  // Adjust the loss scale during training and skip the steps whose gradients
  // overflow (see tessera/lib/loss_scaling.hpp). The initial scale is the
  // optimizer's lossScaling.
  AutomaticLossScalingSettings automaticLossScalingSettings{};

  // ---------------------------------------------------------------------
  // Derived values
  // ---------------------------------------------------------------------

  // Replicas this instance runs: replicatedGraphCount if replication is
  // enabled, else 1.
  int64_t getLocalReplicationFactor() const noexcept;
  // Replicas over all instances: globalReplicationFactor if distributed,
  // else the local factor.
  int64_t getGlobalReplicationFactor() const noexcept;
  // Global index of this instance's first replica (0 unless distributed).
  int64_t getGlobalReplicaOffset() const noexcept;
  // accumulationFactor; throws ConfigError(AccumulationDisabledButFactor)
  // when accumulation is disabled but the factor is > 1.
  int64_t getAccumulationFactor() const;

  // The settings of one category, and the key that names them in JSON
  // (e.g. "weightTensorLocationSettings").
  const TensorLocationSettings& locationSettings(TensorCategory category) const noexcept;
  TensorLocationSettings& locationSettings(TensorCategory category) noexcept;
  static std::string_view locationSettingsKey(TensorCategory category) noexcept;

  bool operator==(const SessionOptions&) const = default;
};

// Checks every cross-field rule; throws the first violation as a
// ConfigError whose subject is the JSON path under "/sessionOptions".
// validate(options, device) (tessera/simdevice/device_spec.hpp) checks the tile counts
// against a device too.
void validate(const SessionOptions& options);

}  // namespace tessera
