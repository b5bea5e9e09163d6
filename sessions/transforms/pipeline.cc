#include "pipeline.hpp"

#include <algorithm>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/lib/error.hpp"

namespace tessera {
namespace {

bool isSource(const OpNode& op) {
  return op.inputs.empty() && (op.kind == OpKind::Input || op.kind == OpKind::Variable || op.kind == OpKind::Constant);
}

std::string optionPath(std::string_view field) { return fmt::format("{}/{}", kSessionOptionsPath, field); }

// The forward ops' stages as named (or their IPUs), checked: one IPU per
// stage, stages 0 .. K-1 in IPU order. Returns each op's merged stage (one
// per IPU used, numbered in IPU order; kNoPipelineStage for sources).
std::vector<int64_t> forwardStages(const Graph& graph) {
  const OpNode* named = nullptr;
  const OpNode* unnamed = nullptr;
  int64_t unnamedCount = 0;
  int64_t ops = 0;
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    ++ops;
    if (op.pipelineStage == kNoPipelineStage) {
      if (unnamed == nullptr) unnamed = &op;
      ++unnamedCount;
    } else if (named == nullptr) {
      named = &op;
    }
  }
  if (named != nullptr && unnamed != nullptr) {
    throw ConfigError(ErrorCode::PartialPipelineStages, unnamed->name,
                      fmt::format("enablePipelining is true and op {} names pipeline stage {}, but {} of the "
                                  "graph's {} ops name none, {} ({}) first; either every op names its stage "
                                  "(ops::pipelineStage, an ONNX node's __pipeline_stage) or none does (then "
                                  "each op's IPU is its stage)",
                                  named->name, named->pipelineStage, unnamedCount, ops, unnamed->name,
                                  unnamed->kind));
  }
  const bool byIpu = named == nullptr;
  auto stageOf = [&](const OpNode& op) { return byIpu ? op.virtualGraph : op.pipelineStage; };
  // stage -> (IPU, the first op seen in it)
  std::map<int64_t, std::pair<int64_t, const OpNode*>> ipuOfStage;
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    const int64_t stage = stageOf(op);
    const auto [it, added] = ipuOfStage.try_emplace(stage, op.virtualGraph, &op);
    if (!added && it->second.first != op.virtualGraph) {
      throw ConfigError(ErrorCode::PipelineStageOnTwoIpus, op.name,
                        fmt::format("pipeline stage {} runs on IPU {} (op {}) and on IPU {} (op {} ({})); the "
                                    "ops of a stage must run on one IPU: give them one __ipu_number / "
                                    "virtualGraph, or split the stage",
                                    stage, it->second.first, it->second.second->name, op.virtualGraph, op.name,
                                    op.kind));
    }
  }
  std::vector<int64_t> stages;
  for (const auto& entry : ipuOfStage) stages.push_back(entry.first);
  // Named stages are numbered without gaps; IPUs the placement left
  // without ops (Auto may) are no stage.
  for (std::size_t k = 0; k < stages.size() && !byIpu; ++k) {
    if (stages[k] != static_cast<int64_t>(k)) {
      throw ConfigError(ErrorCode::PipelineStagesOutOfOrder, optionPath("enablePipelining"),
                        fmt::format("the graph's pipeline stages are {}; they must be numbered 0, 1, ... "
                                    "without gaps (stage {} is missing)",
                                    fmt::join(stages, ", "), k));
    }
  }
  std::vector<int64_t> ipus;
  for (std::size_t k = 0; k < stages.size(); ++k) {
    const int64_t ipu = ipuOfStage.at(stages[k]).first;
    if (k > 0 && ipu < ipus.back()) {
      const OpNode& op = *ipuOfStage.at(stages[k]).second;
      throw ConfigError(ErrorCode::PipelineStagesOutOfOrder, op.name,
                        fmt::format("pipeline stage {} runs on IPU {} (op {}), but stage {} runs on IPU {}; "
                                    "the stages must follow the order of their IPUs (a later stage on the "
                                    "same or a later IPU)",
                                    stages[k], ipu, op.name, stages[k - 1], ipus.back()));
    }
    if (ipus.empty() || ipu != ipus.back()) ipus.push_back(ipu);
  }
  // Values flow from a stage to the same or a later one.
  for (const OpNode& op : graph.ops()) {
    if (isSource(op)) continue;
    for (TensorId t : op.inputs) {
      const OpId producer = graph.tensor(t).producer;
      if (producer == kNoOp || isSource(graph.op(producer)) || stageOf(graph.op(producer)) <= stageOf(op)) continue;
      throw GraphError(ErrorCode::PipelineStageBackwards, op.name,
                       fmt::format("op {} ({}) in pipeline stage {} reads {}, made in the later stage {}; in "
                                   "the forward pass a stage reads only values of its own or earlier stages",
                                   op.name, op.kind, stageOf(op), graph.tensor(t).name,
                                   stageOf(graph.op(producer))));
    }
  }
  std::vector<int64_t> merged(graph.ops().size(), kNoPipelineStage);
  for (std::size_t i = 0; i < graph.ops().size(); ++i) {
    const OpNode& op = graph.ops()[i];
    if (isSource(op)) continue;
    const int64_t ipu = ipuOfStage.at(stageOf(op)).first;
    merged[i] = std::find(ipus.begin(), ipus.end(), ipu) - ipus.begin();
  }
  return merged;
}

}  // namespace

