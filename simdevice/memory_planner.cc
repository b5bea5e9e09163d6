#include "memory_planner.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <limits>
#include <optional>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "device_spec_json.hpp"
#include "layouts.hpp"
#include "time_model.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/shard_layout.hpp"

namespace tessera {
namespace sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

constexpr std::array kChipSpaces = {MemorySpace::ComputeTiles, MemorySpace::IOTiles};

std::size_t chipIndex(MemorySpace space) { return space == MemorySpace::IOTiles ? 1 : 0; }

// Which shard of a sharded tensor each replica holds.
struct ShardSource {
  int64_t shards = 0;                       // 0: not known (yet)
  const TensorNode* variable = nullptr;     // a sharded variable: its own rule
  std::optional<ReplicaGrouping> grouping;  // a collective's groups: the index in the group

  int64_t shardAt(int64_t replicationFactor, int64_t replica) const {
    int64_t index = replica;
    if (variable != nullptr) {
      index = shardIndexAt(*variable, replicationFactor, replica);
    } else if (grouping) {
      index = grouping->indexInGroupAt(replica);
    }
    return index % shards;
  }
};

// An input whose first axis is the micro-batch: more than one of them, and
// read only by slices (one per micro-batch).
bool streamedByMicroBatch(const Graph& graph, const TensorNode& input) {
  if (input.shape.size() < 2 || input.shape.front() < 2 || input.consumers.empty()) return false;
  return std::all_of(input.consumers.begin(), input.consumers.end(),
                     [&graph](OpId consumer) { return graph.op(consumer).kind == OpKind::Slice; });
}

// When nothing says how a value was sharded: the smallest shard count that
// gives its shard length, shard r mod k on replica r.
ShardSource fallbackSource(int64_t elements, int64_t shardElements) {
  ShardSource source;
  source.shards =
      shardElements > 0 ? std::max<int64_t>(1, (elements + shardElements - 1) / shardElements) : 1;
  return source;
}

// The shard source of every sharded tensor (indexed by tensor id) and of
// every remote buffer holding shards.
struct ShardSources {
  std::vector<ShardSource> tensors;
  std::vector<ShardSource> buffers;
};

ShardSources traceShards(const Graph& graph, std::span<const OpId> schedule) {
  const int64_t replicas = graph.replicationFactor();
  ShardSources s;
  s.tensors.resize(graph.tensors().size());
  s.buffers.resize(graph.remoteBuffers().size());
  auto bufferSource = [&](int64_t buffer) -> ShardSource* {
    return buffer >= 0 && at(buffer) < s.buffers.size() ? &s.buffers[at(buffer)] : nullptr;
  };
  for (const TensorNode& node : graph.tensors()) {
    ShardSource* buffer = bufferSource(node.remoteBuffer);
    if (buffer != nullptr && buffer->shards == 0 && !node.metaShape.empty()) {
      *buffer = {node.shardCount, &node, std::nullopt};
    }
  }
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.kind == OpKind::RemoteStore) {
      ShardSource* buffer = bufferSource(op.attributes.remoteBuffer);
      const ShardSource& in = s.tensors[at(op.inputs[0])];
      if (buffer != nullptr && buffer->shards == 0 && in.shards > 0) *buffer = in;
      continue;
    }
    for (TensorId out : op.outputs) {
      const TensorNode& node = graph.tensor(out);
      if (node.metaShape.empty()) continue;
      ShardSource& source = s.tensors[at(out)];
      if (op.kind == OpKind::Variable) {
        source = {node.shardCount, &node, std::nullopt};
      } else if (op.kind == OpKind::ReplicatedReduceScatter || op.kind == OpKind::ReplicaShardedSlice) {
        const ReplicaGrouping g = op.attributes.grouping.value_or(ReplicaGrouping(replicas));
        source = {g.groupSize(), nullptr, g};
      } else if (op.kind == OpKind::RemoteLoad) {
        const ShardSource* buffer = bufferSource(op.attributes.remoteBuffer);
        if (buffer != nullptr) source = *buffer;
      } else {
        // Elementwise ops, copies and updates keep their operand's shards.
        for (TensorId in : op.inputs) {
          const TensorNode& operand = graph.tensor(in);
          if (operand.metaShape == node.metaShape && operand.shape == node.shape &&
              s.tensors[at(in)].shards > 0) {
            source = s.tensors[at(in)];
            break;
          }
        }
      }
      if (source.shards == 0) source = fallbackSource(numElements(node.metaShape), numElements(node.shape));
    }
  }
  for (std::size_t b = 0; b < s.buffers.size(); ++b) {
    const RemoteBufferInfo& info = graph.remoteBuffers()[b];
    if (s.buffers[b].shards == 0 && !info.metaShape.empty())
      s.buffers[b] = fallbackSource(numElements(info.metaShape), numElements(info.shape));
  }
  return s;
}

