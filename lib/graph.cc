#include "tessera/lib/graph.hpp"

#include <algorithm>
#include <functional>
#include <limits>
#include <queue>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "op_def.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {

int64_t numElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0) {
      throw GraphError(ErrorCode::ShapeMismatch, shapeStr(shape),
                       fmt::format("dimension {} is negative; dimensions must be >= 0", d));
    }
    if (d != 0 && n > std::numeric_limits<int64_t>::max() / d) {
      throw GraphError(ErrorCode::ShapeMismatch, shapeStr(shape),
                       "the number of elements overflows a 64-bit integer");
    }
    n *= d;
  }
  return n;
}

std::string shapeStr(const Shape& shape) { return fmt::format("[{}]", fmt::join(shape, ", ")); }

InitialValues::InitialValues(std::vector<float> values)
    : values_(std::make_shared<const std::vector<float>>(std::move(values))),
      elements_(static_cast<int64_t>(values_->size())) {}

InitialValues InitialValues::filled(int64_t elements, float value) {
  return generated(elements, value == 0.0F ? std::string("zeros") : fmt::format("filled({})", value),
                   [value](std::span<float> out) { std::fill(out.begin(), out.end(), value); });
}

InitialValues InitialValues::generated(int64_t elements, std::string identity, Generator generate) {
  InitialValues v;
  v.generate_ = std::make_shared<const Generator>(std::move(generate));
  v.elements_ = elements;
  v.identity_ = std::move(identity);
  return v;
}

std::vector<float> InitialValues::values() const {
  if (values_) return *values_;
  std::vector<float> out(static_cast<std::size_t>(elements_));
  fill(out);
  return out;
}

void InitialValues::fill(std::span<float> out) const {
  if (static_cast<int64_t>(out.size()) != elements_)
    throw InternalError(ErrorCode::Internal, "initial values",
                        fmt::format("{} elements asked of {}", out.size(), elements_));
  if (values_) {
    std::copy(values_->begin(), values_->end(), out.begin());
  } else if (generate_) {
    (*generate_)(out);
  }
}

int64_t shardIndexAt(const TensorNode& node, int64_t replicationFactor, int64_t replica) {
  if (node.shardDomain) return node.shardDomain->indexInGroupAt(replica);
  const ReplicaGrouping grouping = node.grouping.value_or(ReplicaGrouping(replicationFactor));
  return grouping.indexInGroupAt(replica) % node.shardCount;
}

Graph::Graph(int64_t replicationFactor) : replicationFactor_(replicationFactor) {
  if (replicationFactor < 1) {
    throw GraphError(ErrorCode::InvalidOperand, "Graph",
                     fmt::format("replicationFactor is {}; it must be at least 1", replicationFactor));
  }
}

const TensorNode& Graph::tensor(TensorId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= tensors_.size()) {
    throw GraphError(ErrorCode::UnknownTensor, fmt::format("tensor #{}", id),
                     fmt::format("no tensor has id {}; the graph has {} tensors", id, tensors_.size()));
  }
  return tensors_[static_cast<std::size_t>(id)];
}

TensorNode& Graph::tensor(TensorId id) {
  return const_cast<TensorNode&>(static_cast<const Graph&>(*this).tensor(id));
}

const OpNode& Graph::op(OpId id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= ops_.size()) {
    throw GraphError(ErrorCode::InvalidOperand, fmt::format("op #{}", id),
                     fmt::format("no op has id {}; the graph has {} ops", id, ops_.size()));
  }
  return ops_[static_cast<std::size_t>(id)];
}

const RemoteBufferInfo& Graph::remoteBuffer(int64_t id) const {
  if (id < 0 || static_cast<std::size_t>(id) >= remoteBuffers_.size()) {
    throw GraphError(ErrorCode::InvalidRemoteBuffer, fmt::format("remote buffer #{}", id),
                     fmt::format("no remote buffer has id {}; the graph has {} remote buffers", id,
                                 remoteBuffers_.size()));
  }
  return remoteBuffers_[static_cast<std::size_t>(id)];
}

TensorId Graph::find(std::string_view name) const {
  if (auto id = tryFind(name)) return *id;
  throw GraphError(ErrorCode::UnknownTensor, std::string(name), "no tensor has this name");
}

