// The reverse-mode traversal; the per-op rules are in gradients.cc.
#include "tessera/lib/autodiff.hpp"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include <fmt/format.h>

#include "op_def.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

class Backward {
 public:
  explicit Backward(Graph& graph) : graph_(graph) {}

  void contribute(TensorId t, TensorId gradient) { contributions_[t].push_back(gradient); }

  // The sum of t's gradient contributions, named "<t>.grad"; kNoTensor when
  // there are none. Computed once per tensor.
  TensorId finalize(TensorId t, bool mustOwnName) {
    if (auto done = finalized_.find(t); done != finalized_.end()) return done->second;
    TensorId sum = kNoTensor;
    if (auto it = contributions_.find(t); it != contributions_.end()) {
      for (TensorId part : it->second) {
        sum = sum == kNoTensor ? part : ops::add(Tensor{&graph_, sum}, Tensor{&graph_, part}).id();
      }
      contributions_.erase(it);
    }
    if (sum != kNoTensor) {
      // A gradient passed through unchanged (e.g. by Add) already carries the
      // name of another tensor's gradient; a requested gradient gets its own.
      if (named_.contains(sum)) {
        if (mustOwnName) sum = ops::copy(Tensor{&graph_, sum}).id();
      }
      if (!named_.contains(sum)) {
        graph_.rename(sum, graph_.uniqueName(graph_.tensor(t).name + ".grad"));
        named_.insert(sum);
      }
    }
    finalized_.emplace(t, sum);
    return sum;
  }

  void markNamed(TensorId t) { named_.insert(t); }

 private:
  Graph& graph_;
  std::unordered_map<TensorId, std::vector<TensorId>> contributions_;
  std::unordered_map<TensorId, TensorId> finalized_;
  std::unordered_set<TensorId> named_;
};

void checkOperand(const Graph& graph, const Tensor& t, std::string_view what) {
  if (!t.valid() || &t.graph() != &graph) {
    throw GraphError(ErrorCode::InvalidOperand, "autodiff",
                     fmt::format("the {} is an empty handle or belongs to another graph", what));
  }
}

}  // namespace