// A tensor or buffer the planner counts, with what it needs to compute each
// replica's padding.
struct Held {
  TensorMemory memory;
  ShardSource source;
  int64_t slots = 0;         // elements per entry
  int64_t metaElements = 0;  // elements of the full tensor
  int64_t entries = 1;
  int64_t bytesPerElement = 4;  // dtypeBytes: float16 2, float32 and int32 4
};

void setSharding(Held& held, const ShardSource& source, const Shape& metaShape) {
  if (metaShape.empty() || source.shards < 1) return;
  held.source = source;
  held.metaElements = numElements(metaShape);
  held.memory.sharded = true;
  held.memory.shards = source.shards;
  held.memory.paddingBytes =
      ShardLayout(held.metaElements, source.shards).padding() * held.bytesPerElement * held.entries;
}

// Padding slots replica `replica` holds in `held`.
int64_t replicaPadding(const Held& held, int64_t replicationFactor, int64_t replica) {
  if (!held.memory.sharded) return 0;
  const ShardLayout layout(held.metaElements, held.source.shards);
  const int64_t real = layout.realElements(held.source.shardAt(replicationFactor, replica));
  return std::max<int64_t>(0, held.slots - real) * held.bytesPerElement * held.entries;
}

// "remote buffer #2 (W0, W0/momentum)": the variables kept in it and the
// tensors stored into it.
std::string bufferName(int64_t buffer, const std::vector<std::string>& contents) {
  std::string name = fmt::format("remote buffer #{}", buffer);
  if (contents.empty()) return name;
  constexpr std::size_t kNamed = 3;
  const std::size_t named = std::min(contents.size(), kNamed);
  name += fmt::format(
      " ({}", fmt::join(contents.begin(), contents.begin() + static_cast<std::ptrdiff_t>(named), ", "));
  if (contents.size() > named) name += fmt::format(" and {} more", contents.size() - named);
  return name + ")";
}