void PipelineStagesTransform::apply(Graph& graph) {
  if (!options_.enablePipelining) {
    for (std::size_t i = 0; i < graph.ops().size(); ++i)
      graph.setPipelineStage(static_cast<OpId>(i), kNoPipelineStage);
    return;
  }
  if (options_.virtualGraphMode == VirtualGraphMode::Off || ipus_ < 2) {
    throw ConfigError(ErrorCode::PipeliningWithoutVirtualGraphs, optionPath("enablePipelining"),
                      fmt::format("enablePipelining is true, but virtualGraphMode is {} with {} IPU{} per replica "
                                  "(/device/ipusPerReplica); pipelining runs stages on the IPUs of a replica, "
                                  "so it needs virtualGraphMode Manual or Auto and ipusPerReplica >= 2",
                                  options_.virtualGraphMode, ipus_, ipus_ == 1 ? "" : "s"));
  }
  const std::vector<int64_t> stages = forwardStages(graph);
  const int64_t forward = 1 + *std::max_element(stages.begin(), stages.end());
  if (forward < 2) {
    throw ConfigError(ErrorCode::PipeliningWithoutVirtualGraphs, optionPath("enablePipelining"),
                      fmt::format("enablePipelining is true, but every op of the graph runs in one pipeline "
                                  "stage on one IPU of the {}; place the ops on >= 2 IPUs (__ipu_number, or "
                                  "virtualGraphMode Auto), or set enablePipelining to false",
                                  ipus_));
  }
  if (training_) {
    const int64_t factor = options_.getAccumulationFactor();
    const int64_t depth = 2 * forward - 1;
    if (factor < depth) {
      throw ConfigError(
          ErrorCode::PipeliningAccumulationTooLow, optionPath("accumulationFactor"),
          fmt::format("enablePipelining over {} forward stages makes {} pipeline stages (forward and backward), "
                      "but the accumulation factor is {}{}; the depth (gradient accumulation factor) must be at "
                      "least the number of pipeline stages: set enableGradientAccumulation true and "
                      "accumulationFactor >= {}",
                      forward, depth, factor, options_.enableGradientAccumulation ? "" : " (accumulation is off)",
                      depth));
    }
  }
  for (std::size_t i = 0; i < graph.ops().size(); ++i) graph.setPipelineStage(static_cast<OpId>(i), stages[i]);
}

void PipelineBackwardTransform::apply(Graph& graph) {
  const OpId first = tensors_.firstBackwardOp;
  if (!options_.enablePipelining || first == kNoOp) return;
  int64_t last = 0;
  for (OpId id = 0; id < first && id < static_cast<OpId>(graph.ops().size()); ++id)
    last = std::max(last, graph.op(id).pipelineStage);
  for (auto id = first; id < static_cast<OpId>(graph.ops().size()); ++id) {
    const int64_t stage = graph.op(id).pipelineStage;
    if (stage != kNoPipelineStage) graph.setPipelineStage(id, 2 * last - stage);
  }
}

void PipelineCycleTransform::apply(Graph& graph) {
  if (!options_.enablePipelining) return;
  const auto n = static_cast<OpId>(graph.ops().size());
  // The stages of each IPU: those of the forward and backward ops, named
  // before the transforms that add ops without one.
  std::map<int64_t, std::set<int64_t>> stagesOn;
  for (const OpNode& op : graph.ops()) {
    if (isSource(op) || op.kind == OpKind::IpuCopy || op.pipelineStage == kNoPipelineStage) continue;
    stagesOn[op.virtualGraph].insert(op.pipelineStage);
  }
  for (bool changed = true; changed;) {
    changed = false;
    for (OpId id = 0; id < n; ++id) {
      const OpNode& op = graph.op(id);
      if (op.microBatch == kNoMicroBatch || op.pipelineStage != kNoPipelineStage) continue;
      int64_t stage = kNoPipelineStage;
      if (op.kind == OpKind::IpuCopy) {
        const OpId producer = graph.tensor(op.inputs.at(0)).producer;
        if (producer != kNoOp) stage = graph.op(producer).pipelineStage;
      } else {
        for (TensorId t : op.inputs) {
          const OpId producer = graph.tensor(t).producer;
          if (producer != kNoOp) stage = std::max(stage, graph.op(producer).pipelineStage);
        }
        if (stage == kNoPipelineStage) {
          for (TensorId t : op.outputs) {
            for (OpId consumer : graph.tensor(t).consumers) {
              const int64_t s = graph.op(consumer).pipelineStage;
              if (s != kNoPipelineStage && (stage == kNoPipelineStage || s < stage)) stage = s;
            }
          }
        }
      }
      if (stage == kNoPipelineStage) continue;
      graph.setPipelineStage(id, stage);
      changed = true;
    }
  }
  // Every other op runs in a stage of its own IPU: the first one at or after
  // the stage it took from its inputs, else (and for the ops of a weight
  // that run once a step: its update, its collectives) the IPU's last, the
  // backward stage of the weights there. A copy runs in the stage of the
  // value it copies.
  for (OpId id = 0; id < n; ++id) {
    const OpNode& op = graph.op(id);
    if (isSource(op) || op.kind == OpKind::IpuCopy) continue;
    const auto on = stagesOn.find(op.virtualGraph);
    if (on == stagesOn.end()) continue;  // the loop below gives its micro-batch ops stage 0
    const std::set<int64_t>& stages = on->second;
    if (stages.count(op.pipelineStage) != 0) continue;
    const auto next = op.pipelineStage == kNoPipelineStage ? stages.end() : stages.lower_bound(op.pipelineStage);
    graph.setPipelineStage(id, next != stages.end() ? *next : *stages.rbegin());
  }
  for (OpId id = 0; id < n; ++id) {
    const OpNode& op = graph.op(id);
    if (op.microBatch != kNoMicroBatch && op.pipelineStage == kNoPipelineStage) graph.setPipelineStage(id, 0);
  }
}

}  // namespace tessera
