#include "tessera/app/config_notes.hpp"

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

// A key as a JSON pointer segment: "~" as "~0", "/" as "~1".
std::string pointerSegment(std::string_view key) {
  std::string segment;
  for (const char c : key) {
    if (c == '~') {
      segment += "~0";
    } else if (c == '/') {
      segment += "~1";
    } else {
      segment += c;
    }
  }
  return segment;
}

// storageTileSet IO on overridden tensors that live in streaming memory: the
// setting places tensors that stay on chip, so it changes nothing for these.
// (A category's setting is not noted: its tensors below minElementsForOffChip
// stay on chip, where storageTileSet IO does place them.)
void addOffChipIoNotes(const SessionOptions& options, std::vector<ConfigNote>& notes) {
  constexpr std::string_view kWhy =
      "storageTileSet IO places a tensor that stays on chip on the IO tiles, but {} in streaming memory "
      "(storage OffChip), loaded through loadTileSet for each use, so it changes nothing there; set "
      "storageTileSet to Compute, or storage to OnChip to keep {} on the IO tiles";
  // One note for all the overrides, however many there are.
  std::vector<std::string> names;
  size_t count = 0;
  for (const auto& entry : options.tensorLocationSettingsOverride) {
    if (entry.second.storage != TensorStorage::OffChip || entry.second.storageTileSet != TileSet::IO) continue;
    if (names.size() < 5) names.push_back(entry.first);
    ++count;
  }
  if (count == 0) return;
  const std::string listed =
      fmt::format("{}{}", fmt::join(names, ", "), count > names.size()
                                                       ? fmt::format(" and {} more", count - names.size())
                                                       : std::string());
  notes.push_back(
      {NoteCode::StorageTileSetOffChip,
       "/sessionOptions/tensorLocationSettingsOverride/" + pointerSegment(boundedText(names.front())) +
           "/storageTileSet",
       fmt::format(fmt::runtime(kWhy),
                   fmt::format("{} {} live{}", count == 1 ? "the overridden tensor" : "the overridden tensors",
                               boundedText(listed, 2 * kMaxQuotedBytes), count == 1 ? "s" : ""),
                   count == 1 ? "it" : "them")});
}

}  // namespace

std::string noteId(NoteCode code) { return fmt::format("tessera.note.{}", static_cast<int>(code)); }

std::string ConfigNote::text() const { return fmt::format("[{}] {}: {}", noteId(code), path, message); }

namespace {

// The notes of /io: the defaults, then each stream by name.
void ioNotes(const RunConfig& config, std::vector<ConfigNote>& notes) {
  std::vector<std::pair<std::string, IoStreamConfig>> entries{
      {"/io", {config.io.tileSet, config.io.exchangeStrategy}}};
  for (const auto& [name, stream] : config.io.streams) entries.emplace_back("/io/streams/" + name, stream);
  const int64_t batches = config.data.batchesPerStep;
  const int64_t micro = config.sessionOptions.getAccumulationFactor();
  const TensorLocation& activations = config.sessionOptions.activationTensorLocationSettings.location;
  const bool locationLoads =
      activations.storage == TensorStorage::OffChip || activations.loadTileSet == TileSet::IO;
  std::vector<ConfigNote> overlap, iterations, tileSets;
  for (const auto& [path, stream] : entries) {
    const std::string_view strategy = toString(stream.exchangeStrategy);
    if (overlaps(stream.exchangeStrategy) && stream.tileSet == TileSet::Compute) {
      overlap.push_back(
          {NoteCode::OverlapOnComputeTiles, path + "/exchangeStrategy",
           fmt::format("{} on the compute tiles overlaps nothing: a host transfer there blocks compute, so "
                       "PopART compiles it and the throughput does not improve; it is modelled as JustInTime. "
                       "Set {}/tileSet to \"IO\" (with /sessionOptions/numIOTiles > 0) to overlap",
                       strategy, path)});
    } else if (stream.exchangeStrategy == ExchangeStrategy::OverlapLoops && batches == 1 && micro > 1) {
      iterations.push_back(
          {NoteCode::OverlapWithoutIterations, path + "/exchangeStrategy",
           "OverlapLoops with /data/batchesPerStep 1: there is no outer loop to overlap across, so it is "
           "OverlapInnerLoop (over the accumulationFactor micro-batches); raise batchesPerStep to overlap "
           "across batches"});
    } else if (overlaps(stream.exchangeStrategy) && batches == 1 && micro == 1) {
      iterations.push_back(
          {NoteCode::OverlapWithoutIterations, path + "/exchangeStrategy",
           fmt::format("{} with /data/batchesPerStep 1 and no gradient accumulation: a step is one "
                       "iteration, so there is no other iteration to overlap with and the transfers stay on "
                       "the critical path; raise /data/batchesPerStep",
                       strategy)});
    }
    if (locationLoads && stream.tileSet != activations.loadTileSet) {
      tileSets.push_back(
          {NoteCode::StreamTileSetDiffersFromLocation, path + "/tileSet",
           fmt::format("the host stream lands on the {} tiles while activationTensorLocationSettings loads "
                       "activations through the {} tiles: both apply, the stream's tile set to the transfer "
                       "from the host and the location to the tensors computed from it "
                       "(docs/overlapped-io.md, host streams and tensor locations)",
                       stream.tileSet == TileSet::IO ? "IO" : "compute",
                       activations.loadTileSet == TileSet::IO ? "IO" : "compute")});
    }
  }
  for (auto* list : {&overlap, &iterations, &tileSets}) notes.insert(notes.end(), list->begin(), list->end());
}

}  // namespace