std::vector<Held> heldTensors(const Graph& graph, std::span<const OpId> schedule,
                              const ShardSources& shards) {
  const auto steps = static_cast<int64_t>(schedule.size());
  const int64_t lastStep = std::max<int64_t>(0, steps - 1);
  const std::size_t tensorCount = graph.tensors().size();
  std::vector<int64_t> first(tensorCount, -1);
  std::vector<int64_t> last(tensorCount, -1);
  for (int64_t pos = 0; pos < steps; ++pos) {
    const OpNode& op = graph.op(schedule[at(pos)]);
    auto touch = [&](TensorId t) {
      const auto s = at(graph.storageOf(t));
      if (first[s] < 0) first[s] = pos;
      last[s] = std::max(last[s], pos);
    };
    for (TensorId t : op.inputs) touch(t);
    for (TensorId t : op.outputs) touch(t);
  }
  // Phased execution: a load through the IO tiles runs beside the compute
  // as soon as the ops it is scheduled after are done (its category's IO
  // schedule: Preload during the previous phase, OnDemand once it is over;
  // and after the last store into its buffer), not at its place in the
  // order, so the IO tiles hold what it loads from there. A load through
  // the compute tiles hides nothing and is held from its place; so is a
  // load with no such op.
  std::vector<int64_t> position(graph.ops().size(), -1);
  for (int64_t pos = 0; pos < steps; ++pos) position[at(schedule[at(pos)])] = pos;
  for (int64_t pos = 0; pos < steps; ++pos) {
    const OpNode& op = graph.op(schedule[at(pos)]);
    if (op.kind != OpKind::RemoteLoad || op.executionPhase == kNoExecutionPhase || op.after.empty() ||
        graph.tensor(op.outputs[0]).tileSet != TileSet::IO) {
      continue;
    }
    int64_t from = 0;
    for (OpId before : op.after) from = std::max(from, position[at(before)] + 1);
    for (TensorId t : op.outputs) {
      const auto s = at(graph.storageOf(t));
      if (first[s] >= 0) first[s] = std::min(first[s], from);
    }
  }

  std::vector<Held> held;
  held.reserve(tensorCount);
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    for (TensorId out : op.outputs) {
      const TensorNode& node = graph.tensor(out);
      if (graph.storageOf(out) != out || first[at(out)] < 0) continue;
      const bool variable = op.kind == OpKind::Variable;
      if (variable && node.remoteBuffer >= 0) continue;  // counted with its buffer
      Held h;
      h.slots = numElements(node.shape);
      // An input of several micro-batches (gradient accumulation) is read
      // one micro-batch at a time, each into the slice that holds it; as
      // PopART's host-to-device streams do, the device holds one micro-batch
      // of it, not all of them.
      if (op.kind == OpKind::Input && streamedByMicroBatch(graph, node)) h.slots /= node.shape.front();
      h.bytesPerElement = dtypeBytes(node.dtype);
      TensorMemory& m = h.memory;
      m.name = node.name;
      m.category = node.category;
      m.space = node.tileSet == TileSet::IO ? MemorySpace::IOTiles : MemorySpace::ComputeTiles;
      m.bytes = h.slots * h.bytesPerElement;
      m.resident = variable;
      m.firstUse = variable ? 0 : first[at(out)];
      m.lastUse = variable ? lastStep : last[at(out)];
      setSharding(h, shards.tensors[at(out)], node.metaShape);
      held.push_back(std::move(h));
    }
  }

  // Remote buffers: named and categorised after what they hold.
  const std::size_t bufferCount = graph.remoteBuffers().size();
  std::vector<std::vector<std::string>> contents(bufferCount);
  std::vector<std::optional<TensorCategory>> categories(bufferCount);
  auto addContent = [&](int64_t buffer, const TensorNode& node) {
    if (buffer < 0 || at(buffer) >= bufferCount) return;
    std::vector<std::string>& names = contents[at(buffer)];
    if (std::find(names.begin(), names.end(), node.name) == names.end()) names.push_back(node.name);
    if (!categories[at(buffer)]) categories[at(buffer)] = node.category;
  };
  for (const TensorNode& node : graph.tensors()) addContent(node.remoteBuffer, node);
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.kind == OpKind::RemoteStore) {
      addContent(op.attributes.remoteBuffer, graph.tensor(graph.storageOf(op.inputs[0])));
    }
  }
  for (std::size_t b = 0; b < bufferCount; ++b) {
    const RemoteBufferInfo& info = graph.remoteBuffers()[b];
    Held h;
    h.slots = numElements(info.shape);
    h.entries = info.entries;
    h.bytesPerElement = dtypeBytes(info.dtype);
    TensorMemory& m = h.memory;
    m.name = bufferName(static_cast<int64_t>(b), contents[b]);
    m.category = categories[b].value_or(TensorCategory::Activation);
    m.space = MemorySpace::Streaming;
    m.bytes = info.entries * h.slots * h.bytesPerElement;
    m.resident = true;
    m.firstUse = 0;
    m.lastUse = lastStep;
    m.remoteBuffer = static_cast<int64_t>(b);
    setSharding(h, shards.buffers[b], info.metaShape);
    held.push_back(std::move(h));
  }
  return held;
}

// The peak of one on-chip space: when it is first reached and how many bytes.
struct PeakAt {
  int64_t bytes = 0;
  int64_t position = -1;  // -1: only resident bytes
};