std::optional<TensorId> Graph::tryFind(std::string_view name) const {
  auto it = names_.find(std::string(name));
  if (it == names_.end()) return std::nullopt;
  return it->second;
}

TensorId Graph::storageOf(TensorId t) const {
  const TensorId alias = tensor(t).aliasOf;
  return alias == kNoTensor ? t : alias;
}

std::string Graph::uniqueName(std::string_view base) {
  std::string name(base);
  if (!names_.contains(name)) return name;
  // Resume where the last search for this base stopped, so that n tensors
  // with one base cost O(n), not O(n^2).
  int64_t& next = nextSuffix_[name];
  for (;;) {
    ++next;
    std::string candidate = fmt::format("{}.{}", base, next);
    if (!names_.contains(candidate)) return candidate;
  }
}

void Graph::rename(TensorId id, std::string name) {
  TensorNode& node = tensor(id);
  if (node.name == name) return;
  if (names_.contains(name)) {
    throw GraphError(
        ErrorCode::DuplicateTensorName, name,
        fmt::format("cannot rename tensor \"{}\": the name is taken; choose another name", node.name));
  }
  names_.erase(node.name);
  names_.emplace(name, id);
  node.name = std::move(name);
}

OpId Graph::pushOp(OpNode node) {
  const auto id = static_cast<OpId>(ops_.size());
  if (sequenceDepth_ > 0) {
    if (lastInSequence_ != kNoOp) node.after.push_back(lastInSequence_);
    lastInSequence_ = id;
  }
  ops_.push_back(std::move(node));
  return id;
}

TensorId Graph::addSource(OpKind kind, TensorNode node) {
  if (kind != OpKind::Input && kind != OpKind::Variable && kind != OpKind::Constant) {
    throw GraphError(ErrorCode::InvalidOperand, node.name,
                     fmt::format("addSource makes Input, Variable or Constant ops, not {}", kind));
  }
  if (node.name.empty()) node.name = uniqueName(opName(kind));
  if (names_.contains(node.name)) {
    throw GraphError(ErrorCode::DuplicateTensorName, node.name,
                     fmt::format("a tensor named \"{}\" already exists; choose another name", node.name));
  }
  numElements(node.shape);
  const auto tensorId = static_cast<TensorId>(tensors_.size());
  OpNode op;
  op.kind = kind;
  op.outputs = {tensorId};
  op.name = node.name;
  node.producer = static_cast<OpId>(ops_.size());
  node.consumers.clear();
  node.aliasOf = kNoTensor;
  names_.emplace(node.name, tensorId);
  tensors_.push_back(std::move(node));
  pushOp(std::move(op));
  return tensorId;
}

void Graph::orderState(StateOrder& state, OpId op, bool writes) {
  OpNode& node = ops_[static_cast<std::size_t>(op)];
  if (writes) {
    // Readers of the old value go first, then the previous writer.
    for (OpId reader : state.readersSinceWrite)
      if (reader != op) node.after.push_back(reader);
    if (state.lastWriter != kNoOp && state.lastWriter != op) node.after.push_back(state.lastWriter);
    state.readersSinceWrite.clear();
    state.lastWriter = op;
  } else if (state.lastWriter != op) {
    if (state.lastWriter != kNoOp) node.after.push_back(state.lastWriter);
    state.readersSinceWrite.push_back(op);
  }
}

