// The plan of a run config and the search for the settings that make it fit:
// planRun() plans a config's model, optimizer, options and device
// (tessera/sessions/placement.hpp's planTraining()); searchRunLevers() plans what-if
// changes of the config (recomputation, more IPUs per replica, pipelining,
// phased execution, RTS, streaming memory, float16) and combines them.
// `tessera explain` prints both, and `tessera train` and `evaluate` refuse a
// config that does not fit with the levers that would make it fit.
//
//   tessera::RunPlan plan = tessera::planRun(config);
//   for (const auto& t : plan.tensors) std::cout << t.name << " " << t.shardElements << "\n";
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "tessera/simdevice/device.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera {

// The plan of a run config: its model with the per-replica batch, its
// optimizer, its options and device.
RunPlan planRun(const RunConfig& config);

// Throws the out-of-memory error (DeviceError(OutOfMemory)) when `plan`, the
// plan of `config`, does not fit its device, naming the cheapest
// combinations of levers that make it fit, as searchRunLevers() finds them
// in at most `maxPlans` plans (what `tessera explain` lists under levers).
// What `tessera train` and `evaluate` check before reading any data.
void requireRunFits(const RunConfig& config, const RunPlan& plan, int64_t maxPlans = 24);

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
