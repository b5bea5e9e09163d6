// Where a training run's tensors live and what its program costs, worked out
// without running it: the transforms a TrainingSession applies, then the
// device's memory planner and time model. `tessera explain` prints it, and a
// session whose program does not fit uses it to suggest settings that would.
//
//   tessera::RunPlan plan = tessera::planRun(config);
//   for (const auto& t : plan.tensors) std::cout << t.name << " " << t.shardElements << "\n";
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/data_flow.hpp"
#include "tessera/device.hpp"
#include "tessera/graph.hpp"
#include "tessera/location_resolver.hpp"
#include "tessera/optimizer.hpp"
#include "tessera/run_config.hpp"
#include "tessera/session_options.hpp"
#include "tessera/time_model.hpp"

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

// The plan of a run config: its model with the per-replica batch, its
// optimizer, its options and device.
RunPlan planRun(const RunConfig& config);

// Throws the out-of-memory error (DeviceError(OutOfMemory)) when `plan`, the
// plan of `config`, does not fit its device, naming the cheapest
// combinations of levers that make it fit, as searchRunLevers() finds them
// in at most `maxPlans` plans (what `tessera explain` lists under levers).
// What `tessera train` and `evaluate` check before reading any data.
void requireRunFits(const RunConfig& config, const RunPlan& plan, int64_t maxPlans = 24);

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

// suggestMemorySettings() for the model, optimizer, options and device of a
// run config (what `tessera explain` shows as levers).
std::vector<MemorySuggestion> suggestRunSettings(const RunConfig& config, const MemoryShortfall& shortfall);

// A setting of a run config: the JSON pointer and the JSON value to set
// there (what `--set PATH=VALUE` takes).
struct ConfigChange {
  std::string path;   // e.g. "/sessionOptions/autoRecomputation"
  std::string value;  // as JSON, e.g. "\"Standard\""
};

// The change as `--set PATH=VALUE` the way a shell takes it (as `tessera
// explain` prints it): a JSON string bare, other values quoted when they hold
// spaces, quotes, braces or brackets.
std::string setArgument(const ConfigChange& change);

// One lever of the search: the settings that belong together (more IPUs per
// replica are fewer replicas, Auto placement and sharding domains that still
// divide them) and why it costs what it costs.
struct Lever {
  std::string name;  // "4 IPUs per replica", "autoRecomputation Standard"
  std::vector<ConfigChange> changes;
  std::string cost;  // one line: what the step pays for the memory saved
};

// A combination of levers applied together to a config, planned.
struct LeverPlan {
  std::vector<Lever> levers;  // in the order applied
  int64_t peakBytes = 0;      // the highest peak of the space short before, of any IPU
  bool fits = false;          // the whole program then fits the device
  double stepSeconds = 0.0;   // the modelled step time (TimeReport::stepSeconds)
  int64_t replicas = 0;       // global replicas
  int64_t ipusPerReplica = 0;
  int64_t globalBatch = 0;    // samples a step: batchSize x replicas x accumulationFactor
};

// The plan's levers as explain names them: "autoRecomputation Standard + 4 IPUs per replica".
std::string leverNames(const LeverPlan& plan);

struct LeverSearch {
  MemorySpace space = MemorySpace::ComputeTiles;  // the space short as given
  int64_t peakBytes = 0;                          // its highest peak of any IPU as given
  int64_t availableBytes = 0;
  double stepSeconds = 0.0;
  int64_t globalBatch = 0;
  std::vector<LeverPlan> single;   // each lever alone, lowest peak first
  std::vector<LeverPlan> fitting;  // combinations that fit, the fastest step first
  int64_t plans = 0;               // plans made
};

// The settings that make a run config that does not fit fit: each lever
// planned alone (recomputation, more IPUs per replica at the same IPU count,
// pipelining over up to 4 IPUs, phased execution on a replica of 1 or 2
// IPUs (with the weights and activations OffChip), RTS of the model state, streaming memory
// per category, streamed state through the compute tiles, float16), then greedily combined, each round adding the lever whose plan
// is best (step time weighted by how far over capacity it still is), until
// combinations fit; at most `maxPlans` plans. Every figure is a plan of the
// changed config (validated as a file with those settings would be).
LeverSearch searchRunLevers(const RunConfig& config, const RunPlan& plan, int64_t maxPlans = 24);

// The highest peak of `space` over every replica and IPU.
int64_t highestPeak(const MemoryReport& report, MemorySpace space);

}  // namespace tessera
