#include "execution_phases.hpp"

#include <algorithm>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "virtual_graph.hpp"

namespace tessera {
namespace {

bool isSource(const OpNode& op) {
  return op.inputs.empty() &&
         (op.kind == OpKind::Input || op.kind == OpKind::Variable || op.kind == OpKind::Constant);
}

std::string settingsPath() { return std::string(kSessionOptionsPath) + "/executionPhaseSettings"; }

// Every non-source op names a phase below `phases`, or none does; no op
// reads a value of a later phase. Returns whether any op names one.
bool checkNamedPhases(const Graph& graph, int64_t phases) {
  const OpNode* named = nullptr;
  const OpNode* unnamed = nullptr;
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    (op.executionPhase == kNoExecutionPhase ? unnamed : named) = &op;
    if (op.executionPhase >= phases) {
      throw GraphError(
          ErrorCode::ExecutionPhaseOutOfRange, op.name,
          fmt::format("op {} ({}) is in execution phase {} (its __execution_phase / executionPhase), "
                      "but {}/phases is {}; use a phase from 0 to {}, or raise phases",
                      op.name, op.kind, op.executionPhase, settingsPath(), phases, phases - 1));
    }
  }
  if (named == nullptr) return false;
  if (unnamed != nullptr) {
    throw GraphError(
        ErrorCode::PartialExecutionPhases, unnamed->name,
        fmt::format("op {} names execution phase {}, but op {} ({}) names none; either every "
                    "forward op names its phase (__execution_phase / executionPhase) or none does "
                    "(then the forward pass is split into {} phases by memory)",
                    named->name, named->executionPhase, unnamed->name, unnamed->kind, phases));
  }
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    for (TensorId t : op.inputs) {
      const OpId producer = graph.tensor(t).producer;
      if (producer == kNoOp || isSource(graph.op(producer))) continue;
      const int64_t from = graph.op(producer).executionPhase;
      if (from <= op.executionPhase) continue;
      throw GraphError(
          ErrorCode::ExecutionPhaseBackwards, op.name,
          fmt::format("op {} in execution phase {} reads {}, made in the later phase {}; a forward "
                      "op reads only values of its own or earlier phases",
                      op.name, op.executionPhase, graph.tensor(t).name, from));
    }
  }
  return true;
}

}  // namespace

void ExecutionPhasesTransform::apply(Graph& graph) {
  if (!phasedExecution(options_)) {
    for (std::size_t i = 0; i < graph.ops().size(); ++i)
      if (graph.ops()[i].executionPhase != kNoExecutionPhase)
        graph.setExecutionPhase(static_cast<OpId>(i), kNoExecutionPhase);
    return;
  }
  const ExecutionPhaseSettings& settings = options_.executionPhaseSettings;
  if (ipus_ != settings.stages) {
    throw ConfigError(
        ErrorCode::InvalidExecutionPhaseStages, "/device/ipusPerReplica",
        fmt::format("executionPhaseSettings.stages is {}, so the phases take turns on {} IPU{}, but "
                    "a replica has {} (/device/ipusPerReplica); set ipusPerReplica to {}, or stages "
                    "to the IPUs of a replica (1 or 2)",
                    settings.stages, settings.stages, settings.stages == 1 ? "" : "s", ipus_,
                    settings.stages));
  }
  if (!checkNamedPhases(graph, settings.phases)) {
    const std::vector<int64_t> phases = autoVirtualGraphs(graph, settings.phases);
    for (std::size_t i = 0; i < phases.size(); ++i)
      if (phases[i] != kNoVirtualGraph) graph.setExecutionPhase(static_cast<OpId>(i), phases[i]);
  }
  for (std::size_t i = 0; i < graph.ops().size(); ++i) {
    const OpNode& op = graph.ops()[i];
    const int64_t ipu =
        op.executionPhase == kNoExecutionPhase ? kNoVirtualGraph : op.executionPhase % settings.stages;
    graph.setVirtualGraph(static_cast<OpId>(i), ipu);
  }
}

void ExecutionPhaseBackwardTransform::apply(Graph& graph) {
  const OpId first = tensors_.firstBackwardOp;
  if (!phasedExecution(options_) || first == kNoOp) return;
  const ExecutionPhaseSettings& settings = options_.executionPhaseSettings;
  for (auto id = first; id < static_cast<OpId>(graph.ops().size()); ++id) {
    const int64_t phase = graph.op(id).executionPhase;
    if (phase == kNoExecutionPhase) continue;
    const int64_t backward = 2 * settings.phases - 2 - phase;
    graph.setExecutionPhase(id, backward);
    graph.setVirtualGraph(id, backward % settings.stages);
  }
}

void ExecutionPhaseFillTransform::apply(Graph& graph) {
  if (!phasedExecution(options_)) return;
  const auto n = static_cast<OpId>(graph.ops().size());
  for (bool changed = true; changed;) {
    changed = false;
    for (OpId id = 0; id < n; ++id) {
      const OpNode& op = graph.op(id);
      if (isSource(op) || op.executionPhase != kNoExecutionPhase) continue;
      int64_t phase = kNoExecutionPhase;
      for (TensorId t : op.inputs) {
        const OpId producer = graph.tensor(t).producer;
        if (producer != kNoOp) phase = std::max(phase, graph.op(producer).executionPhase);
      }
      if (phase == kNoExecutionPhase) {
        for (TensorId t : op.outputs) {
          for (OpId consumer : graph.tensor(t).consumers) {
            const int64_t p = graph.op(consumer).executionPhase;
            if (p != kNoExecutionPhase && (phase == kNoExecutionPhase || p < phase)) phase = p;
          }
        }
      }
      if (phase == kNoExecutionPhase) continue;
      graph.setExecutionPhase(id, phase);
      changed = true;
    }
  }
}

}  // namespace tessera