OpId Graph::addOp(OpKind kind, std::vector<TensorId> inputs, OpAttributes attributes, std::string name) {
  if (kind == OpKind::Input || kind == OpKind::Variable || kind == OpKind::Constant) {
    throw GraphError(ErrorCode::InvalidOperand, std::string(opName(kind)),
                     "sources are added with addSource, not addOp");
  }
  if (name.empty()) name = std::string(opName(kind));
  for (TensorId t : inputs) {
    if (t < 0 || static_cast<std::size_t>(t) >= tensors_.size()) {
      throw GraphError(
          ErrorCode::UnknownTensor, name,
          fmt::format("input tensor id {} does not exist; the graph has {} tensors", t, tensors_.size()));
    }
  }
  std::vector<OutputSpec> outputs = inferOutputs(*this, kind, inputs, attributes, name);

  const auto opId = static_cast<OpId>(ops_.size());
  OpNode node;
  node.kind = kind;
  node.inputs = inputs;
  node.attributes = std::move(attributes);
  node.name = uniqueName(name);
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    TensorNode out;
    out.name = i == 0 ? node.name : uniqueName(fmt::format("{}.out{}", node.name, i));
    out.dtype = outputs[i].dtype;
    out.shape = std::move(outputs[i].shape);
    out.metaShape = std::move(outputs[i].metaShape);
    out.producer = opId;
    if (isInplace(kind) && i == 0) out.aliasOf = storageOf(inputs[0]);
    const auto outId = static_cast<TensorId>(tensors_.size());
    names_.emplace(out.name, outId);
    tensors_.push_back(std::move(out));
    node.outputs.push_back(outId);
  }
  const OpAttributes& attrs = node.attributes;
  const bool loads = kind == OpKind::RemoteLoad;
  const bool stores = kind == OpKind::RemoteStore;
  const int64_t buffer = attrs.remoteBuffer;
  pushOp(std::move(node));

  for (std::size_t i = 0; i < inputs.size(); ++i) {
    tensors_[static_cast<std::size_t>(inputs[i])].consumers.push_back(opId);
    const bool writes = isInplace(kind) && i == 0;
    orderState(storageOrder_[storageOf(inputs[i])], opId, writes);
  }
  if (loads || stores) orderState(bufferOrder_[buffer], opId, stores);
  return opId;
}

int64_t Graph::addRemoteBuffer(RemoteBufferInfo info) {
  if (info.entries < 1) {
    throw GraphError(
        ErrorCode::InvalidRemoteBuffer, fmt::format("remote buffer #{}", remoteBuffers_.size()),
        fmt::format("entries is {}; a remote buffer needs a positive number of entries", info.entries));
  }
  for (int64_t d : info.shape) {
    if (d < 0) {
      throw GraphError(ErrorCode::InvalidRemoteBuffer,
                       fmt::format("remote buffer #{}", remoteBuffers_.size()),
                       fmt::format("shape {} has a negative dimension", shapeStr(info.shape)));
    }
  }
  remoteBuffers_.push_back(std::move(info));
  return static_cast<int64_t>(remoteBuffers_.size()) - 1;
}

void Graph::setRemoteBufferMetaShape(int64_t id, Shape metaShape) {
  remoteBuffer(id);
  remoteBuffers_[static_cast<std::size_t>(id)].metaShape = std::move(metaShape);
}

bool Graph::canRecompute(OpId id) const {
  const OpKind kind = op(id).kind;
  return kind != OpKind::Input && kind != OpKind::Variable && kind != OpKind::Constant && !isInplace(kind) &&
         !isCollective(kind) && kind != OpKind::RemoteLoad && kind != OpKind::RemoteStore;
}

void Graph::setRecompute(OpId id, RecomputeType type) {
  const OpNode& node = op(id);
  if (type == RecomputeType::Recomputed) {
    throw GraphError(ErrorCode::InvalidRecompute, node.name,
                     fmt::format("op {} ({}) cannot be marked Recomputed: that mark is the recomputation "
                                 "transform's; use Recompute, Checkpoint or Undefined",
                                 node.name, node.kind));
  }
  if (type == RecomputeType::Recompute && !canRecompute(id)) {
    throw GraphError(ErrorCode::InvalidRecompute, node.name,
                     fmt::format("op {} is a {}, which cannot be recomputed (sources, in-place, remote and "
                                 "collective ops keep their outputs); mark it Checkpoint or Undefined",
                                 node.name, node.kind));
  }
  ops_[static_cast<std::size_t>(id)].recompute = type;
}

void Graph::copyRecomputeMarks(OpId to, const OpNode& from) {
  op(to);
  ops_[static_cast<std::size_t>(to)].recompute = from.recompute;
  ops_[static_cast<std::size_t>(to)].normalisation = from.normalisation;
  ops_[static_cast<std::size_t>(to)].virtualGraph = from.virtualGraph;
  ops_[static_cast<std::size_t>(to)].pipelineStage = from.pipelineStage;
  ops_[static_cast<std::size_t>(to)].executionPhase = from.executionPhase;
  ops_[static_cast<std::size_t>(to)].microBatch = from.microBatch;
}