PeakAt chipPeak(const std::vector<Held>& held, MemorySpace space, int64_t steps) {
  int64_t resident = 0;
  std::vector<int64_t> delta(at(steps) + 1, 0);
  for (const Held& h : held) {
    const TensorMemory& m = h.memory;
    if (m.space != space) continue;
    if (m.resident) {
      resident += m.bytes;
    } else {
      delta[at(m.firstUse)] += m.bytes;
      delta[at(m.lastUse) + 1] -= m.bytes;
    }
  }
  // Resident bytes alone are the peak at no op in particular.
  PeakAt peak{resident, -1};
  int64_t live = resident;
  for (int64_t p = 0; p < steps; ++p) {
    live += delta[at(p)];
    if (live > peak.bytes) peak = {live, p};
  }
  return peak;
}

bool liveAt(const TensorMemory& m, int64_t position) {
  return m.resident || (m.firstUse <= position && position <= m.lastUse);
}

MemoryPeak describePeak(const Graph& graph, std::span<const OpId> schedule, const std::vector<Held>& held,
                        MemorySpace space, const PeakAt& where, std::vector<CategoryMemory>& byCategory) {
  MemoryPeak peak;
  peak.bytes = where.bytes;
  if (where.position >= 0 && space != MemorySpace::Streaming)
    peak.op = graph.op(schedule[at(where.position)]).name;
  std::vector<const TensorMemory*> live;
  for (const Held& h : held) {
    const TensorMemory& m = h.memory;
    if (m.space != space || (space != MemorySpace::Streaming && !liveAt(m, where.position))) continue;
    live.push_back(&m);
    for (CategoryMemory& c : byCategory) {
      if (c.category != m.category) continue;
      if (space == MemorySpace::ComputeTiles) c.computeTilesBytes += m.bytes;
      if (space == MemorySpace::IOTiles) c.ioTilesBytes += m.bytes;
      if (space == MemorySpace::Streaming) c.streamingBytes += m.bytes;
    }
  }
  const std::size_t count = std::min(live.size(), kLargestAtPeak);
  std::partial_sort(live.begin(), live.begin() + static_cast<std::ptrdiff_t>(count), live.end(),
                    [](const TensorMemory* a, const TensorMemory* b) {
                      return a->bytes != b->bytes ? a->bytes > b->bytes : a->name < b->name;
                    });
  for (std::size_t i = 0; i < count; ++i) peak.largest.push_back(*live[i]);
  return peak;
}

void checkProgram(const Program& program, const DeviceSpec& spec) {
  assert(program.replicas.consistent());  // derived and checked where the program was made
  if (program.numIOTiles < 0 || program.numIOTiles >= spec.tilesPerIpu) {
    throw DeviceError(ErrorCode::InvalidProgram, "Program.numIOTiles",
                      fmt::format("numIOTiles is {}; a device with tilesPerIpu {} needs it in [0, {})",
                                  program.numIOTiles, spec.tilesPerIpu, spec.tilesPerIpu));
  }
}

// "512 B", "1.5 KiB", "897.2 MiB".
std::string humanBytes(int64_t bytes) {
  constexpr std::array kUnits = {"KiB", "MiB", "GiB", "TiB", "PiB", "EiB"};
  if (bytes < 1024) return fmt::format("{} B", bytes);
  auto value = static_cast<double>(bytes) / 1024.0;
  std::size_t unit = 0;
  while (value >= 1024.0 && unit + 1 < kUnits.size()) {
    value /= 1024.0;
    ++unit;
  }
  return fmt::format("{:.1f} {}", value, kUnits[unit]);
}

