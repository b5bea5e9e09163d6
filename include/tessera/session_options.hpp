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

#include "tessera/enum_names.hpp"
#include "tessera/loss_scaling.hpp"
#include "tessera/reduction_type.hpp"
#include "tessera/tensor_location.hpp"

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
  ExecutionPhases,  // phased execution; refused until phases exist (config error 173)
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
  // crossing IPUs go through IpuCopy ops. ExecutionPhases is refused (config
  // error 173): tessera has no phased execution yet.
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
  // overflow (see tessera/loss_scaling.hpp). The initial scale is the
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
// validate(options, device) (tessera/device_spec.hpp) checks the tile counts
// against a device too.
void validate(const SessionOptions& options);

}  // namespace tessera