std::vector<ConfigNote> configNotes(const RunConfig& config) {
  std::vector<ConfigNote> notes;
  const OptimizerConfig& optimizer = config.optimizer;
  const bool sgd = optimizer.type == OptimizerType::Sgd;
  const bool masterWeights = sgd ? optimizer.sgd.masterWeights : optimizer.adam.masterWeights;
  const double lossScaling = sgd ? optimizer.sgd.lossScaling : optimizer.adam.lossScaling;
  const bool automatic = config.sessionOptions.automaticLossScalingSettings.enabled;
  if (config.model.dtype == DType::Float16 && !masterWeights) {
    // The state kept in half beside the weights, by PopART's names.
    std::vector<std::string> halves;
    const auto add = [&halves](std::string_view name, DType dtype) {
      if (dtype == DType::Float16) halves.push_back(fmt::format("{} float16", name));
    };
    if (sgd) {
      add("accl1Type", optimizer.sgd.accl1Type);
      add("accumType", optimizer.sgd.accumType);
    } else {
      add("accl1Type", optimizer.adam.accl1Type);
      add("accl2Type", optimizer.adam.accl2Type);
      add("accumType", optimizer.adam.accumType);
    }
    const std::string state = halves.empty()
                                  ? std::string("; the rest of the optimizer state is float32")
                                  : fmt::format(
                                        ", and {} keep(s) the optimizer state in half too, so no copy of the "
                                        "model is float32",
                                        fmt::join(halves, ", "));
    notes.push_back(
        {NoteCode::Float16WeightsWithoutMasterWeights, "/optimizer/masterWeights",
         fmt::format("masterWeights is false on a float16 model: the {} update writes the float16 weights "
                     "directly, and an update below half a float16 ulp of a weight (2^-11 of its value) is "
                     "lost{}; set masterWeights to true to keep float32 master weights as optimizer state",
                     toString(optimizer.type), state)});
  }
  if (config.model.dtype == DType::Float32 && (lossScaling != 1.0 || automatic)) {
    const std::string what =
        automatic ? fmt::format("automatic loss scaling is enabled (initial scale {})", lossScaling)
                  : fmt::format("lossScaling is {}", lossScaling);
    notes.push_back(
        {NoteCode::LossScalingWithoutFloat16,
         automatic ? "/sessionOptions/automaticLossScalingSettings/enabled" : "/optimizer/lossScaling",
         fmt::format("{} on a float32 model: it runs as asked, but float32 gradients do not "
                     "underflow where float16 ones would, so the scale only costs a "
                     "multiplication and a division per gradient{}; set /model/dtype to "
                     "\"float16\", or {}",
                     what, automatic ? " and the overflow checks" : "",
                     automatic ? "automaticLossScalingSettings/enabled to false and lossScaling to 1"
                               : "lossScaling to 1")});
  }
  if (config.sessionOptions.virtualGraphMode == VirtualGraphMode::Auto && config.device.ipusPerReplica == 1) {
    // PopART warns the same: Auto with one IPU creates no virtual graphs.
    notes.push_back({NoteCode::AutoVirtualGraphsOnOneIpu, "/sessionOptions/virtualGraphMode",
                     "virtualGraphMode is Auto but /device/ipusPerReplica is 1, so every op runs on IPU 0 as with "
                     "virtualGraphMode Off; set ipusPerReplica to the IPUs a replica should span (tessera launch "
                     "--ipus-per-replica sets it too), or virtualGraphMode to Off"});
  }
  addOffChipIoNotes(config.sessionOptions, notes);
  ioNotes(config, notes);
  return notes;
}

}  // namespace tessera
