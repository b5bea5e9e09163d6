#include "graph_copy.hpp"

#include <fmt/format.h>

namespace tessera::detail {

GraphCopy::GraphCopy(const Graph& in)
    : in_(in), out_(in.replicationFactor()), tensorMap_(in.tensors().size(), kNoTensor),
      opMap_(in.ops().size(), kNoOp) {
  for (const RemoteBufferInfo& buffer : in.remoteBuffers()) out_.addRemoteBuffer(buffer);
}

TensorId GraphCopy::copySource(OpId id, TensorNode node) {
  const OpNode& op = in_.op(id);
  node.producer = kNoOp;
  node.consumers.clear();
  node.aliasOf = kNoTensor;
  const TensorId t = out_.addSource(op.kind, std::move(node));
  setMapped(op.outputs.front(), t);
  setOpCopy(id, out_.tensor(t).producer);
  return t;
}

OpId GraphCopy::copyOp(OpId id, std::vector<TensorId> inputs) {
  const OpNode& op = in_.op(id);
  const OpId copy = out_.addOp(op.kind, std::move(inputs), op.attributes, op.name);
  out_.copyRecomputeMarks(copy, op);
  const std::vector<TensorId> outputs = out_.op(copy).outputs;
  for (std::size_t k = 0; k < outputs.size(); ++k) {
    const TensorNode& original = in_.tensor(op.outputs[k]);
    if (out_.tensor(outputs[k]).name != original.name) {
      out_.rename(outputs[k], out_.tryFind(original.name) ? freshName(original.name) : original.name);
    }
    out_.tensor(outputs[k]).category = original.category;
    out_.tensor(outputs[k]).tileSet = original.tileSet;
    setMapped(op.outputs[k], outputs[k]);
  }
  setOpCopy(id, copy);
  return copy;
}

std::string GraphCopy::freshName(std::string_view base) {
  std::string name(base);
  for (int64_t i = 1; in_.tryFind(name) || out_.tryFind(name); ++i) name = fmt::format("{}.{}", base, i);
  return name;
}

void GraphCopy::copyOrder() {
  for (std::size_t id = 0; id < in_.ops().size(); ++id) {
    const OpId copy = opMap_[id];
    if (copy == kNoOp) continue;
    for (OpId before : in_.ops()[id].after) {
      const OpId target = opMap_.at(static_cast<std::size_t>(before));
      if (target != kNoOp && target != copy) out_.addAfter(copy, target);
    }
  }
}

}  // namespace tessera::detail
