#include "session_runtime.hpp"

#include <algorithm>
#include <cstring>
#include <optional>
#include <string_view>
#include <type_traits>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/popdist/communicator.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera::detail {
namespace {

const Shape& hostValueShape(const TensorNode& node) {
  return node.metaShape.empty() ? node.shape : node.metaShape;
}

ReplicaGrouping groupingOf(const TensorNode& node, int64_t globalReplicas) {
  return node.grouping.value_or(ReplicaGrouping(globalReplicas));
}

// FNV-1a: a small, fully specified hash, the same in every build.
class Fingerprint {
 public:
  void add(const void* data, size_t bytes) {
    const auto* p = static_cast<const unsigned char*>(data);
    for (size_t i = 0; i < bytes; ++i) hash_ = (hash_ ^ p[i]) * 0x100000001b3ull;
  }
  template <class T>
  void add(const T& value) requires std::is_arithmetic_v<T> || std::is_enum_v<T> {
    add(&value, sizeof value);
  }
  void add(std::string_view text) {
    add(text.size());
    add(text.data(), text.size());
  }
  template <class T>
  void add(const std::vector<T>& values) {
    add(values.size());
    for (const T& v : values) add(v);
  }
  void add(const std::optional<ReplicaGrouping>& grouping) {
    add(grouping.has_value());
    if (grouping) {
      add(grouping->numReplicas());
      add(grouping->stride());
      add(grouping->groupSize());
    }
  }
  std::string hex() const { return fmt::format("{:016x}", hash_); }

 private:
  uint64_t hash_ = 0xcbf29ce484222325ull;
};

// What instances compare of a graph: its structure as one hash, and each
// variable's initial value on its own, so that a difference in one (a
// different seed, say) is named.
nlohmann::json graphFingerprint(const Graph& graph) {
  Fingerprint structure;
  nlohmann::json variables = nlohmann::json::object();
  for (const TensorNode& t : graph.tensors()) {
    structure.add(std::string_view(t.name));
    structure.add(t.dtype);
    structure.add(t.shape);
    structure.add(t.category);
    structure.add(t.grouping);
    structure.add(t.retrievalMode);
    structure.add(t.metaShape);
    structure.add(t.shardCount);
    structure.add(t.shardDomain);
    structure.add(t.remoteBuffer);
    structure.add(t.remoteEntry);
    const bool variable = t.producer != kNoOp && graph.op(t.producer).kind == OpKind::Variable;
    if (!variable) {
      structure.add(t.data);
      continue;
    }
    // Explicit values are hashed; generated ones are named by their
    // generator and seed, so that no instance makes them to compare.
    Fingerprint value;
    if (const std::vector<float>* values = t.initial.explicitValues()) {
      value.add(*values);
    } else {
      value.add(std::string_view(t.initial.identity()));
    }
    variables[t.name] =
        fmt::format("{} {} values, hash {}", shapeStr(t.shape), t.initial.elements(), value.hex());
  }
  for (const OpNode& op : graph.ops()) {
    structure.add(op.kind);
    structure.add(std::string_view(op.name));
    structure.add(op.inputs);
    structure.add(op.outputs);
    structure.add(op.after);
    const OpAttributes& a = op.attributes;
    structure.add(a.axes);
    structure.add(a.keepDims);
    structure.add(a.shape);
    structure.add(a.starts);
    structure.add(a.ends);
    structure.add(a.axis);
    structure.add(a.a);
    structure.add(a.b);
    structure.add(a.reduction);
    structure.add(a.grouping);
    structure.add(a.remoteBuffer);
    structure.add(a.entry);
    structure.add(a.kernel);
    structure.add(a.strides);
    structure.add(a.pads);
    structure.add(a.dilations);
    structure.add(a.outputPadding);
    structure.add(a.group);
    structure.add(a.ceilMode);
    structure.add(a.countIncludePad);
    structure.add(a.direction);
    structure.add(a.linearBeforeReset);
    structure.add(a.cell);
  }
  return nlohmann::json{{"structure", fmt::format("{} ops, {} tensors, hash {}", graph.ops().size(),
                                                  graph.tensors().size(), structure.hex())},
                        {"variables", std::move(variables)}};
}

}  // namespace

