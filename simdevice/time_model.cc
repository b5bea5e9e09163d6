#include "time_model.hpp"

#include <algorithm>
#include <array>
#include <cassert>
#include <map>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "memory_planner.hpp"
#include "op_def.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"

namespace tessera {
namespace sim {
namespace {

std::size_t at(int64_t i) { return static_cast<std::size_t>(i); }

bool onIOTiles(const Graph& graph, TensorId t) {
  return graph.tensor(t).tileSet == TileSet::IO || graph.tensor(graph.storageOf(t)).tileSet == TileSet::IO;
}

// Whether a group holds replicas of two instances (of `localReplicas`
// consecutive replicas each). Checked once per collective, so its cost must
// not grow with the replica count where it need not: one instance holds every
// group, and a group's members increase (by its stride), so it spans
// instances exactly when its first and last members do.
bool spansInstances(const ReplicaGrouping& grouping, int64_t localReplicas) {
  if (localReplicas >= grouping.numReplicas() || grouping.groupSize() == 1) return false;
  const int64_t last = grouping.groupSize() - 1;
  for (int64_t group = 0; group < grouping.numGroups(); ++group)
    if (grouping.replicaAt(group, 0) / localReplicas != grouping.replicaAt(group, last) / localReplicas)
      return true;
  return false;
}

// What an op costs and where it runs, before it is placed in time.
struct Work {
  TimeLane lane = TimeLane::ComputeTiles;
  bool throughIOTiles = false;
  double seconds = 0.0;
  double flops = 0.0;
  double bytes = 0.0;
  std::string group;
  bool interInstance = false;
};

// A collective that moves data: its bytes over the link of its group (the
// links between instances when the group spans them).
Work collectiveWork(const Graph& graph, const OpNode& op, const OpCost& cost, const ReplicaTopology& topology,
                    const DeviceSpec& spec) {
  Work w;
  w.lane = TimeLane::Link;
  const ReplicaGrouping grouping =
      op.attributes.grouping.value_or(ReplicaGrouping(graph.replicationFactor()));
  w.group = grouping.str();
  w.throughIOTiles = onIOTiles(graph, op.inputs[0]) || onIOTiles(graph, op.outputs[0]);
  if (grouping.groupSize() == 1) return w;
  w.interInstance = spansInstances(grouping, topology.localReplicas);
  w.bytes = cost.linkBytes;
  const double bandwidth =
      w.interInstance ? spec.interInstanceBandwidthBytesPerSecond : spec.linkBandwidthBytesPerSecond;
  w.seconds = spec.transferLatencySeconds + w.bytes / bandwidth;
  return w;
}

// The IPU an op runs on: IPU 0 when it names none. The device refuses a
// program naming an IPU the replica does not have (checkVirtualGraphs).
int64_t ipuOf(const OpNode& op, int64_t ipus) {
  return op.virtualGraph >= 0 && op.virtualGraph < ipus ? op.virtualGraph : 0;
}

Work opWork(const Graph& graph, const OpNode& op, const OpDef& def, const ReplicaTopology& topology,
            const DeviceSpec& spec) {
  const OpCost cost = def.cost != nullptr ? def.cost(graph, op) : OpCost{};
  Work w;
  switch (def.work) {
    case OpWork::Collective: return collectiveWork(graph, op, cost, topology, spec);
    case OpWork::Streaming: {
      const TensorId moved = op.outputs.empty() ? op.inputs[0] : op.outputs[0];
      w.throughIOTiles = onIOTiles(graph, moved);
      w.lane = w.throughIOTiles ? TimeLane::IOTiles : TimeLane::Streaming;
      w.bytes = cost.streamedBytes;
      w.seconds = spec.transferLatencySeconds + w.bytes / spec.streamingBandwidthBytesPerSecond;
      return w;
    }
    case OpWork::InterIpu:
      w.lane = TimeLane::IpuLink;
      w.bytes = cost.ipuLinkBytes;
      w.seconds = spec.interIpuLatencySeconds + w.bytes / spec.interIpuBandwidthBytesPerSecond;
      return w;
    case OpWork::None:
    case OpWork::Compute: break;
  }
  w.flops = cost.flops;
  w.seconds = w.flops / spec.computeFlopsPerSecond;
  return w;
}

// A pipelined program's order: the ops that need no micro-batch, then cycle
// by cycle (an IpuCopy after the cycle's other ops), then the ops that
// depend on a micro-batch but belong to none. `cycleOf` gets each op's
// cycle (-1 before, `cycles` after). Empty when the program is not pipelined.
std::vector<OpId> pipelineOrder(const Graph& graph, std::span<const OpId> schedule, std::vector<int64_t>& cycleOf,
                                PipelineTime& pipeline) {
  int64_t stages = 0;
  int64_t microBatches = 0;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.microBatch == kNoMicroBatch || op.pipelineStage == kNoPipelineStage) continue;
    stages = std::max(stages, op.pipelineStage + 1);
    microBatches = std::max(microBatches, op.microBatch + 1);
  }
  if (stages < 2 || microBatches < 1) return {};
  pipeline.enabled = true;
  pipeline.stages = stages;
  pipeline.forwardStages = (stages + 1) / 2;
  pipeline.microBatches = microBatches;
  pipeline.cycles = microBatches + stages - 1;
  const int64_t cycles = pipeline.cycles;
  cycleOf.assign(graph.ops().size(), -1);
  std::vector<bool> after(graph.ops().size(), false);  // depends on a micro-batch
  std::vector<std::vector<OpId>> byCycle(at(cycles));
  std::vector<std::vector<OpId>> copies(at(cycles));
  std::vector<OpId> before;
  std::vector<OpId> last;
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    if (op.microBatch != kNoMicroBatch && op.pipelineStage != kNoPipelineStage) {
      const int64_t cycle = op.microBatch + op.pipelineStage;
      cycleOf[at(id)] = cycle;
      after[at(id)] = true;
      (op.kind == OpKind::IpuCopy ? copies : byCycle)[at(cycle)].push_back(id);
      continue;
    }
    bool late = false;
    for (TensorId t : op.inputs) {
      const OpId producer = graph.tensor(t).producer;
      late = late || (producer != kNoOp && after[at(producer)]);
    }
    for (OpId b : op.after) late = late || after[at(b)];
    after[at(id)] = late;
    cycleOf[at(id)] = late ? cycles : -1;
    (late ? last : before).push_back(id);
  }
  std::vector<OpId> order = std::move(before);
  for (int64_t c = 0; c < cycles; ++c) {
    order.insert(order.end(), byCycle[at(c)].begin(), byCycle[at(c)].end());
    order.insert(order.end(), copies[at(c)].begin(), copies[at(c)].end());
  }
  order.insert(order.end(), last.begin(), last.end());
  return order;
}

