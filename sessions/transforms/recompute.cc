#include "recompute.hpp"

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "graph_copy.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

std::size_t index(int32_t id) { return static_cast<std::size_t>(id); }

int64_t outputBytes(const Graph& graph, const OpNode& op) {
  int64_t bytes = 0;
  for (TensorId t : op.outputs) {
    const TensorNode& node = graph.tensor(t);
    bytes += numElements(node.shape) * dtypeBytes(node.dtype);
  }
  return bytes;
}

// The forward ops on a path to the loss (PopART's PathToLoss::Yes).
std::vector<bool> toLoss(const Graph& graph, TensorId loss, OpId firstBackwardOp) {
  std::vector<bool> on(graph.ops().size(), false);
  std::vector<OpId> stack;
  const OpId lossOp = graph.tensor(loss).producer;
  if (lossOp == kNoOp || lossOp >= firstBackwardOp) return on;
  stack.push_back(lossOp);
  on[index(lossOp)] = true;
  while (!stack.empty()) {
    const OpId id = stack.back();
    stack.pop_back();
    for (TensorId t : graph.op(id).inputs) {
      const OpId producer = graph.tensor(t).producer;
      if (producer == kNoOp || on[index(producer)]) continue;
      on[index(producer)] = true;
      stack.push_back(producer);
    }
  }
  return on;
}

// Standard: checkpoints where the fewest forward activation bytes are live.
void annotateStandard(const Graph& graph, const std::vector<bool>& forward, std::vector<RecomputeType>& types) {
  std::vector<OpId> order;
  for (OpId id : graph.schedule()) {
    const OpNode& op = graph.op(id);
    if (forward[index(id)] && !op.outputs.empty() && graph.canRecompute(id)) order.push_back(id);
  }
  const std::size_t n = order.size();
  if (n == 0) return;
  std::vector<int64_t> position(graph.ops().size(), -1);
  for (std::size_t i = 0; i < n; ++i) position[index(order[i])] = static_cast<int64_t>(i);
  // Op i's outputs are live just after position p for p in [i, last - 1],
  // last being the position of its last forward consumer (and at i itself).
  std::vector<int64_t> lastLive(n);
  std::vector<int64_t> delta(n + 1, 0);
  std::vector<int64_t> bytes(n);
  for (std::size_t i = 0; i < n; ++i) {
    int64_t last = static_cast<int64_t>(i);
    for (TensorId t : graph.op(order[i]).outputs) {
      for (OpId consumer : graph.tensor(t).consumers) last = std::max(last, position[index(consumer)]);
    }
    lastLive[i] = std::max(static_cast<int64_t>(i), last - 1);
    bytes[i] = outputBytes(graph, graph.op(order[i]));
    delta[i] += bytes[i];
    delta[index(static_cast<int32_t>(lastLive[i] + 1))] -= bytes[i];
  }
  std::vector<int64_t> live(n);
  int64_t running = 0;
  for (std::size_t i = 0; i < n; ++i) live[i] = running += delta[i];

  std::vector<bool> checkpoint(n, false);
  const auto intervals = static_cast<std::size_t>(std::ceil(std::sqrt(static_cast<double>(n))));
  for (std::size_t k = 0; k < intervals; ++k) {
    const std::size_t begin = k * n / intervals;
    const std::size_t end = (k + 1) * n / intervals;
    if (begin >= end) continue;
    std::size_t best = begin;
    for (std::size_t i = begin; i < end; ++i)
      if (live[i] < live[best]) best = i;
    for (std::size_t j = 0; j <= best; ++j) {
      if (lastLive[j] >= static_cast<int64_t>(best)) checkpoint[j] = true;
    }
  }
  for (std::size_t i = 0; i < n; ++i) {
    RecomputeType& type = types[index(order[i])];
    if (type == RecomputeType::Undefined) type = checkpoint[i] ? RecomputeType::Checkpoint : RecomputeType::Recompute;
  }
}

// RecomputeAll: every forward op, then the segment ending at the loss back
// to checkpoints (PopART's rule: recomputing it would only repeat it).
void annotateAll(const Graph& graph, const std::vector<bool>& forward, TensorId loss,
                 std::vector<RecomputeType>& types) {
  for (std::size_t id = 0; id < types.size(); ++id) {
    if (forward[id] && types[id] == RecomputeType::Undefined && graph.canRecompute(static_cast<OpId>(id)))
      types[id] = RecomputeType::Recompute;
  }
  std::vector<OpId> stack{graph.tensor(loss).producer};
  while (!stack.empty()) {
    const OpId id = stack.back();
    stack.pop_back();
    for (TensorId t : graph.op(id).inputs) {
      const OpId producer = graph.tensor(t).producer;
      if (producer == kNoOp || types[index(producer)] != RecomputeType::Recompute) continue;
      types[index(producer)] = RecomputeType::Checkpoint;
      stack.push_back(producer);
    }
  }
}