Shape hostLeadingShape(int64_t accumulationFactor, int64_t localReplicas, const Shape& rest) {
  Shape shape;
  if (accumulationFactor > 1) shape.push_back(accumulationFactor);
  if (localReplicas > 1) shape.push_back(localReplicas);
  shape.insert(shape.end(), rest.begin(), rest.end());
  return shape;
}

namespace {

// The IPU a host stream lands on: its tensor's producer's (an Input takes the
// IPU of the op that consumes it from the virtual-graph transforms).
int64_t ipuOf(const Graph& graph, const TensorNode& node) {
  return node.producer == kNoOp ? 0 : std::max<int64_t>(0, graph.op(node.producer).virtualGraph);
}

}  // namespace

std::vector<HostStream> hostStreamsOf(const Graph& graph, int64_t accumulationFactor,
                                      const std::vector<TensorId>& outputs, const HostIo& io) {
  const int64_t batches = io.batchesPerStep;
  std::vector<HostStream> streams;
  for (const OpNode& op : graph.ops()) {
    if (op.kind != OpKind::Input) continue;
    const TensorNode& node = graph.tensor(op.outputs.front());
    // One batch of a replica: [accumulationFactor, ...micro] with accumulation.
    const int64_t bytes = numElements(node.shape) * dtypeBytes(node.dtype);
    streams.push_back({node.name, true, node.inputSettings.tileSet, node.inputSettings.exchangeStrategy,
                       bytes * batches, batches * accumulationFactor, bytes / accumulationFactor,
                       ipuOf(graph, node)});
  }
  for (std::size_t i = 0; i < outputs.size(); ++i) {
    const TensorNode& node = graph.tensor(outputs[i]);
    const AnchorReturnType type = i < io.outputTypes.size() ? io.outputTypes[i] : AnchorReturnType::all();
    const bool leading = i < io.microBatchLeading.size() && io.microBatchLeading[i];
    const int64_t perMicroBatch = leading ? accumulationFactor : 1;
    const int64_t bytes = numElements(node.shape) * dtypeBytes(node.dtype);
    HostStream s{node.name, false, type.tileSet, type.exchangeStrategy, 0, 0, bytes / perMicroBatch,
                 ipuOf(graph, node)};
    if (type.id == AnchorReturnTypeId::All || type.id == AnchorReturnTypeId::EveryN) {
      // Every micro-batch of each returned batch.
      const int64_t returned = returnedBatches(type, batches);
      s.bytesPerStep = returned * bytes;
      s.transfersPerStep = returned * perMicroBatch;
    } else {
      // Final and Sum: one value per step, kept on the device until then.
      s.bytesPerStep = bytes / perMicroBatch;
      s.transfersPerStep = 1;
    }
    streams.push_back(std::move(s));
  }
  return streams;
}

SessionRuntime::SessionRuntime(Graph graph, const SessionOptions& options, const ReplicaTopology& topology,
                               std::unique_ptr<Device> device, int64_t accumulationFactor,
                               const std::vector<TensorId>& outputs, const HostIo& io)
    : device_(std::move(device)), accumulationFactor_(accumulationFactor) {
  Program prepared;
  prepared.replicas = topology;
  prepared.numIOTiles = options.numIOTiles;
  prepared.graph = std::move(graph);
  prepared.hostReads = outputs;
  prepared.hostStreams = hostStreamsOf(prepared.graph, accumulationFactor, outputs, io);
  prepared.batchesPerStep = io.batchesPerStep;
  prepared.accumulationFactor = accumulationFactor;
  if (prepared.replicas.distributed()) checkInstances(prepared, options);
  executable_ = device_->load(std::move(prepared));

  const Graph& g = program().graph;
  for (const OpNode& op : g.ops()) {
    if (op.kind != OpKind::Input) continue;
    const TensorNode& node = g.tensor(op.outputs.front());
    Stream s;
    s.tensor = op.outputs.front();
    s.dtype = node.dtype;
    const Shape micro =
        accumulationFactor_ > 1 ? Shape(node.shape.begin() + 1, node.shape.end()) : node.shape;
    s.hostShape = hostLeadingShape(accumulationFactor_, program().replicas.localReplicas, micro);
    s.derivation =
        fmt::format("[accumulationFactor={}, localReplicas={}, ...{}] with size-1 dimensions omitted",
                    accumulationFactor_, program().replicas.localReplicas, shapeStr(micro));
    s.device.assign(static_cast<size_t>(program().replicas.localReplicas * numElements(node.shape) *
                                        dtypeSlots(node.dtype)),
                    0.0f);
    streams_.push_back(std::move(s));
  }
  for (TensorId t : outputs) {
    Output out;
    out.tensor = t;
    const ReplicaGrouping layout = executable_->layout(t);
    out.groups.assign(static_cast<size_t>(layout.numGroups() * numElements(g.tensor(t).shape) *
                                          dtypeSlots(g.tensor(t).dtype)),
                      0.0f);
    outputs_.push_back(std::move(out));
  }
  // The device wrote every variable's initial values when it loaded the
  // program (each made once, there).
}