// Adds op's work to its execution phase's sums.
void addToPhase(std::vector<PhaseTime>& phases, const OpNode& op, const Work& w, int64_t ipu) {
  while (static_cast<int64_t>(phases.size()) <= op.executionPhase)
    phases.push_back({.phase = static_cast<int64_t>(phases.size())});
  PhaseTime& p = phases[at(op.executionPhase)];
  switch (w.lane) {
    case TimeLane::ComputeTiles:
      p.computeSeconds += w.seconds;
      p.ipu = ipu;
      break;
    case TimeLane::Streaming: p.streamingSeconds += w.seconds; break;
    case TimeLane::IOTiles: p.overlappedSeconds += w.seconds; break;
    case TimeLane::IpuLink: p.ipuCopyBytes += w.bytes; break;
    case TimeLane::Link:
    case TimeLane::HostIO: break;
  }
  if (op.kind == OpKind::RemoteLoad) p.loadBytes += w.bytes;
  if (op.kind == OpKind::RemoteStore) p.storeBytes += w.bytes;
}

}  // namespace

TimeReport modelTime(const Graph& graph, const ReplicaTopology& topology, std::span<const OpId> schedule,
                     const DeviceSpec& spec) {
  assert(topology.consistent());  // derived and checked where the program was made
  // When each resource is next free, in seconds from the start of the step;
  // tiles per IPU of the replica.
  const int64_t ipus = std::max<int64_t>(1, spec.ipusPerReplica);
  std::vector<double> computeTiles(at(ipus), 0.0);
  std::vector<double> ioTiles(at(ipus), 0.0);
  double streamingLink = 0.0;
  double ipuLinks = 0.0;
  std::map<std::string, double> links;
  std::vector<double> ready(graph.tensors().size(), 0.0);
  std::vector<double> done(graph.ops().size(), 0.0);

  TimeReport report;
  std::vector<int64_t> cycleOf;
  const std::vector<OpId> pipelined = pipelineOrder(graph, schedule, cycleOf, report.pipeline);
  PipelineTime& pipeline = report.pipeline;
  if (pipeline.enabled) {
    schedule = pipelined;
    pipeline.cycleEnds.assign(at(pipeline.cycles), 0.0);
    pipeline.stageSeconds.assign(at(pipeline.stages), 0.0);
    pipeline.startSeconds = -1.0;
  }
  double cycleStart = 0.0;  // when the cycle being placed may start
  int64_t currentCycle = -1;
  double busy = 0.0;        // compute of the cycles
  for (OpId id : schedule) {
    const OpNode& op = graph.op(id);
    const OpDef& def = opDef(op.kind);
    if (def.family == OpFamily::Source) continue;
    Work w = opWork(graph, op, def, topology, spec);
    const int64_t ipu = ipuOf(op, ipus);
    // The tiles it occupies and the link it uses, if any.
    std::array<double*, 3> resources{&computeTiles[at(ipu)], nullptr, nullptr};
    switch (w.lane) {
      case TimeLane::ComputeTiles:
      case TimeLane::HostIO: break;  // host transfers are added by addHostStreams
      case TimeLane::Streaming: resources[1] = &streamingLink; break;
      case TimeLane::IOTiles: resources = {&ioTiles[at(ipu)], &streamingLink, nullptr}; break;
      case TimeLane::Link:
        resources = {w.throughIOTiles ? &ioTiles[at(ipu)] : &computeTiles[at(ipu)], &links[w.group], nullptr};
        break;
      case TimeLane::IpuLink: {
        const int64_t from = ipuOf(graph.op(graph.tensor(op.inputs[0]).producer), ipus);
        resources = {&computeTiles[at(ipu)], &computeTiles[at(from)], &ipuLinks};
        if (from == ipu) resources[1] = nullptr;
        break;
      }
    }
    double start = 0.0;
    const int64_t cycle = pipeline.enabled ? cycleOf[at(id)] : -1;
    if (pipeline.enabled && cycle >= 0) {
      if (cycle != currentCycle) {
        // Every op of the earlier cycles has been placed.
        if (currentCycle >= 0 && currentCycle < pipeline.cycles) cycleStart = pipeline.cycleEnds[at(currentCycle)];
        currentCycle = cycle;
      }
      if (cycle < pipeline.cycles) start = cycleStart;
    }
    for (TensorId t : op.inputs) start = std::max(start, ready[at(t)]);
    for (OpId before : op.after) {
      // The accumulation run's order of one micro-batch after the other is
      // what pipelining undoes: only the order within a micro-batch holds.
      const int64_t m = graph.op(before).microBatch;
      if (pipeline.enabled && op.microBatch != kNoMicroBatch && m != kNoMicroBatch && m != op.microBatch) continue;
      start = std::max(start, done[at(before)]);
    }
    for (const double* free : resources)
      if (free != nullptr) start = std::max(start, *free);
    const double end = start + w.seconds;
    for (double* free : resources)
      if (free != nullptr) *free = end;
    done[at(id)] = end;
    for (TensorId t : op.outputs) ready[at(t)] = end;

    report.stepSeconds = std::max(report.stepSeconds, end);
    if (pipeline.enabled && cycle >= 0 && cycle < pipeline.cycles) {
      pipeline.cycleEnds[at(cycle)] = std::max(pipeline.cycleEnds[at(cycle)], end);
      if (pipeline.startSeconds < 0.0 || start < pipeline.startSeconds) pipeline.startSeconds = start;
      if (w.lane != TimeLane::IpuLink) {
        busy += w.seconds;
        pipeline.stageSeconds[at(op.pipelineStage)] += w.seconds;
      }
    }
    switch (w.lane) {
      case TimeLane::ComputeTiles: report.computeSeconds += w.seconds; break;
      case TimeLane::IOTiles: report.overlappedStreamingSeconds += w.seconds; break;
      case TimeLane::Link: report.collectiveSeconds += w.seconds; break;
      case TimeLane::Streaming: report.streamingSeconds += w.seconds; break;
      case TimeLane::IpuLink:
        report.ipuCopySeconds += w.seconds;
        report.ipuCopyBytes += w.bytes;
        ++report.ipuCopies;
        break;
      case TimeLane::HostIO: break;
    }
    report.flops += w.flops;
    if (w.lane == TimeLane::Link) {
      report.linkBytes += w.bytes;
    } else if (w.lane != TimeLane::IpuLink) {
      report.streamingBytes += w.bytes;
    }
    if (op.executionPhase != kNoExecutionPhase) addToPhase(report.phases, op, w, ipu);
    report.ops.push_back({op.name, op.kind, w.lane, std::move(w.group), w.interInstance, start, w.seconds,
                          w.flops, w.bytes, ipu, op.pipelineStage, op.microBatch, op.executionPhase});
  }
  if (pipeline.enabled) {
    // A cycle without ops ends when the one before it ends.
    for (int64_t c = 0; c < pipeline.cycles; ++c)
      pipeline.cycleEnds[at(c)] =
          std::max(pipeline.cycleEnds[at(c)], c > 0 ? pipeline.cycleEnds[at(c - 1)] : pipeline.startSeconds);
    const auto endOf = [&](int64_t c) { return c < 0 ? pipeline.startSeconds : pipeline.cycleEnds[at(c)]; };
    const int64_t p = pipeline.stages;
    const int64_t n = pipeline.microBatches;
    const int64_t fillEnd = std::min(p - 1, pipeline.cycles) - 1;
    const int64_t mainEnd = std::max(fillEnd, n - 1);
    pipeline.fillSeconds = endOf(fillEnd) - pipeline.startSeconds;
    pipeline.mainSeconds = endOf(mainEnd) - endOf(fillEnd);
    pipeline.flushSeconds = endOf(pipeline.cycles - 1) - endOf(mainEnd);
    const double span = endOf(pipeline.cycles - 1) - pipeline.startSeconds;
    if (span > 0.0)
      pipeline.bubbleFraction =
          std::max(0.0, 1.0 - busy / (static_cast<double>(pipeline.forwardStages) * span));
    for (double& seconds : pipeline.stageSeconds) seconds /= static_cast<double>(n);
  }
  return report;
}