// The last forward pipeline stage of the forward ops, or kNoPipelineStage
// when they have none (pipelining off).
int64_t lastForwardStage(const Graph& graph, const std::vector<bool>& forward) {
  int64_t last = kNoPipelineStage;
  for (std::size_t id = 0; id < forward.size(); ++id)
    if (forward[id]) last = std::max(last, graph.ops()[id].pipelineStage);
  return last;
}

// Pipeline: every forward op of a stage but the last is recomputed in that
// stage's backward pass, except the ops whose outputs a forward op of another
// stage reads: those outputs are the stage inputs the pipeline stashes. The
// last stage runs its backward pass in the same cycle and keeps everything.
void annotatePipeline(const Graph& graph, const std::vector<bool>& forward, int64_t lastStage,
                      std::vector<RecomputeType>& types) {
  for (std::size_t id = 0; id < types.size(); ++id) {
    if (!forward[id] || types[id] != RecomputeType::Undefined) continue;
    const OpNode& op = graph.ops()[id];
    bool boundary = op.pipelineStage == lastStage || !graph.canRecompute(static_cast<OpId>(id));
    for (std::size_t k = 0; k < op.outputs.size() && !boundary; ++k) {
      for (OpId consumer : graph.tensor(op.outputs[k]).consumers) {
        if (forward[index(consumer)] && graph.op(consumer).pipelineStage != op.pipelineStage) boundary = true;
      }
    }
    types[id] = boundary ? RecomputeType::Checkpoint : RecomputeType::Recompute;
  }
}

void refusePipelineWithoutStages() {
  throw ConfigError(ErrorCode::RecomputationNeedsPipelining, std::string(kSessionOptionsPath) + "/autoRecomputation",
                    "autoRecomputation is Pipeline, which recomputes each forward pipeline stage, but "
                    "pipelining is not enabled; use Standard, NormOnly, RecomputeAll or None");
}

}  // namespace

std::vector<bool> recomputedOps(const Graph& graph, TensorId loss, OpId firstBackwardOp, RecomputationType type) {
  const std::size_t n = graph.ops().size();
  std::vector<bool> recomputed(n, false);
  if (loss == kNoTensor || firstBackwardOp == kNoOp) {
    if (type == RecomputationType::Pipeline) refusePipelineWithoutStages();
    return recomputed;
  }
  const std::vector<bool> forward = toLoss(graph, loss, firstBackwardOp);
  const int64_t lastStage = lastForwardStage(graph, forward);
  if (type == RecomputationType::Pipeline && lastStage == kNoPipelineStage) refusePipelineWithoutStages();
  std::vector<RecomputeType> types(n);
  for (std::size_t id = 0; id < n; ++id) types[id] = graph.ops()[id].recompute;
  switch (type) {
    case RecomputationType::None: break;
    case RecomputationType::Pipeline: annotatePipeline(graph, forward, lastStage, types); break;
    case RecomputationType::Standard: annotateStandard(graph, forward, types); break;
    case RecomputationType::NormOnly:
      for (std::size_t id = 0; id < n; ++id) {
        if (!forward[id] || types[id] != RecomputeType::Undefined) continue;
        types[id] = graph.ops()[id].normalisation && graph.canRecompute(static_cast<OpId>(id))
                        ? RecomputeType::Recompute
                        : RecomputeType::Checkpoint;
      }
      break;
    case RecomputationType::RecomputeAll: annotateAll(graph, forward, loss, types); break;
  }
  // Storage an in-place op modifies: a clone reading it later would read
  // another value.
  std::vector<bool> modified(graph.tensors().size(), false);
  for (const OpNode& op : graph.ops()) {
    if (isInplace(op.kind) && !op.inputs.empty()) modified[index(graph.storageOf(op.inputs.front()))] = true;
  }
  for (std::size_t id = 0; id < n; ++id) {
    if (!forward[id] || types[id] != RecomputeType::Recompute || !graph.canRecompute(static_cast<OpId>(id)))
      continue;
    const OpNode& op = graph.ops()[id];
    recomputed[id] = std::none_of(op.inputs.begin(), op.inputs.end(),
                                  [&](TensorId t) { return modified[index(graph.storageOf(t))]; });
  }
  return recomputed;
}