void SessionRuntime::checkInstances(const Program& program, const SessionOptions& options) const {
  Communicator* communicator = device_->communicator();
  if (communicator == nullptr) {
    throw ConfigError(
        ErrorCode::UnsupportedCombination, "/sessionOptions/enableDistributedReplicatedGraphs",
        fmt::format(
            "a global replication factor of {} over {} local replica(s) needs the other instances, but "
            "the device has no communicator; create it with makeSimDevice(spec, mode, "
            "dist::instanceCommunicator()) and start the instances with `tessera launch`, or use one "
            "instance with replicatedGraphCount {}",
            program.replicas.globalReplicas, program.replicas.localReplicas,
            program.replicas.globalReplicas));
  }
  // Everything but this instance's own offset must be the same everywhere.
  // One check each, in this order, so that the first difference named is
  // the cause (other options make other graphs).
  nlohmann::json sessionOptions = options;
  sessionOptions.erase("globalReplicaOffset");
  dist::checkInstancesAgree(*communicator, {{"tesseraVersion", dist::tesseraVersion()}}, "tessera versions");
  dist::checkInstancesAgree(*communicator, {{"sessionOptions", std::move(sessionOptions)}},
                            "session options");
  dist::checkInstancesAgree(*communicator, {{"graph", graphFingerprint(program.graph)}}, "session graphs");
}

void SessionRuntime::setOutputMicroBatchLeading(size_t index, bool leading) {
  outputs_.at(index).microBatchLeading = leading;
}

SessionRuntime::Stream& SessionRuntime::stream(std::string_view name) {
  return const_cast<Stream&>(std::as_const(*this).stream(name));
}

const SessionRuntime::Stream& SessionRuntime::stream(std::string_view name) const {
  for (const Stream& s : streams_)
    if (program().graph.tensor(s.tensor).name == name) return s;
  std::vector<std::string> names;
  for (const Stream& s : streams_) names.push_back(program().graph.tensor(s.tensor).name);
  throw GraphError(ErrorCode::UnknownStream, std::string(name),
                   fmt::format("no input stream of that name; the program's streams are {}", names));
}

Shape SessionRuntime::inputHostShape(std::string_view name) const { return stream(name).hostShape; }

