// Virtual graphs: the ops of a replica placed on its IPUs
// (SessionOptions::virtualGraphMode, DeviceSpec::ipusPerReplica), as facts
// on the graph (OpNode::virtualGraph) that the device reads.
//
// Two transforms, as PopART places ops before autodiff and copies between
// IPUs after it:
//  - VirtualGraphTransform runs first, on the forward graph. Off: no op may
//    name an IPU. Manual: the ops' own IPUs (ops::virtualGraph, an ONNX
//    node's __ipu_number) are checked: every op names one (none naming one
//    and some not naming one are both refused, as PopART refuses them),
//    each below ipusPerReplica. Auto:
//    the forward schedule is cut into ipusPerReplica contiguous parts of
//    about equal memory, an op's memory being the bytes of its outputs plus
//    the bytes of the variables it is the first to read. Autodiff then
//    places each forward op's backward ops on its IPU, and the recomputation
//    transform its clones.
//  - IpuCopyTransform runs last. Every op still without an IPU (gradient
//    sums, accumulation, replication, optimizer and streaming ops, sources)
//    takes one: an in-place op the IPU of the storage it modifies, any other
//    op the IPU of its first input placed on one, a source or an op without
//    placed inputs the IPU of its first placed consumer (so a weight lives
//    where it is first read and its update runs there). Then a value read on
//    another IPU than its producer's goes through one IpuCopy op per
//    (value, IPU), named "<value>.ipu<N>"; a constant is repeated on each
//    IPU that reads it instead of being copied. IpuCopy is the identity, so
//    the numbers are those of one IPU.
// Both change nothing when virtualGraphMode is Off.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/lib/session_options.hpp"
#include "tessera/sessions/transform.hpp"

namespace tessera {

class VirtualGraphTransform final : public Transform {
 public:
  VirtualGraphTransform(VirtualGraphMode mode, int64_t ipusPerReplica) : mode_(mode), ipus_(ipusPerReplica) {}

  std::string_view name() const noexcept override { return "virtualGraph"; }
  // Throws ConfigError: VirtualGraphWithModeOff (an op names an IPU with
  // mode Off), ManualWithoutVirtualGraphs (Manual: no op names one),
  // PartialVirtualGraphs (Manual: some ops name one, some not),
  // VirtualGraphOutOfRange (an IPU at or above ipusPerReplica).
  // ExecutionPhases: nothing here; ExecutionPhasesTransform places the ops.
  void apply(Graph& graph) override;

 private:
  VirtualGraphMode mode_;
  int64_t ipus_;
};

class IpuCopyTransform final : public Transform {
 public:
  // `tensors` (null for inference) is kept up to date when the graph is
  // rebuilt with copies.
  IpuCopyTransform(VirtualGraphMode mode, TrainingTensors* tensors) : mode_(mode), tensors_(tensors) {}

  std::string_view name() const noexcept override { return "ipuCopy"; }
  void apply(Graph& graph) override;

 private:
  VirtualGraphMode mode_;
  TrainingTensors* tensors_;
};

// The IPU of each op that Auto gives `graph`'s non-source ops (kNoVirtualGraph
// for sources): the contiguous split described above. Exposed for tests and
// explain.
std::vector<int64_t> autoVirtualGraphs(const Graph& graph, int64_t ipusPerReplica);

}  // namespace tessera