void RecomputeTransform::apply(Graph& graph) {
  const std::vector<bool> recomputed =
      recomputedOps(graph, tensors_.loss, tensors_.firstBackwardOp, type_);
  const OpId firstBackward = tensors_.firstBackwardOp;
  // Nothing to do unless a backward op reads a recomputed op's output.
  bool needed = false;
  for (std::size_t id = index(std::max<OpId>(firstBackward, 0)); id < graph.ops().size() && !needed; ++id) {
    for (TensorId t : graph.ops()[id].inputs) {
      const OpId producer = graph.tensor(t).producer;
      if (producer != kNoOp && producer < firstBackward && recomputed[index(producer)]) needed = true;
    }
  }
  if (!needed) return;

  detail::GraphCopy copy(graph);
  std::vector<TensorId> clones(graph.tensors().size(), kNoTensor);
  // The clone of `t` (the output of a recomputed op), made with the clones
  // it needs, in creation order (a data order of the forward pass).
  std::vector<int64_t> visited(graph.ops().size(), -1);  // the call that last visited an op
  int64_t call = 0;
  // With pipelining or phases the clones run in the pipeline stage and
  // execution phase of the backward op that first reads them, on its IPU
  // (for an op read by its own backward op: the backward stage or phase of
  // the op they repeat, on the op's IPU), so that the pipeline stashes what
  // the clones read, not what they make, and a phase holds what it computes.
  auto cloneOf = [&](TensorId t, const OpNode& reader) {
    if (clones[index(t)] != kNoTensor) return clones[index(t)];
    ++call;
    std::vector<OpId> segment;
    std::vector<OpId> stack{graph.tensor(t).producer};
    while (!stack.empty()) {
      const OpId id = stack.back();
      stack.pop_back();
      if (visited[index(id)] == call) continue;
      visited[index(id)] = call;
      segment.push_back(id);
      for (TensorId in : graph.op(id).inputs) {
        const OpId producer = graph.tensor(in).producer;
        if (producer != kNoOp && recomputed[index(producer)] && clones[index(in)] == kNoTensor)
          stack.push_back(producer);
      }
    }
    std::sort(segment.begin(), segment.end());
    Graph& out = copy.out();
    for (OpId id : segment) {
      const OpNode& op = graph.op(id);
      std::vector<TensorId> inputs;
      inputs.reserve(op.inputs.size());
      for (TensorId in : op.inputs) {
        const OpId producer = graph.tensor(in).producer;
        inputs.push_back(producer != kNoOp && recomputed[index(producer)] ? clones[index(in)] : copy.mapped(in));
      }
      const OpId clone = out.addOp(op.kind, std::move(inputs), op.attributes, op.name + ".recomputed");
      const std::vector<TensorId> outputs = out.op(clone).outputs;
      for (std::size_t k = 0; k < outputs.size(); ++k) {
        const TensorNode& original = graph.tensor(op.outputs[k]);
        out.rename(outputs[k], copy.freshName(original.name + ".recomputed"));
        out.tensor(outputs[k]).category = original.category;
        out.tensor(outputs[k]).tileSet = original.tileSet;
        clones[index(op.outputs[k])] = outputs[k];
      }
      OpNode marks;
      marks.recompute = RecomputeType::Recomputed;
      marks.normalisation = op.normalisation;
      marks.virtualGraph = op.virtualGraph;
      if (op.pipelineStage != kNoPipelineStage || op.executionPhase != kNoExecutionPhase) {
        marks.pipelineStage = reader.pipelineStage;
        marks.executionPhase = reader.executionPhase;
        marks.virtualGraph = reader.virtualGraph;
      }
      out.copyRecomputeMarks(clone, marks);
    }
    return clones[index(t)];
  };

  for (std::size_t i = 0; i < graph.ops().size(); ++i) {
    const auto id = static_cast<OpId>(i);
    const OpNode& op = graph.op(id);
    if (op.inputs.empty() && (op.kind == OpKind::Input || op.kind == OpKind::Variable || op.kind == OpKind::Constant)) {
      copy.copySource(id, graph.tensor(op.outputs.front()));
      continue;
    }
    std::vector<TensorId> inputs;
    inputs.reserve(op.inputs.size());
    for (TensorId t : op.inputs) {
      const OpId producer = graph.tensor(t).producer;
      const bool fromClone = id >= firstBackward && producer != kNoOp && recomputed[index(producer)];
      inputs.push_back(fromClone ? cloneOf(t, op) : copy.mapped(t));
    }
    copy.copyOp(id, std::move(inputs));
  }
  copy.copyOrder();
  TrainingTensors updated = tensors_;
  updated.loss = copy.mapped(tensors_.loss);
  for (TensorId& w : updated.weights) w = copy.mapped(w);
  for (TensorId& g : updated.gradients) g = copy.mapped(g);
  if (tensors_.lossScale != kNoTensor) updated.lossScale = copy.mapped(tensors_.lossScale);
  graph = copy.take();
  tensors_ = std::move(updated);
}

}  // namespace tessera
