#include "virtual_graph.hpp"

#include <algorithm>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include <fmt/format.h>

#include "graph_copy.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

std::size_t index(int64_t id) { return static_cast<std::size_t>(id); }

bool isSource(const OpNode& op) {
  return op.inputs.empty() && (op.kind == OpKind::Input || op.kind == OpKind::Variable || op.kind == OpKind::Constant);
}

std::string modePath() { return std::string(kSessionOptionsPath) + "/virtualGraphMode"; }

int64_t tensorBytes(const TensorNode& node) { return numElements(node.shape) * dtypeBytes(node.dtype); }

// Manual: every non-source op names an IPU below `ipus`.
void checkManual(const Graph& graph, int64_t ipus) {
  const OpNode* unnamed = nullptr;
  const OpNode* named = nullptr;
  int64_t unnamedCount = 0;
  int64_t ops = 0;
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    ++ops;
    if (op.virtualGraph == kNoVirtualGraph) {
      if (unnamed == nullptr) unnamed = &op;
      ++unnamedCount;
      continue;
    }
    if (named == nullptr) named = &op;
    if (op.virtualGraph >= ipus) {
      throw ConfigError(ErrorCode::VirtualGraphOutOfRange, op.name,
                        fmt::format("op {} ({}) is placed on IPU {} (its __ipu_number / virtualGraph), but a "
                                    "replica has {} IPU{} (/device/ipusPerReplica); use an IPU from 0 to {}, or "
                                    "raise ipusPerReplica",
                                    op.name, op.kind, op.virtualGraph, ipus, ipus == 1 ? "" : "s", ipus - 1));
    }
  }
  if (named == nullptr && ops > 0) {
    throw ConfigError(ErrorCode::ManualWithoutVirtualGraphs, modePath(),
                      fmt::format("virtualGraphMode is Manual, but none of the graph's {} ops names an IPU; "
                                  "place them with ops::virtualGraph (an ONNX node's __ipu_number "
                                  "attribute), or use virtualGraphMode Auto",
                                  ops));
  }
  if (unnamed != nullptr) {
    throw ConfigError(ErrorCode::PartialVirtualGraphs, unnamed->name,
                      fmt::format("virtualGraphMode is Manual and op {} names IPU {}, but {} of the graph's {} "
                                  "ops name none, {} ({}) first; either every op names its IPU or none does "
                                  "(then use virtualGraphMode Auto)",
                                  named->name, named->virtualGraph, unnamedCount, ops, unnamed->name,
                                  unnamed->kind));
  }
}

// ---------------------------------------------------------------------------
// Placing the ops the forward placement did not reach.

class Placer {
 public:
  explicit Placer(Graph& graph) : graph_(graph) {}

  void run() {
    // An in-place op waits for the storage it modifies to be placed; only
    // when nothing else moves (state that only in-place ops read) does it
    // follow its other inputs, and its storage then follows it.
    for (bool changed = true; changed;) {
      changed = false;
      for (const OpNode& op : graph_.ops()) changed = fromInputs(op, false) || changed;
      for (const OpNode& op : graph_.ops()) changed = fromConsumers(op) || changed;
      if (changed) continue;
      for (const OpNode& op : graph_.ops()) changed = fromInputs(op, true) || changed;
    }
    for (std::size_t i = 0; i < graph_.ops().size(); ++i)
      if (graph_.op(static_cast<OpId>(i)).virtualGraph == kNoVirtualGraph) graph_.setVirtualGraph(static_cast<OpId>(i), 0);
  }

 private:
  int64_t producerIpu(TensorId t) const {
    const OpId producer = graph_.tensor(t).producer;
    return producer == kNoOp ? kNoVirtualGraph : graph_.op(producer).virtualGraph;
  }

  bool place(const OpNode& op, int64_t ipu) {
    if (ipu == kNoVirtualGraph) return false;
    const auto id = static_cast<OpId>(&op - graph_.ops().data());
    graph_.setVirtualGraph(id, ipu);
    return true;
  }