void SessionRuntime::run(std::span<const StepInput> inputs) {
  for (Stream& s : streams_) s.fed = false;
  for (const StepInput& input : inputs) {
    Stream& s = stream(input.name);
    const TensorNode& node = program().graph.tensor(s.tensor);
    const auto expected = static_cast<size_t>(numElements(s.hostShape));
    const int given = static_cast<int>(!input.floats.empty()) + static_cast<int>(!input.ints.empty()) +
                      static_cast<int>(!input.doubles.empty());
    const size_t received = input.floats.size() + input.ints.size() + input.doubles.size();
    if (s.fed) {
      throw GraphError(ErrorCode::HostShapeMismatch, node.name, "the stream was given twice in one step");
    }
    if (received != expected || given > 1) {
      throw GraphError(ErrorCode::HostShapeMismatch, node.name,
                       fmt::format("expected host shape {} = {} elements, {}; received {} elements",
                                   shapeStr(s.hostShape), expected, s.derivation, received));
    }
    if (!input.ints.empty() && s.dtype != DType::Int32) {
      throw GraphError(ErrorCode::HostShapeMismatch, node.name,
                       fmt::format("int32 data given for a {} stream", s.dtype));
    }
    if (!input.doubles.empty() && s.dtype != DType::Float64) {
      throw GraphError(ErrorCode::HostShapeMismatch, node.name,
                       fmt::format("float64 data given for a {} stream; give floats", s.dtype));
    }
    // Host order is [micro-batch, replica, ...]; the device keeps each
    // replica's micro-batches together: [replica, micro-batch, ...].
    const int64_t af = accumulationFactor_;
    const int64_t replicas = program().replicas.localReplicas;
    const auto block = static_cast<size_t>(numElements(node.shape) / af);
    const auto slots = static_cast<size_t>(dtypeSlots(s.dtype));
    for (int64_t a = 0; a < af; ++a) {
      for (int64_t r = 0; r < replicas; ++r) {
        const size_t from = static_cast<size_t>(a * replicas + r) * block;
        float* to = s.device.data() + static_cast<size_t>(r * af + a) * block * slots;
        if (s.dtype == DType::Float64) {
          // Doubles are held as their bytes, two floats each.
          for (size_t k = 0; k < block; ++k) {
            const double v =
                input.doubles.empty() ? static_cast<double>(input.floats[from + k]) : input.doubles[from + k];
            std::memcpy(to + 2 * k, &v, sizeof v);
          }
        } else if (input.ints.empty()) {
          std::copy_n(input.floats.data() + from, block, to);
        } else {
          std::transform(input.ints.data() + from, input.ints.data() + from + block, to,
                         [](int32_t v) { return static_cast<float>(v); });
        }
      }
    }
    s.fed = true;
  }
  std::vector<Executable::Feed> feeds;
  feeds.reserve(streams_.size());
  for (const Stream& s : streams_) {
    if (!s.fed) {
      throw GraphError(ErrorCode::HostShapeMismatch, program().graph.tensor(s.tensor).name,
                       fmt::format("the stream was not given; expected host shape {} ({})",
                                   shapeStr(s.hostShape), s.derivation));
    }
    feeds.push_back({s.tensor, s.device});
  }
  executable_->run(feeds);
  readOutputs();
}

void SessionRuntime::readOutputs() {
  const int64_t replicas = program().replicas.localReplicas;
  for (Output& out : outputs_) {
    const TensorNode& node = program().graph.tensor(out.tensor);
    const ReplicaGrouping layout = executable_->layout(out.tensor);
    executable_->read(out.tensor, out.groups);
    const int64_t elements = numElements(node.shape) * dtypeSlots(node.dtype);
    const int64_t lead = out.microBatchLeading && !node.shape.empty() ? node.shape.front() : 1;
    const Shape rest = out.microBatchLeading && !node.shape.empty()
                           ? Shape(node.shape.begin() + 1, node.shape.end())
                           : node.shape;
    out.host.shape = hostLeadingShape(lead, replicas, rest);
    out.host.data.resize(static_cast<size_t>(replicas * elements));
    const int64_t block = elements / lead;
    for (int64_t r = 0; r < replicas; ++r) {
      const float* value = out.groups.data() + layout.groupAt(r) * elements;
      for (int64_t a = 0; a < lead; ++a) {
        std::copy_n(value + a * block, block, out.host.data.data() + (a * replicas + r) * block);
      }
    }
    if (node.dtype == DType::Float64) {
      // The doubles' bytes, into the output's own buffer (no allocation
      // after the first step).
      out.host.doubles.resize(out.host.data.size() / 2);
      std::memcpy(out.host.doubles.data(), out.host.data.data(), out.host.doubles.size() * sizeof(double));
      out.host.data.clear();
    }
  }
}

TensorId SessionRuntime::variable(std::string_view name) const {
  const auto id = program().graph.tryFind(name);
  if (!id || program().graph.tensor(*id).producer == kNoOp ||
      program().graph.op(program().graph.tensor(*id).producer).kind != OpKind::Variable) {
    throw GraphError(ErrorCode::UnknownTensor, std::string(name),
                     "no variable of that name in the session's graph");
  }
  return *id;
}

Shape SessionRuntime::variableHostShape(const TensorNode& node, RetrievalMode mode) const {
  const ReplicaGrouping grouping = groupingOf(node, program().replicas.globalReplicas);
  Shape shape;
  if (mode == RetrievalMode::AllReplicas && grouping.groupSize() > 1) {
    shape.push_back(program().replicas.globalReplicas);
  } else if (grouping.numGroups() > 1) {
    shape.push_back(grouping.numGroups());
  }
  const Shape& value = hostValueShape(node);
  shape.insert(shape.end(), value.begin(), value.end());
  return shape;
}