namespace {

// An op's IPU, pipeline stage or execution phase: numbered from 0, or `none`.
// `what` says what the op cannot do ("run on IPU"), `unit` names one ("an IPU").
int64_t checkedOpNumber(const OpNode& node, int64_t value, int64_t none, ErrorCode code, std::string_view what,
                        std::string_view unit) {
  if (value < 0 && value != none) {
    throw GraphError(code, node.name,
                     fmt::format("op {} ({}) cannot {} {}: {} is numbered from 0 (or {} for none)", node.name,
                                 node.kind, what, value, unit, none));
  }
  return value;
}

}  // namespace

void Graph::setVirtualGraph(OpId id, int64_t ipu) {
  ops_[static_cast<std::size_t>(id)].virtualGraph =
      checkedOpNumber(op(id), ipu, kNoVirtualGraph, ErrorCode::InvalidVirtualGraph, "run on IPU", "an IPU");
}

void Graph::setPipelineStage(OpId id, int64_t stage) {
  ops_[static_cast<std::size_t>(id)].pipelineStage = checkedOpNumber(
      op(id), stage, kNoPipelineStage, ErrorCode::InvalidPipelineStage, "be in pipeline stage", "a stage");
}

void Graph::setExecutionPhase(OpId id, int64_t phase) {
  ops_[static_cast<std::size_t>(id)].executionPhase = checkedOpNumber(
      op(id), phase, kNoExecutionPhase, ErrorCode::InvalidExecutionPhase, "be in execution phase", "a phase");
}

void Graph::setMicroBatch(OpId id, int64_t microBatch) {
  op(id);
  ops_[static_cast<std::size_t>(id)].microBatch = microBatch;
}

void Graph::markNormalisation(OpId first) {
  for (std::size_t id = static_cast<std::size_t>(std::max<OpId>(first, 0)); id < ops_.size(); ++id) {
    ops_[id].normalisation = true;
  }
}

void Graph::addAfter(OpId op, OpId before) {
  this->op(before);
  this->op(op);
  ops_[static_cast<std::size_t>(op)].after.push_back(before);
}

void Graph::beginSequence() {
  if (sequenceDepth_++ == 0) lastInSequence_ = kNoOp;
}

void Graph::endSequence() {
  if (sequenceDepth_ == 0) {
    throw GraphError(ErrorCode::InvalidProgramOrder, "endSequence",
                     "endSequence() without a matching beginSequence()");
  }
  --sequenceDepth_;
}

std::vector<OpId> Graph::schedule() const {
  const std::size_t n = ops_.size();
  std::vector<int64_t> pending(n, 0);
  std::vector<std::vector<OpId>> successors(n);
  for (std::size_t i = 0; i < n; ++i) {
    const OpNode& node = ops_[i];
    for (TensorId t : node.inputs) {
      successors[static_cast<std::size_t>(tensors_[static_cast<std::size_t>(t)].producer)].push_back(
          static_cast<OpId>(i));
      ++pending[i];
    }
    for (OpId before : node.after) {
      successors[static_cast<std::size_t>(before)].push_back(static_cast<OpId>(i));
      ++pending[i];
    }
  }
  std::priority_queue<OpId, std::vector<OpId>, std::greater<>> ready;
  for (std::size_t i = 0; i < n; ++i)
    if (pending[i] == 0) ready.push(static_cast<OpId>(i));
  std::vector<OpId> order;
  order.reserve(n);
  while (!ready.empty()) {
    const OpId next = ready.top();
    ready.pop();
    order.push_back(next);
    for (OpId s : successors[static_cast<std::size_t>(next)])
      if (--pending[static_cast<std::size_t>(s)] == 0) ready.push(s);
  }
  if (order.size() != n) {
    for (std::size_t i = 0; i < n; ++i) {
      if (pending[i] > 0) {
        throw GraphError(
            ErrorCode::InvalidProgramOrder, ops_[i].name,
            fmt::format("the ops' data flow and `after` constraints form a cycle through op \"{}\" "
                        "({} of {} ops cannot be scheduled); remove one of the constraints",
                        ops_[i].name, n - order.size(), n));
      }
    }
  }
  return order;
}

}  // namespace tessera