  // An in-place op runs where the storage it modifies lives; any other op
  // where its first placed input was produced.
  bool fromInputs(const OpNode& op, bool inplaceFromOthers) {
    if (op.virtualGraph != kNoVirtualGraph || isSource(op) || op.inputs.empty()) return false;
    if (isInplace(op.kind)) {
      const int64_t storage = producerIpu(graph_.storageOf(op.inputs[0]));
      if (storage != kNoVirtualGraph) return place(op, storage);
      if (!inplaceFromOthers) return false;
    }
    for (TensorId t : op.inputs)
      if (const int64_t ipu = producerIpu(t); ipu != kNoVirtualGraph) return place(op, ipu);
    return false;
  }

  // A source, or an op none of whose inputs is placed, runs where its
  // first placed consumer runs.
  bool fromConsumers(const OpNode& op) {
    if (op.virtualGraph != kNoVirtualGraph) return false;
    for (TensorId out : op.outputs) {
      for (OpId consumer : graph_.tensor(out).consumers) {
        if (const int64_t ipu = graph_.op(consumer).virtualGraph; ipu != kNoVirtualGraph) return place(op, ipu);
      }
    }
    return false;
  }

  Graph& graph_;
};

// Rebuilds `graph` with an IpuCopy for each value read on another IPU than
// its producer's (a constant repeated instead).
class CopyInserter {
 public:
  explicit CopyInserter(const Graph& graph) : copy_(graph) {}

  Graph run() {
    const Graph& in = copy_.in();
    for (std::size_t i = 0; i < in.ops().size(); ++i) {
      const auto id = static_cast<OpId>(i);
      const OpNode& op = in.op(id);
      if (isSource(op)) {
        const TensorId t = copy_.copySource(id, in.tensor(op.outputs.front()));
        copy_.out().setVirtualGraph(copy_.out().tensor(t).producer, op.virtualGraph);
        continue;
      }
      std::vector<TensorId> inputs;
      inputs.reserve(op.inputs.size());
      for (TensorId t : op.inputs) inputs.push_back(onIpu(t, op.virtualGraph));
      const OpId copied = copy_.copyOp(id, std::move(inputs));
      copy_.out().setVirtualGraph(copied, op.virtualGraph);
    }
    copy_.copyOrder();
    return copy_.take();
  }

  TensorId mapped(TensorId t) const { return copy_.mapped(t); }

 private:
  // The copy of `t` that IPU `ipu` reads.
  TensorId onIpu(TensorId t, int64_t ipu) {
    const Graph& in = copy_.in();
    const OpId producer = in.tensor(t).producer;
    const int64_t from = producer == kNoOp ? 0 : in.op(producer).virtualGraph;
    if (from == ipu) return copy_.mapped(t);
    const auto key = std::pair{t, ipu};
    if (auto found = copies_.find(key); found != copies_.end()) return found->second;
    Graph& out = copy_.out();
    const TensorNode& node = in.tensor(t);
    const std::string name = copy_.freshName(fmt::format("{}.ipu{}", node.name, ipu));
    TensorId copied = kNoTensor;
    if (producer != kNoOp && in.op(producer).kind == OpKind::Constant) {
      TensorNode constant = node;
      constant.name = name;
      constant.producer = kNoOp;
      constant.consumers.clear();
      constant.aliasOf = kNoTensor;
      copied = out.addSource(OpKind::Constant, std::move(constant));
      out.setVirtualGraph(out.tensor(copied).producer, ipu);
    } else {
      const OpId op = out.addOp(OpKind::IpuCopy, {copy_.mapped(t)}, {}, fmt::format("IpuCopy.{}", name));
      out.setVirtualGraph(op, ipu);
      // A copy belongs to the micro-batch of the value it copies.
      if (producer != kNoOp) out.setMicroBatch(op, in.op(producer).microBatch);
      copied = out.op(op).outputs.front();
      out.rename(copied, name);
      out.tensor(copied).category = node.category;
    }
    copies_.emplace(key, copied);
    return copied;
  }