void SessionRuntime::replicaValue(const TensorNode& node, std::span<const float> host, int64_t localReplica,
                                  std::span<float> out) const {
  const ReplicaGrouping grouping = groupingOf(node, program().replicas.globalReplicas);
  const int64_t global = program().replicas.replicaOffset + localReplica;
  const int64_t group = grouping.numGroups() > 1 ? grouping.groupAt(global) : 0;
  const int64_t n = numElements(hostValueShape(node));
  const auto slice = host.subspan(static_cast<size_t>(group * n), static_cast<size_t>(n));
  if (node.metaShape.empty()) {
    std::copy(slice.begin(), slice.end(), out.begin());
    return;
  }
  const ShardLayout layout(n, node.shardCount);
  layout.hostToShard(slice, shardIndexAt(node, program().replicas.globalReplicas, global), out);
}

void SessionRuntime::writeVariable(std::string_view name, std::span<const float> hostData,
                                   const Shape& hostShape) {
  const TensorId t = variable(name);
  const TensorNode& node = program().graph.tensor(t);
  const Shape expected = variableHostShape(node, RetrievalMode::OnePerGroup);
  if (hostShape != expected || hostData.size() != static_cast<size_t>(numElements(expected))) {
    const ReplicaGrouping grouping = groupingOf(node, program().replicas.globalReplicas);
    throw GraphError(
        ErrorCode::HostShapeMismatch, node.name,
        fmt::format("expected host shape {} ({} group(s) of {} x {}{}); received {} with {} values",
                    shapeStr(expected), grouping.numGroups(), grouping.str(), shapeStr(hostValueShape(node)),
                    node.metaShape.empty() ? "" : ", reassembled from shards", shapeStr(hostShape),
                    hostData.size()));
  }
  const auto elements = static_cast<size_t>(numElements(node.shape));
  if (node.remoteBuffer >= 0) {
    std::vector<float> replicas(static_cast<size_t>(program().replicas.localReplicas) * elements);
    for (int64_t r = 0; r < program().replicas.localReplicas; ++r) {
      replicaValue(node, hostData, r,
                   std::span<float>(replicas).subspan(static_cast<size_t>(r) * elements, elements));
    }
    executable_->writeRemote(node.remoteBuffer, node.remoteEntry, replicas);
    return;
  }
  const ReplicaGrouping layout = executable_->layout(t);
  std::vector<float> groups(static_cast<size_t>(layout.numGroups()) * elements);
  for (int64_t j = 0; j < layout.numGroups(); ++j) {
    replicaValue(node, hostData, layout.replicaAt(j, 0),
                 std::span<float>(groups).subspan(static_cast<size_t>(j) * elements, elements));
  }
  executable_->write(t, groups);
}

void SessionRuntime::writeScalar(TensorId variable, double value) {
  const TensorNode& node = program().graph.tensor(variable);
  if (node.remoteBuffer >= 0 || !node.metaShape.empty()) {
    // Placed off chip or sharded by its location: the general path.
    const Shape shape = variableHostShape(node, RetrievalMode::OnePerGroup);
    const std::vector<float> host(static_cast<size_t>(numElements(shape)), static_cast<float>(value));
    writeVariable(node.name, host, shape);
    return;
  }
  const ReplicaGrouping layout = executable_->layout(variable);
  const auto elements = static_cast<size_t>(numElements(program().graph.tensor(variable).shape));
  std::vector<float> groups(static_cast<size_t>(layout.numGroups()) * elements, static_cast<float>(value));
  executable_->write(variable, groups);
}

