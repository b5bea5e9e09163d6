// Where a training run's tensors live and what its program costs, worked out
// without running it: the transforms a TrainingSession applies, then the
// device's memory planner and time model. `tessera explain` prints it (through
// tessera/app/run_plan.hpp, the plan of a run config), and a session whose program
// does not fit uses it to suggest settings that would.
//
//   tessera::RunPlan plan = tessera::planTraining(graph, loss, optimizer, options, spec);
//   for (const auto& t : plan.tensors) std::cout << t.name << " " << t.shardElements << "\n";
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/sessions/data_flow.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/graph.hpp"
#include "tessera/lib/location_resolver.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/lib/session_options.hpp"
#include "tessera/simdevice/time_model.hpp"

namespace tessera {

// One tensor of the compiled program as placed by the location transforms.
struct TensorPlacement {
  std::string name;
  TensorCategory category = TensorCategory::Activation;
  int64_t elements = 0;  // of the logical (unsharded) tensor
  // Element type: a replica holds shardElements x dtypeBytes(dtype) bytes.
  DType dtype = DType::Float32;
  // OffChip: kept in streaming memory (variables), or stored after the
  // forward pass and loaded for the backward pass (activations).
  TensorStorage storage = TensorStorage::OnChip;
  TileSet loadTileSet = TileSet::Compute;
  TileSet storageTileSet = TileSet::Compute;
  ReplicatedTensorSharding replicatedTensorSharding = ReplicatedTensorSharding::Off;
  // The replicas one copy is split over, when sharded.
  std::optional<ReplicaGrouping> shardingDomain;
  // Elements one replica holds: ceil(n/k) when sharded over k, else n.
  int64_t shardElements = 0;
  // Padding elements of one full copy: k ceil(n/k) - n.
  int64_t padding = 0;
  // The setting that decided, and every part of the request not applied.
  std::string reason;
};

// A requested location setting that was not applied to a tensor.
struct NotApplied {
  std::string tensor;
  LocationDowngrade downgrade;
};

struct RunPlan {
  Program program;  // the fully transformed per-replica program
  // Variables (weights, optimizer state, accumulators) in creation order,
  // then the activations the program keeps (one per tensor that owns storage).
  std::vector<TensorPlacement> tensors;
  std::vector<NotApplied> notApplied;
  MemoryReport memory;
  TimeReport time;
};

// Runs the training pipeline on a copy of `graph` with a clone of
// `optimizer`, then plans memory and time on `spec`. Throws what the
// session's constructor would (ConfigError, GraphError, AutodiffError)
// except that a program that does not fit is planned, not rejected.
// `dataFlow` gives the batches of a step and the loss's return type (tile
// set and exchange strategy included): the host streams the time model
// charges (Program::hostStreams).
RunPlan planTraining(Graph graph, TensorId loss, const Optimizer& optimizer, const SessionOptions& options,
                     const DeviceSpec& spec, const DataFlow& dataFlow = DataFlow{1});

// Throws the out-of-memory error a TrainingSession of these arguments would
// (DeviceError(OutOfMemory) with the settings that lower the short space's
// peak) when its program does not fit `spec`. Plans only: no values are made,
// so a model far larger than the host is refused at once. Returns the plan.
RunPlan requireTrainingFits(const Graph& graph, TensorId loss, const Optimizer& optimizer,
                            const SessionOptions& options, const DeviceSpec& spec);

// A setting that lowers the peak of a memory space that is over capacity.
struct MemorySuggestion {
  std::string
      setting;  // JSON path, e.g. "/sessionOptions/optimizerStateTensorLocationSettings/location/storage"
  std::string value;        // the value to set, as JSON ("\"OffChip\"")
  int64_t neededBytes = 0;  // the space's peak on that replica with the change
  int64_t savingBytes = 0;  // how much lower than now
  bool fits = false;        // the whole program then fits the device
  double stepSeconds = 0.0;  // the modelled step time with the change (TimeReport::stepSeconds)
};

// The settings that lower the peak of `shortfall`'s space, each planned with
// the change alone: streaming memory for a category, RTS for a category,
// RTS over all replicas instead of a smaller domain, recomputation when
// none is set (autoRecomputation Standard; RecomputeAll too when ops are
// marked Checkpoint, without which it recomputes nothing). Settings that make the
// program fit come first, then by saving; changes that save nothing are left
// out.
std::vector<MemorySuggestion> suggestMemorySettings(const Graph& graph, TensorId loss,
                                                    const Optimizer& optimizer, const SessionOptions& options,
                                                    const DeviceSpec& spec, const MemoryShortfall& shortfall,
                                                    const DataFlow& dataFlow = DataFlow{1});

}  // namespace tessera