// One IPU's plan from the tensors and buffers it holds: the same for every
// replica but for the padding of its shards.
ReplicaMemory planHeld(const Graph& graph, std::span<const OpId> schedule, const std::vector<Held>& held) {
  const auto steps = static_cast<int64_t>(schedule.size());
  ReplicaMemory common;
  for (const auto& [category, name] : EnumNames<TensorCategory>::kNames)
    common.byCategory.push_back({category});
  std::array<PeakAt, 2> peaks{};
  for (MemorySpace space : kChipSpaces) peaks[chipIndex(space)] = chipPeak(held, space, steps);
  common.computeTilesPeak =
      describePeak(graph, schedule, held, MemorySpace::ComputeTiles, peaks[0], common.byCategory);
  common.ioTilesPeak = describePeak(graph, schedule, held, MemorySpace::IOTiles, peaks[1], common.byCategory);
  int64_t streaming = 0;
  std::vector<int64_t> activationDelta(at(steps) + 1, 0);
  common.resident = std::vector<CategoryMemory>(common.byCategory.size());
  for (std::size_t c = 0; c < common.resident.size(); ++c)
    common.resident[c].category = common.byCategory[c].category;
  for (const Held& h : held) {
    const TensorMemory& m = h.memory;
    if (m.resident) {
      for (CategoryMemory& c : common.resident) {
        if (c.category != m.category) continue;
        if (m.space == MemorySpace::ComputeTiles) c.computeTilesBytes += m.bytes;
        if (m.space == MemorySpace::IOTiles) c.ioTilesBytes += m.bytes;
        if (m.space == MemorySpace::Streaming) c.streamingBytes += m.bytes;
      }
    }
    if (m.space == MemorySpace::Streaming) {
      streaming += m.bytes;
    } else if (m.resident) {
      common.variableBytes += m.bytes;
    } else {
      activationDelta[at(m.firstUse)] += m.bytes;
      activationDelta[at(m.lastUse) + 1] -= m.bytes;
    }
  }
  common.streamingPeak =
      describePeak(graph, schedule, held, MemorySpace::Streaming, PeakAt{streaming, -1}, common.byCategory);
  int64_t live = 0;
  for (int64_t d : activationDelta) {
    live += d;
    common.peakActivationBytes = std::max(common.peakActivationBytes, live);
  }
  common.computeTilesBytes = common.computeTilesPeak.bytes;
  common.ioTilesBytes = common.ioTilesPeak.bytes;
  common.streamingBytes = streaming;
  common.remoteBufferBytes = streaming;
  return common;
}

// The IPU of every tensor that owns storage and every remote buffer: the
// IPU of the op that produces the tensor, of the first op that loads or
// stores into the buffer.
void placeOnIpus(const Graph& graph, std::span<const OpId> schedule, std::vector<Held>& held, int64_t ipus) {
  if (ipus == 1) return;
  std::vector<int64_t> bufferIpu(graph.remoteBuffers().size(), -1);
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.kind != OpKind::RemoteLoad && op.kind != OpKind::RemoteStore) continue;
    const auto buffer = at(op.attributes.remoteBuffer);
    if (buffer < bufferIpu.size() && bufferIpu[buffer] < 0) bufferIpu[buffer] = std::max<int64_t>(0, op.virtualGraph);
  }
  for (Held& h : held) {
    TensorMemory& m = h.memory;
    if (m.remoteBuffer >= 0) {
      m.ipu = std::max<int64_t>(0, bufferIpu[at(m.remoteBuffer)]);
    } else {
      const OpId producer = graph.tensor(graph.find(m.name)).producer;
      m.ipu = producer == kNoOp ? 0 : std::max<int64_t>(0, graph.op(producer).virtualGraph);
    }
  }
}

void checkVirtualGraphs(const Graph& graph, const DeviceSpec& spec) {
  for (const OpNode& op : graph.ops()) {
    if (op.virtualGraph < spec.ipusPerReplica) continue;
    throw DeviceError(ErrorCode::InvalidProgram, op.name,
                      fmt::format("op {} ({}) runs on IPU {}, but a replica of this device has {} IPU{} "
                                  "(DeviceSpec ipusPerReplica)",
                                  op.name, op.kind, op.virtualGraph, spec.ipusPerReplica,
                                  spec.ipusPerReplica == 1 ? "" : "s"));
  }
}