HostTensor SessionRuntime::readVariable(std::string_view name, std::optional<RetrievalMode> mode) const {
  const TensorId t = variable(name);
  const TensorNode& node = program().graph.tensor(t);
  const RetrievalMode retrieval = mode.value_or(node.retrievalMode);
  const int64_t replicas = program().replicas.localReplicas;
  const auto elements = static_cast<size_t>(numElements(node.shape));

  // Every local replica's value.
  std::vector<float> values(static_cast<size_t>(replicas) * elements);
  if (node.remoteBuffer >= 0) {
    executable_->readRemote(node.remoteBuffer, node.remoteEntry, values);
  } else {
    const ReplicaGrouping layout = executable_->layout(t);
    std::vector<float> groups(static_cast<size_t>(layout.numGroups()) * elements);
    executable_->read(t, groups);
    for (int64_t r = 0; r < replicas; ++r) {
      std::copy_n(groups.data() + static_cast<size_t>(layout.groupAt(r)) * elements, elements,
                  values.data() + static_cast<size_t>(r) * elements);
    }
  }
  const ReplicaGrouping grouping = groupingOf(node, program().replicas.globalReplicas);
  const auto n = static_cast<size_t>(numElements(hostValueShape(node)));
  const int64_t shards = node.metaShape.empty() ? 1 : node.shardCount;
  // For every shard of a group (a single one when not sharded), the replica
  // it is read from: a replica of the instance whose replicas start at
  // `first` when the group has one there, else its first holder.
  const auto holders = [&](int64_t group, int64_t first) {
    std::vector<int64_t> chosen(static_cast<size_t>(shards), -1);
    for (const bool localOnly : {true, false}) {
      for (int64_t m = 0; m < grouping.groupSize(); ++m) {
        const int64_t replica = grouping.replicaAt(group, m);
        if (localOnly && (replica < first || replica >= first + replicas)) continue;
        const int64_t s = shards == 1 ? 0 : shardIndexAt(node, program().replicas.globalReplicas, replica);
        if (chosen[static_cast<size_t>(s)] < 0) chosen[static_cast<size_t>(s)] = replica;
      }
    }
    return chosen;
  };
  // When some instance lacks a holder of some shard (a sharding domain or a
  // variable group across instances), every instance gathers every
  // replica's value: the decision is the same on all, as collectives need.
  std::vector<float> everyReplica;
  bool gather = false;
  for (int64_t first = 0;
       first < program().replicas.globalReplicas && replicas < program().replicas.globalReplicas && !gather;
       first += replicas) {
    for (int64_t group = 0; group < grouping.numGroups() && !gather; ++group) {
      for (int64_t replica : holders(group, first))
        gather = gather || replica < first || replica >= first + replicas;
    }
  }
  if (gather) {
    everyReplica.resize(static_cast<size_t>(program().replicas.globalReplicas) * elements);
    device_->communicator()->allGather(values, everyReplica);
  }
  const auto valueOf = [&](int64_t globalReplica) {
    if (gather)
      return std::span<const float>(everyReplica)
          .subspan(static_cast<size_t>(globalReplica) * elements, elements);
    return std::span<const float>(values).subspan(
        static_cast<size_t>(globalReplica - program().replicas.replicaOffset) * elements, elements);
  };

  // The full value of group `group`, reassembled from its members' shards
  // when sharded.
  const auto groupValue = [&](int64_t group, std::span<float> out) {
    const std::vector<int64_t> from = holders(group, program().replicas.replicaOffset);
    if (node.metaShape.empty()) {
      const auto v = valueOf(from.front());
      std::copy(v.begin(), v.end(), out.begin());
      return;
    }
    const ShardLayout layout(static_cast<int64_t>(n), node.shardCount);
    std::vector<float> shardValues(static_cast<size_t>(layout.paddedElements()));
    // Every shard index occurs in the group.
    for (int64_t s = 0; s < shards; ++s) {
      const auto v = valueOf(from[static_cast<size_t>(s)]);
      std::copy(v.begin(), v.end(),
                shardValues.begin() + static_cast<std::ptrdiff_t>(s * layout.shardElements()));
    }
    layout.shardsToHost(shardValues, out);
  };

  HostTensor host;
  host.shape = variableHostShape(node, retrieval);
  host.data.resize(static_cast<size_t>(numElements(host.shape)));
  std::span<float> out(host.data);
  if (retrieval == RetrievalMode::AllReplicas && grouping.groupSize() > 1) {
    for (int64_t r = 0; r < program().replicas.globalReplicas; ++r) {
      groupValue(grouping.groupAt(r), out.subspan(static_cast<size_t>(r) * n, n));
    }
  } else {
    for (int64_t group = 0; group < grouping.numGroups(); ++group) {
      groupValue(group, out.subspan(static_cast<size_t>(group) * n, n));
    }
  }
  return host;
}

std::vector<std::pair<std::string, HostTensor>> SessionRuntime::readVariables(TensorCategory category) const {
  std::vector<std::pair<std::string, HostTensor>> out;
  const Graph& g = program().graph;
  for (const OpNode& op : g.ops()) {
    if (op.kind != OpKind::Variable) continue;
    const TensorNode& node = g.tensor(op.outputs.front());
    if (node.category != category) continue;
    out.emplace_back(node.name, readVariable(node.name, RetrievalMode::OnePerGroup));
  }
  return out;
}

}  // namespace tessera::detail
