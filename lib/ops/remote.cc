// The remote family: transfers between a replica's tiles and its streaming
// memory. `remoteBuffer` names the buffer, `entry` the entry; every replica
// has its own copy of a buffer. RemoteLoad: buffer[entry] -> tensor;
// RemoteStore: tensor -> buffer[entry], no output. No gradients: transforms
// place them after autodiff.
#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

std::vector<OutputSpec> remoteShape(const OpChecker& c, OpAttributes& attributes) {
  const bool load = c.kind() == OpKind::RemoteLoad;
  c.arity(load ? 0 : 1);
  const Graph& graph = c.graph();
  if (attributes.remoteBuffer < 0 ||
      attributes.remoteBuffer >= static_cast<int64_t>(graph.remoteBuffers().size())) {
    c.fail(ErrorCode::InvalidRemoteBuffer,
           fmt::format("remote buffer #{} does not exist; the graph has {}", attributes.remoteBuffer,
                       graph.remoteBuffers().size()));
  }
  const RemoteBufferInfo& buffer = graph.remoteBuffer(attributes.remoteBuffer);
  if (attributes.entry < 0 || attributes.entry >= buffer.entries) {
    c.fail(ErrorCode::InvalidRemoteBuffer,
           fmt::format("entry {} of remote buffer #{} is out of range; "
                       "entries are 0..{}",
                       attributes.entry, attributes.remoteBuffer, buffer.entries - 1));
  }
  if (load) return {{buffer.shape, buffer.dtype, buffer.metaShape}};
  if (c.shape(0) != buffer.shape || c.in(0).dtype != buffer.dtype) {
    c.fail(ErrorCode::ShapeMismatch,
           fmt::format("{} does not fit remote buffer #{} of {} {}", c.desc(0), attributes.remoteBuffer,
                       shapeStr(buffer.shape), buffer.dtype));
  }
  return {};
}

}  // namespace

void addRemoteOps(OpTable& table) {
  table.add(
      {.kind = OpKind::RemoteLoad,
       .family = OpFamily::Remote,
       .work = OpWork::Streaming,
       .shape = remoteShape,
       .reference =
           [](ReferenceOp& r, int64_t replica) {
             r.out(replica) = r.remote(r.attributes().remoteBuffer, r.attributes().entry, replica);
           },
       .cost = [](const Graph& graph,
                  const OpNode& op) { return OpCost{.streamedBytes = bytesOf(graph, op.outputs[0])}; }});
  table.add({.kind = OpKind::RemoteStore,
             .family = OpFamily::Remote,
             .work = OpWork::Streaming,
             .shape = remoteShape,
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   r.remote(r.attributes().remoteBuffer, r.attributes().entry, replica) = r.in(0, replica);
                 },
             .cost = [](const Graph& graph,
                        const OpNode& op) { return OpCost{.streamedBytes = bytesOf(graph, op.inputs[0])}; }});
  table.keepsHalves({OpKind::RemoteLoad});
}

}  // namespace tessera