// Pipelining: each IPU's stashes (ReplicaMemory::stashBytes), counted on
// micro-batch 0 (every micro-batch has the same shapes).
std::vector<int64_t> stashBytes(const Graph& graph, int64_t ipus) {
  std::vector<int64_t> bytes(at(ipus), 0);
  for (std::size_t i = 0; i < graph.tensors().size(); ++i) {
    const TensorNode& t = graph.tensors()[i];
    if (t.producer == kNoOp) continue;
    const OpNode& producer = graph.op(t.producer);
    if (producer.microBatch != 0 || producer.pipelineStage == kNoPipelineStage) continue;
    if (graph.storageOf(static_cast<TensorId>(i)) != static_cast<TensorId>(i)) continue;
    const int64_t ipu = std::clamp<int64_t>(producer.virtualGraph, 0, ipus - 1);
    int64_t first = producer.kind == OpKind::IpuCopy ? std::numeric_limits<int64_t>::max() : producer.pipelineStage;
    int64_t last = kNoPipelineStage;
    for (OpId c : t.consumers) {
      const OpNode& consumer = graph.op(c);
      if (consumer.kind == OpKind::IpuCopy || consumer.pipelineStage == kNoPipelineStage ||
          std::clamp<int64_t>(consumer.virtualGraph, 0, ipus - 1) != ipu)
        continue;
      if (producer.kind == OpKind::IpuCopy) first = std::min(first, consumer.pipelineStage);
      last = std::max(last, consumer.pipelineStage);
    }
    if (last == kNoPipelineStage || last <= first) continue;
    bytes[at(ipu)] += (last - first + 1) * numElements(t.shape) * dtypeBytes(t.dtype);
  }
  return bytes;
}

}  // namespace

MemoryReport planMemory(const Program& program, std::span<const OpId> schedule, const DeviceSpec& spec) {
  checkProgram(program, spec);
  const Graph& graph = program.graph;
  checkVirtualGraphs(graph, spec);
  const TileMemory tiles = tileMemory(spec, program.numIOTiles);
  MemoryReport report;
  report.ipusPerReplica = spec.ipusPerReplica;
  report.computeTilesCapacity = tiles.computeTileBytes;
  report.ioTilesCapacity = tiles.ioTileBytes;
  report.streamingCapacity = spec.streamingMemoryBytes;
  std::vector<Held> held = heldTensors(graph, schedule, traceShards(graph, schedule));
  placeOnIpus(graph, schedule, held, spec.ipusPerReplica);
  // The in-flight buffers of the host streams on the IO tiles of their IPUs,
  // live all step.
  checkHostStreams(program, spec);
  for (const HostStream& s : program.hostStreams) {
    if (s.tileSet != TileSet::IO || schedule.empty()) continue;
    const int64_t buffers = inFlightBuffers(appliedStrategy(s, program.batchesPerStep));
    Held h;
    h.memory.name = fmt::format("host stream {} ({} in-flight buffer{})", s.name, buffers, buffers > 1 ? "s" : "");
    h.memory.category = TensorCategory::Activation;
    h.memory.space = MemorySpace::IOTiles;
    h.memory.bytes = buffers * s.bytesPerTransfer;
    h.memory.firstUse = 0;
    h.memory.lastUse = std::max<int64_t>(static_cast<int64_t>(schedule.size()) - 1, 0);
    h.memory.ipu = s.ipu;
    held.push_back(std::move(h));
  }
  // Liveness does not depend on the replica: plan each IPU once, copy it to
  // each replica.
  std::vector<ReplicaMemory> perIpu;
  std::vector<std::vector<const Held*>> paddedOn(at(spec.ipusPerReplica));
  for (int64_t ipu = 0; ipu < spec.ipusPerReplica; ++ipu) {
    if (spec.ipusPerReplica == 1) {
      perIpu.push_back(planHeld(graph, schedule, held));
    } else {
      std::vector<Held> mine;
      for (const Held& h : held)
        if (h.memory.ipu == ipu) mine.push_back(h);
      perIpu.push_back(planHeld(graph, schedule, mine));
    }
    perIpu.back().ipu = ipu;
  }
  const std::vector<int64_t> stashes = stashBytes(graph, spec.ipusPerReplica);
  for (int64_t ipu = 0; ipu < spec.ipusPerReplica; ++ipu) {
    ReplicaMemory& m = perIpu[at(ipu)];
    m.stashBytes = stashes[at(ipu)];
    m.computeTilesBytes += m.stashBytes;
    m.computeTilesPeak.bytes += m.stashBytes;
    m.peakActivationBytes += m.stashBytes;
  }
  // Only shards of a full copy with padding pad some replica; the rest
  // (n a multiple of k) hold no padding anywhere, and looking them up per
  // replica would make the plan's cost grow as tensors x replicas.
  for (const Held& h : held)
    if (h.memory.sharded && h.memory.paddingBytes > 0) paddedOn[at(h.memory.ipu)].push_back(&h);
  const int64_t replicationFactor = graph.replicationFactor();
  for (int64_t r = 0; r < program.replicas.localReplicas; ++r) {
    for (int64_t ipu = 0; ipu < spec.ipusPerReplica; ++ipu) {
      ReplicaMemory m = perIpu[at(ipu)];
      m.replica = program.replicas.replicaOffset + r;
      for (const Held* h : paddedOn[at(ipu)]) m.paddingBytes += replicaPadding(*h, replicationFactor, m.replica);
      report.paddingBytes += m.paddingBytes;
      report.perReplica.push_back(std::move(m));
    }
  }
  report.tensors.reserve(held.size());
  for (Held& h : held) report.tensors.push_back(std::move(h.memory));
  return report;
}