std::vector<Tensor> autodiff(Graph& graph, Tensor loss, const std::vector<Tensor>& wrt, Tensor seed) {
  checkOperand(graph, loss, "loss");
  if (!isFloating(loss.dtype()) || !loss.shape().empty()) {
    throw AutodiffError(
        ErrorCode::LossNotScalar, loss.name(),
        fmt::format("the loss is {} {}; it must be a float32 or float16 scalar (shape []); reduce it with "
                    "reduceSum or reduceMean",
                    shapeStr(loss.shape()), loss.dtype()));
  }
  for (const Tensor& w : wrt) {
    checkOperand(graph, w, "tensor to differentiate");
    if (!isFloating(w.dtype())) {
      throw AutodiffError(
          ErrorCode::NoGradient, w.name(),
          fmt::format("tensor \"{}\" is {}; only float32 and float16 tensors have gradients", w.name(),
                      w.dtype()));
    }
  }

  // Ops are created after their inputs, so op id order is a topological
  // order of the data flow; the ops added below come after all of them.
  const auto forwardOps = static_cast<OpId>(graph.ops().size());
  const std::size_t forwardTensors = graph.tensors().size();
  std::vector<char> influencesLoss(forwardTensors, 0);
  std::vector<char> dependsOnWrt(forwardTensors, 0);
  influencesLoss[static_cast<std::size_t>(loss.id())] = 1;
  for (OpId o = forwardOps - 1; o >= 0; --o) {
    const OpNode& op = graph.op(o);
    bool live = false;
    for (TensorId t : op.outputs) live = live || influencesLoss[static_cast<std::size_t>(t)];
    if (live)
      for (TensorId t : op.inputs) influencesLoss[static_cast<std::size_t>(t)] = 1;
  }
  for (const Tensor& w : wrt) dependsOnWrt[static_cast<std::size_t>(w.id())] = 1;
  for (OpId o = 0; o < forwardOps; ++o) {
    const OpNode& op = graph.op(o);
    bool depends = false;
    for (TensorId t : op.inputs) depends = depends || dependsOnWrt[static_cast<std::size_t>(t)];
    if (depends)
      for (TensorId t : op.outputs) dependsOnWrt[static_cast<std::size_t>(t)] = 1;
  }
  auto needsGradient = [&](TensorId t) {
    const auto i = static_cast<std::size_t>(t);
    return influencesLoss[i] && dependsOnWrt[i] && isFloating(graph.tensor(t).dtype);
  };

  if (seed.valid()) {
    checkOperand(graph, seed, "seed");
    if (!isFloating(seed.dtype()) || !seed.shape().empty()) {
      throw GraphError(ErrorCode::InvalidOperand, seed.name(),
                       fmt::format("the seed of the loss gradient is {} {}; it must be a float32 or float16 "
                                   "scalar (shape []), cast to the loss's dtype",
                                   shapeStr(seed.shape()), seed.dtype()));
    }
  }
  Backward backward(graph);
  // The seed d loss / d loss (1, or a given scale) has the loss's dtype; each
  // gradient has its tensor's dtype.
  if (!seed.valid()) {
    seed = ops::constant(graph, graph.uniqueName(loss.name() + ".grad"), {1.0f}, {}, loss.dtype());
  } else if (seed.dtype() != loss.dtype()) {
    seed = ops::cast(seed, loss.dtype());
  }
  backward.markNamed(seed.id());
  backward.contribute(loss.id(), seed.id());
  for (OpId o = forwardOps - 1; o >= 0; --o) {
    const OpNode& op = graph.op(o);
    bool anyInput = false;
    for (TensorId t : op.inputs) anyInput = anyInput || needsGradient(t);
    if (!anyInput || op.outputs.empty() || !needsGradient(op.outputs[0])) continue;
    if (!hasGradient(op.kind)) {
      const auto onPath = std::find_if(op.inputs.begin(), op.inputs.end(), needsGradient);
      throw AutodiffError(
          ErrorCode::NoGradient, op.name,
          fmt::format("op \"{}\" ({}) has no gradient, but its input \"{}\" lies on the path from "
                      "a differentiated tensor to the loss; remove the op from that path",
                      op.name, op.kind, graph.tensor(*onPath).name));
    }
    // The backward ops of a forward op run on its IPU (OpNode::virtualGraph).
    const auto firstBackward = static_cast<OpId>(graph.ops().size());
    std::vector<TensorId> outputGradients;
    const std::vector<TensorId> outputs = op.outputs;
    for (TensorId t : outputs) outputGradients.push_back(backward.finalize(t, false));
    const std::vector<TensorId> inputs = graph.op(o).inputs;
    std::vector<char> wanted;
    for (TensorId t : inputs) wanted.push_back(needsGradient(t) ? 1 : 0);
    const std::vector<TensorId> inputGradients = gradientOf(graph, o, outputGradients, wanted);
    for (std::size_t i = 0; i < inputs.size() && i < inputGradients.size(); ++i) {
      if (inputGradients[i] != kNoTensor && needsGradient(inputs[i]))
        backward.contribute(inputs[i], inputGradients[i]);
    }
    if (const int64_t ipu = graph.op(o).virtualGraph; ipu != kNoVirtualGraph) {
      for (auto b = firstBackward; b < static_cast<OpId>(graph.ops().size()); ++b) graph.setVirtualGraph(b, ipu);
    }
    // ... and carry its pipeline stage, which the pipelining transform
    // numbers as a backward stage.
    if (const int64_t stage = graph.op(o).pipelineStage; stage != kNoPipelineStage) {
      for (auto b = firstBackward; b < static_cast<OpId>(graph.ops().size()); ++b) graph.setPipelineStage(b, stage);
    }
    // ... and its execution phase, which the phases transform mirrors.
    if (const int64_t phase = graph.op(o).executionPhase; phase != kNoExecutionPhase) {
      for (auto b = firstBackward; b < static_cast<OpId>(graph.ops().size()); ++b) graph.setExecutionPhase(b, phase);
    }
  }

  std::vector<Tensor> gradients;
  gradients.reserve(wrt.size());
  for (const Tensor& w : wrt) {
    TensorId g = backward.finalize(w.id(), true);
    if (g == kNoTensor) {
      const int64_t n = numElements(w.shape());
      g = ops::constant(graph, graph.uniqueName(w.name() + ".grad"),
                        std::vector<float>(static_cast<std::size_t>(n), 0.0f), w.shape(), w.dtype())
              .id();
      backward.markNamed(g);
    }
    gradients.emplace_back(&graph, g);
  }
  return gradients;
}

}  // namespace tessera