  detail::GraphCopy copy_;
  std::map<std::pair<TensorId, int64_t>, TensorId> copies_;
};

}  // namespace

std::vector<int64_t> autoVirtualGraphs(const Graph& graph, int64_t ipusPerReplica) {
  std::vector<int64_t> ipu(graph.ops().size(), kNoVirtualGraph);
  const std::vector<OpId> schedule = graph.schedule();
  std::vector<bool> seen(graph.tensors().size(), false);
  std::vector<std::pair<OpId, int64_t>> costs;
  int64_t total = 0;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (isSource(op)) continue;
    int64_t bytes = 0;
    for (TensorId t : op.inputs) {
      const TensorId storage = graph.storageOf(t);
      const OpId producer = graph.tensor(storage).producer;
      if (producer == kNoOp || graph.op(producer).kind != OpKind::Variable || seen[index(storage)]) continue;
      seen[index(storage)] = true;
      bytes += tensorBytes(graph.tensor(storage));
    }
    for (TensorId t : op.outputs)
      if (graph.storageOf(t) == t) bytes += tensorBytes(graph.tensor(t));
    costs.emplace_back(id, bytes);
    total += bytes;
  }
  // Each op goes to the part its memory's midpoint falls in: contiguous,
  // and about total / ipus bytes a part.
  int64_t before = 0;
  for (const auto& entry : costs) {
    const double middle = static_cast<double>(before) + static_cast<double>(entry.second) / 2.0;
    const auto part =
        total > 0 ? static_cast<int64_t>(middle * static_cast<double>(ipusPerReplica) / static_cast<double>(total))
                  : 0;
    ipu[index(entry.first)] = std::clamp<int64_t>(part, 0, ipusPerReplica - 1);
    before += entry.second;
  }
  return ipu;
}

void VirtualGraphTransform::apply(Graph& graph) {
  switch (mode_) {
    case VirtualGraphMode::Off:
      for (const OpNode& op : graph.ops()) {
        if (op.virtualGraph == kNoVirtualGraph) continue;
        throw ConfigError(ErrorCode::VirtualGraphWithModeOff, modePath(),
                          fmt::format("virtualGraphMode is Off, but op {} ({}) names IPU {} (its __ipu_number / "
                                      "virtualGraph); set virtualGraphMode to Manual, or remove the annotation",
                                      op.name, op.kind, op.virtualGraph));
      }
      return;
    case VirtualGraphMode::Manual: checkManual(graph, ipus_); return;
    case VirtualGraphMode::Auto: {
      const std::vector<int64_t> ipus = autoVirtualGraphs(graph, ipus_);
      for (std::size_t i = 0; i < ipus.size(); ++i)
        if (ipus[i] != kNoVirtualGraph) graph.setVirtualGraph(static_cast<OpId>(i), ipus[i]);
      return;
    }
    case VirtualGraphMode::ExecutionPhases: return;  // placed by phase (execution_phases.hpp)
  }
}

void IpuCopyTransform::apply(Graph& graph) {
  if (mode_ == VirtualGraphMode::Off) return;
  Placer(graph).run();
  CopyInserter inserter(graph);
  Graph rebuilt = inserter.run();
  if (tensors_ != nullptr) {
    TrainingTensors& t = *tensors_;
    t.loss = inserter.mapped(t.loss);
    for (TensorId& w : t.weights) w = inserter.mapped(w);
    for (TensorId& g : t.gradients) g = inserter.mapped(g);
    if (t.lossScale != kNoTensor) t.lossScale = inserter.mapped(t.lossScale);
  }
  graph = std::move(rebuilt);
}

}  // namespace tessera