ExchangeStrategy appliedStrategy(const HostStream& stream, int64_t batchesPerStep) {
  if (stream.tileSet == TileSet::Compute) return ExchangeStrategy::JustInTime;
  if (stream.exchangeStrategy == ExchangeStrategy::OverlapLoops && batchesPerStep == 1)
    return ExchangeStrategy::OverlapInnerLoop;
  return stream.exchangeStrategy;
}

int64_t inFlightBuffers(ExchangeStrategy applied) {
  switch (applied) {
    case ExchangeStrategy::JustInTime: return 1;
    case ExchangeStrategy::OverlapInnerLoop: return 2;
    case ExchangeStrategy::OverlapLoops:
    case ExchangeStrategy::OverlapStep: break;
  }
  return 3;
}

void checkHostStreams(const Program& program, const DeviceSpec& spec) {
  const auto bad = [](const std::string& subject, const std::string& message) {
    throw DeviceError(ErrorCode::InvalidHostStream, subject, message);
  };
  if (program.batchesPerStep < 1 || program.accumulationFactor < 1) {
    bad("Program", fmt::format("batchesPerStep is {} and accumulationFactor {}; both must be at least 1",
                               program.batchesPerStep, program.accumulationFactor));
  }
  if (!(spec.hostBandwidthBytesPerSecond > 0.0) || !(spec.hostLatencySeconds >= 0.0)) {
    bad("DeviceSpec", fmt::format("hostBandwidthBytesPerSecond is {} and hostLatencySeconds {}; the "
                                  "bandwidth must be above 0 and the latency at least 0",
                                  spec.hostBandwidthBytesPerSecond, spec.hostLatencySeconds));
  }
  for (const HostStream& s : program.hostStreams) {
    if (s.bytesPerStep < 0 || s.transfersPerStep < 0 || s.bytesPerTransfer < 0) {
      bad(s.name, fmt::format("bytesPerStep {}, transfersPerStep {} and bytesPerTransfer {} must not be negative",
                              s.bytesPerStep, s.transfersPerStep, s.bytesPerTransfer));
    }
    if (s.exchangeStrategy == ExchangeStrategy::OverlapStep) {
      bad(s.name, "exchange strategy OverlapStep (overlap across host steps) is not supported, as in PopART; "
                  "use OverlapLoops");
    }
    if (s.tileSet == TileSet::IO && program.numIOTiles == 0) {
      bad(s.name, "the stream is on the IO tiles but the program has none (numIOTiles 0)");
    }
    if (s.ipu < 0 || s.ipu >= std::max<int64_t>(1, spec.ipusPerReplica)) {
      bad(s.name, fmt::format("the stream is on IPU {}, but a replica of this device has {} IPU{} "
                              "(DeviceSpec ipusPerReplica)",
                              s.ipu, spec.ipusPerReplica, spec.ipusPerReplica == 1 ? "" : "s"));
    }
  }
}

