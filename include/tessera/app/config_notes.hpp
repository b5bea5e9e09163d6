// Warning-level notes on a valid run config: combinations that run as
// written but are probably not what was meant. validate() accepts them;
// `tessera validate` and `tessera explain` print them. Each has a stable id
// "tessera.note.NNN" (8xx, beside the error ids of tessera/lib/error.hpp, which
// never use 8xx), documented in docs/errors.md; nothing throws them.
#pragma once

#include <string>
#include <vector>

#include "tessera/app/run_config.hpp"

namespace tessera {

enum class NoteCode : int {
  // A float16 model whose optimizer has masterWeights false: its float16
  // weights are updated in half, so updates below half an ulp are lost (and
  // with float16 accl1Type/accl2Type or accumType no copy of the model is
  // float32).
  Float16WeightsWithoutMasterWeights = 801,
  // A float32 model with a lossScaling other than 1 or automatic loss
  // scaling enabled: it runs as asked, as PopART allows, but a float32
  // gradient does not underflow where a half would.
  LossScalingWithoutFloat16 = 802,
  // virtualGraphMode Auto with /device/ipusPerReplica 1: every op runs on
  // IPU 0, as PopART warns (no virtual graphs are created).
  AutoVirtualGraphsOnOneIpu = 803,
  // A host stream with an overlap strategy on the compute tiles: PopART
  // compiles it and nothing overlaps (a transfer there blocks compute), so
  // it is modelled as JustInTime; put the stream on the IO tiles.
  OverlapOnComputeTiles = 806,
  // Overlap with nothing to overlap: OverlapLoops with batchesPerStep 1 (it
  // is OverlapInnerLoop then), or an overlap strategy whose loops have a
  // single iteration (batchesPerStep and accumulationFactor 1).
  OverlapWithoutIterations = 807,
  // A host stream whose tile set differs from the loadTileSet of the
  // tensor location of its category: the stream's tile set decides where
  // the host transfer lands, the location where the tensor lives after
  // (docs/overlapped-io.md, "Host streams and tensor locations").
  StreamTileSetDiffersFromLocation = 808,
  // storageTileSet IO on a tensor that lives off chip: the setting only
  // places on-chip tensors, so it changes nothing there.
  StorageTileSetOffChip = 809,
};

// "tessera.note.801"
std::string noteId(NoteCode code);

struct ConfigNote {
  NoteCode code = NoteCode::Float16WeightsWithoutMasterWeights;
  std::string path;     // the JSON pointer of the setting concerned
  std::string message;  // what was found, why it matters, what to change
  // "[tessera.note.NNN] PATH: MESSAGE"
  std::string text() const;
  bool operator==(const ConfigNote&) const = default;
};

// The notes of `config`, in the order of NoteCode. The config is not
// validated here (validate() does that).
std::vector<ConfigNote> configNotes(const RunConfig& config);

}  // namespace tessera