void requireFits(const MemoryReport& report) {
  const std::optional<MemoryShortfall> shortfall = findShortfall(report);
  if (!shortfall) return;
  const auto replica = std::find_if(report.perReplica.begin(), report.perReplica.end(), [&](const ReplicaMemory& m) {
    return m.replica == shortfall->replica && m.ipu == shortfall->ipu;
  });
  const MemoryPeak& peak = replica->peak(shortfall->space);
  const std::string where = report.ipusPerReplica > 1
                                ? fmt::format("replica {}, IPU {}, {}", shortfall->replica, shortfall->ipu,
                                              spaceLabel(shortfall->space))
                                : fmt::format("replica {}, {}", shortfall->replica, spaceLabel(shortfall->space));
  std::vector<std::string> largest;
  for (const TensorMemory& t : peak.largest)
    largest.push_back(fmt::format("{} ({}, {} bytes)", t.name, t.category, t.bytes));
  throw DeviceError(
      ErrorCode::OutOfMemory, where,
      fmt::format("needs {} bytes ({}){} but has {} bytes ({}); largest tensors at the peak: {}",
                  shortfall->neededBytes, humanBytes(shortfall->neededBytes),
                  peak.op.empty() ? std::string() : fmt::format(" while op \"{}\" runs", peak.op),
                  shortfall->availableBytes, humanBytes(shortfall->availableBytes),
                  fmt::join(largest, ", ")));
}

namespace {

int64_t saturatedProduct(std::initializer_list<int64_t> factors) {
  int64_t result = 1;
  for (const int64_t factor : factors) {
    if (__builtin_mul_overflow(result, factor, &result)) return std::numeric_limits<int64_t>::max();
  }
  return result;
}

int64_t saturatedSum(int64_t a, int64_t b) {
  int64_t sum = 0;
  return __builtin_add_overflow(a, b, &sum) ? std::numeric_limits<int64_t>::max() : sum;
}

}  // namespace