void addHostStreams(TimeReport& report, const Program& program, const DeviceSpec& spec) {
  checkHostStreams(program, spec);
  const int64_t batches = program.batchesPerStep;
  const int64_t micro = program.accumulationFactor;
  const double device = report.stepSeconds;
  report.batchesPerStep = batches;
  report.deviceSeconds = device;
  report.runSeconds = device * static_cast<double>(batches);
  if (program.hostStreams.empty()) return;

  // Per iteration (micro-batch) of the N x A of a step: the compute c and
  // each stream's host link time t, the overlapped ones per IPU (each has a
  // host link of its own).
  struct Overlapped {
    double innerIn = 0.0, innerOut = 0.0, loopsIn = 0.0, loopsOut = 0.0;
  };
  const int64_t ipus = std::max<int64_t>(1, spec.ipusPerReplica);
  std::vector<Overlapped> perIpu(at(ipus));
  const double iterations = static_cast<double>(batches * micro);
  const double c = device / static_cast<double>(micro);
  double justInTime = 0.0;
  // The gaps between consecutive iterations inside the inner loop, and at
  // the outer loop's boundaries (none when the inner loop is the batch loop).
  const int64_t innerGaps = micro > 1 ? batches * (micro - 1) : batches - 1;
  const int64_t outerGaps = micro > 1 ? batches - 1 : 0;
  for (const HostStream& s : program.hostStreams) {
    StreamTime st;
    st.name = s.name;
    st.input = s.input;
    st.tileSet = s.tileSet;
    st.requested = s.exchangeStrategy;
    st.applied = appliedStrategy(s, batches);
    st.bytesPerStep = static_cast<double>(s.bytesPerStep);
    st.seconds = static_cast<double>(s.transfersPerStep) * spec.hostLatencySeconds +
                 st.bytesPerStep / spec.hostBandwidthBytesPerSecond;
    st.ipu = s.ipu;
    const double t = st.seconds / iterations;
    Overlapped& o = perIpu[at(s.ipu)];
    switch (st.applied) {
      case ExchangeStrategy::JustInTime: justInTime += t; break;
      case ExchangeStrategy::OverlapInnerLoop: (s.input ? o.innerIn : o.innerOut) += t; break;
      case ExchangeStrategy::OverlapLoops:
      case ExchangeStrategy::OverlapStep: (s.input ? o.loopsIn : o.loopsOut) += t; break;
    }
    st.overlapped = st.applied == ExchangeStrategy::OverlapInnerLoop ? innerGaps > 0
                    : st.applied == ExchangeStrategy::JustInTime    ? false
                                                                     : innerGaps + outerGaps > 0;
    report.hostSeconds += st.seconds;
    report.hostBytes += st.bytesPerStep;
    report.streams.push_back(std::move(st));
  }
  // The closed form, per IPU: the first iteration's overlapped loads and the
  // last's overlapped stores are exposed; between iterations the overlapped
  // exchanges run beside the compute (JustInTime transfers included), and
  // at an outer boundary only OverlapLoops streams do. The step waits for
  // the slowest IPU.
  const double exposed = c + justInTime;
  report.runSeconds = 0.0;
  for (const Overlapped& o : perIpu) {
    const double inner = o.innerIn + o.innerOut;
    const double loops = o.loopsIn + o.loopsOut;
    const double run = o.innerIn + o.loopsIn + exposed +
                       static_cast<double>(innerGaps) * std::max(exposed, inner + loops) +
                       static_cast<double>(outerGaps) * (std::max(exposed, loops) + inner) + o.innerOut +
                       o.loopsOut;
    report.runSeconds = std::max(report.runSeconds, run);
  }
  report.stepSeconds = report.runSeconds / static_cast<double>(batches);

  // One batch on the HostIO lane: its JustInTime loads first, one after the
  // other (the device's ops wait for them), the overlapped transfers beside
  // the compute on their IPU's link, the JustInTime stores after it.
  const double perBatch = static_cast<double>(micro) / iterations;
  double loadSeconds = 0.0;
  for (const StreamTime& st : report.streams)
    if (st.input && st.applied == ExchangeStrategy::JustInTime) loadSeconds += st.seconds * perBatch;
  for (OpTime& op : report.ops) op.start += loadSeconds;
  double serial = 0.0;
  std::vector<double> links(at(ipus), loadSeconds);
  const auto place = [&](bool input, bool justInTimeLane) {
    for (const StreamTime& st : report.streams) {
      if (st.input != input || (st.applied == ExchangeStrategy::JustInTime) != justInTimeLane) continue;
      double& link = justInTimeLane ? serial : links[at(st.ipu)];
      OpTime op;
      op.name = fmt::format("{} {}", input ? "HostLoad" : "HostStore", st.name);
      op.kind = OpKind::Input;
      op.lane = TimeLane::HostIO;
      op.start = link;
      op.duration = st.seconds * perBatch;
      op.bytes = st.bytesPerStep * perBatch;
      op.ipu = st.ipu;
      link += op.duration;
      report.ops.push_back(std::move(op));
    }
  };
  place(true, true);
  place(true, false);
  place(false, false);
  serial = loadSeconds + device;
  for (double link : links) serial = std::max(serial, link);
  place(false, true);
}

}  // namespace sim

TimeReport modelTime(const Program& program, const DeviceSpec& spec) {
  TimeReport report = sim::modelTime(program.graph, program.replicas, program.graph.schedule(), spec);
  sim::addHostStreams(report, program, spec);
  return report;
}

}  // namespace tessera