HostMemoryEstimate estimateHostMemory(const Program& program) {
  constexpr int64_t kSlotBytes = sizeof(float);
  const Graph& graph = program.graph;
  const std::vector<OpId> schedule = graph.schedule();
  const ReplicaTopology& topology = program.replicas;
  std::vector<ReplicaGrouping> buffers;
  const std::vector<ReplicaGrouping> layouts =
      inferLayouts(graph, schedule, topology, ExecutionMode::Vectorized, &buffers);
  HostMemoryEstimate estimate;
  std::vector<HostBuffer> all;
  const auto add = [&](HostBuffer buffer) {
    estimate.bytes = saturatedSum(estimate.bytes, buffer.bytes);
    int64_t& category = estimate.byCategory[static_cast<std::size_t>(buffer.category)];
    category = saturatedSum(category, buffer.bytes);
    all.push_back(std::move(buffer));
  };
  for (std::size_t t = 0; t < graph.tensors().size(); ++t) {
    const auto id = static_cast<TensorId>(t);
    if (graph.storageOf(id) != id) continue;
    const TensorNode& node = graph.tensors()[t];
    add({node.name, node.category,
         saturatedProduct(
             {layouts[t].numGroups(), numElements(node.shape), dtypeSlots(node.dtype), kSlotBytes})});
  }
  // A remote buffer is named after (and counted as) a variable it holds.
  std::vector<const TensorNode*> holders(graph.remoteBuffers().size(), nullptr);
  for (const TensorNode& node : graph.tensors()) {
    if (node.remoteBuffer < 0 || static_cast<std::size_t>(node.remoteBuffer) >= holders.size()) continue;
    if (holders[static_cast<std::size_t>(node.remoteBuffer)] == nullptr)
      holders[static_cast<std::size_t>(node.remoteBuffer)] = &node;
  }
  for (std::size_t b = 0; b < holders.size(); ++b) {
    const RemoteBufferInfo& info = graph.remoteBuffers()[b];
    const int64_t bytes =
        saturatedProduct({info.entries, program.replicas.localReplicas, numElements(info.shape), kSlotBytes});
    estimate.remoteBytes = saturatedSum(estimate.remoteBytes, bytes);
    const TensorNode* holder = holders[b];
    add({holder != nullptr ? fmt::format("{} (remote buffer)", holder->name)
                           : fmt::format("remote buffer {}", b),
         holder != nullptr ? holder->category : TensorCategory::OptimizerState, bytes});
  }
  // Largest first; of equal sizes, the first made (a weight before its gradient and state).
  std::stable_sort(all.begin(), all.end(),
                   [](const HostBuffer& a, const HostBuffer& b) { return a.bytes > b.bytes; });
  all.resize(std::min(all.size(), kLargestAtPeak));
  estimate.largest = std::move(all);
  return estimate;
}

}  // namespace sim

std::string_view spaceLabel(MemorySpace space) {
  switch (space) {
    case MemorySpace::ComputeTiles: return "compute tiles";
    case MemorySpace::IOTiles: return "IO tiles";
    case MemorySpace::Streaming: return "streaming memory";
  }
  return "memory";
}

int64_t CategoryMemory::bytesIn(MemorySpace space) const {
  switch (space) {
    case MemorySpace::ComputeTiles: return computeTilesBytes;
    case MemorySpace::IOTiles: return ioTilesBytes;
    case MemorySpace::Streaming: break;
  }
  return streamingBytes;
}

const MemoryPeak& ReplicaMemory::peak(MemorySpace space) const {
  switch (space) {
    case MemorySpace::ComputeTiles: return computeTilesPeak;
    case MemorySpace::IOTiles: return ioTilesPeak;
    case MemorySpace::Streaming: break;
  }
  return streamingPeak;
}

MemoryReport planMemory(const Program& program, const DeviceSpec& spec) {
  return sim::planMemory(program, program.graph.schedule(), spec);
}

std::optional<MemoryShortfall> findShortfall(const MemoryReport& report) {
  for (const ReplicaMemory& m : report.perReplica) {
    const std::array<MemoryShortfall, 3> spaces = {
        MemoryShortfall{m.replica, m.ipu, MemorySpace::ComputeTiles, m.computeTilesBytes,
                        report.computeTilesCapacity},
        MemoryShortfall{m.replica, m.ipu, MemorySpace::IOTiles, m.ioTilesBytes, report.ioTilesCapacity},
        MemoryShortfall{m.replica, m.ipu, MemorySpace::Streaming, m.streamingBytes, report.streamingCapacity}};
    for (const MemoryShortfall& s : spaces)
      if (s.neededBytes > s.availableBytes) return s;
  }
  return std::nullopt;
}

}  // namespace tessera
