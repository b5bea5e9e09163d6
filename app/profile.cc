#include "tessera/app/profile.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <array>
#include <map>
#include <set>
#include <string>
#include <utility>

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <nlohmann/json.hpp>

#include "tessera/lib/error.hpp"
#include "tessera/app/output_check.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/sessions/session.hpp"

namespace tessera {
namespace {

using nlohmann::json;

constexpr double kMicrosecondsPerSecond = 1e6;

std::string nameOf(auto value) { return std::string(toString(value)); }

json tensorJson(const TensorMemory& t) {
  json j{{"name", t.name},      {"category", nameOf(t.category)}, {"space", nameOf(t.space)},
         {"bytes", t.bytes},    {"resident", t.resident},         {"sharded", t.sharded},
         {"shards", t.shards},  {"paddingBytes", t.paddingBytes}, {"firstUse", t.firstUse},
         {"lastUse", t.lastUse}};
  if (t.remoteBuffer >= 0) j["remoteBuffer"] = t.remoteBuffer;
  return j;
}

json peakJson(const MemoryPeak& peak) {
  json largest = json::array();
  for (const TensorMemory& t : peak.largest) largest.push_back(tensorJson(t));
  return {{"peakBytes", peak.bytes}, {"op", peak.op}, {"largest", std::move(largest)}};
}

json memoryJson(const MemoryReport& memory) {
  json replicas = json::array();
  for (const ReplicaMemory& m : memory.perReplica) {
    json byCategory = json::object();
    for (const CategoryMemory& c : m.byCategory) {
      byCategory[nameOf(c.category)] = {{"computeTiles", c.computeTilesBytes},
                                        {"ioTiles", c.ioTilesBytes},
                                        {"streaming", c.streamingBytes}};
    }
    json resident = json::object();
    for (const CategoryMemory& c : m.resident) {
      resident[nameOf(c.category)] = {{"computeTiles", c.computeTilesBytes},
                                      {"ioTiles", c.ioTilesBytes},
                                      {"streaming", c.streamingBytes}};
    }
    replicas.push_back({{"replica", m.replica},
                        {"ipu", m.ipu},
                        {"computeTiles", peakJson(m.computeTilesPeak)},
                        {"ioTiles", peakJson(m.ioTilesPeak)},
                        {"streaming", peakJson(m.streamingPeak)},
                        {"variableBytes", m.variableBytes},
                        {"peakActivationBytes", m.peakActivationBytes},
                        {"paddingBytes", m.paddingBytes},
                        {"byCategory", std::move(byCategory)},
                        {"resident", std::move(resident)}});
  }
  json tensors = json::array();
  for (const TensorMemory& t : memory.tensors) tensors.push_back(tensorJson(t));
  return {{"capacity",
           {{"computeTiles", memory.computeTilesCapacity},
            {"ioTiles", memory.ioTilesCapacity},
            {"streaming", memory.streamingCapacity}}},
          {"paddingBytes", memory.paddingBytes},
          {"ipusPerReplica", memory.ipusPerReplica},
          {"perReplica", std::move(replicas)},
          {"tensors", std::move(tensors)}};
}

void writeText(const std::string& path, const std::string& text) { writeOutputFile(path, text + '\n'); }

// Chrome trace threads: the fixed lanes first, then one link per group.
struct TraceThreads {
  static constexpr int kComputeTiles = 0;
  static constexpr int kIOTiles = 1;
  static constexpr int kStreaming = 2;
  // The copies between the IPUs of a replica: a thread after the links met
  // before them, as a link group of its own.
  static constexpr std::string_view kIpuLinks = "IPU links";
  // The host link of each IPU after the links (its ops come last in a
  // report).
  std::map<int64_t, int> hostIO;
  std::vector<int64_t> hostOrder;
  std::map<std::string, int> links;
  std::vector<std::string> linkOrder;

  int of(const OpTime& op) {
    switch (op.lane) {
      case TimeLane::ComputeTiles: return kComputeTiles;
      case TimeLane::IOTiles: return kIOTiles;
      case TimeLane::Streaming: return kStreaming;
      case TimeLane::HostIO: {
        const auto [it, added] =
            hostIO.try_emplace(op.ipu, kStreaming + 1 + static_cast<int>(links.size() + hostIO.size()));
        if (added) hostOrder.push_back(op.ipu);
        return it->second;
      }
      case TimeLane::IpuLink:
      case TimeLane::Link: break;
    }
    const std::string group = op.lane == TimeLane::IpuLink ? std::string(kIpuLinks) : "link " + op.group;
    const auto [it, added] =
        links.try_emplace(group, kStreaming + 1 + static_cast<int>(links.size() + hostIO.size()));
    if (added) linkOrder.push_back(group);
    return it->second;
  }
};

json metadata(std::string_view what, int tid, json args) {
  return {{"name", what}, {"ph", "M"}, {"pid", 0}, {"tid", tid}, {"args", std::move(args)}};
}

}  // namespace

json profileJson(const MemoryReport& memory, const TimeReport& time, int64_t steps) {
  json traffic = json::object();
  for (const auto& [lane, laneName] : EnumNames<TimeLane>::kNames)
    traffic[std::string(laneName)] = {{"ops", 0}, {"seconds", 0.0}, {"bytes", 0.0}};
  json ops = json::array();
  for (const OpTime& op : time.ops) {
    json& lane = traffic[nameOf(op.lane)];
    lane["ops"] = lane["ops"].get<int64_t>() + 1;
    lane["seconds"] = lane["seconds"].get<double>() + op.duration;
    lane["bytes"] = lane["bytes"].get<double>() + op.bytes;
    ops.push_back({{"name", op.name},
                   {"kind", std::string(opName(op.kind))},
                   {"lane", nameOf(op.lane)},
                   {"group", op.group},
                   {"interInstance", op.interInstance},
                   {"startSeconds", op.start},
                   {"durationSeconds", op.duration},
                   {"flops", op.flops},
                   {"bytes", op.bytes},
                   {"ipu", op.ipu}});
  }
  return {{"steps", steps},
          {"time",
           {{"stepSeconds", time.stepSeconds},
            {"totalSeconds", time.stepSeconds * static_cast<double>(steps)},
            {"computeSeconds", time.computeSeconds},
            {"collectiveSeconds", time.collectiveSeconds},
            {"streamingSeconds", time.streamingSeconds},
            {"overlappedStreamingSeconds", time.overlappedStreamingSeconds},
            {"ipuCopySeconds", time.ipuCopySeconds},
            {"flops", time.flops}}},
          {"traffic", std::move(traffic)},
          {"ops", std::move(ops)},
          {"memory", memoryJson(memory)}};
}

// Pipelined steps: one compute thread per IPU (after every other thread),
// and the fill, main and flush phases on a thread before them.
constexpr int kPipelinePhases = 1000;
constexpr int kPipelineIpus = 1001;

json chromeTraceJson(const TimeReport& time) {
  TraceThreads threads;
  json events = json::array();
  const PipelineTime& pipeline = time.pipeline;
  std::map<int64_t, std::set<int64_t>> stagesOf;  // IPU -> its pipeline stages
  for (const OpTime& op : time.ops) {
    const bool perIpu = pipeline.enabled && op.lane == TimeLane::ComputeTiles;
    if (perIpu && op.pipelineStage != kNoPipelineStage) stagesOf[op.ipu].insert(op.pipelineStage);
    json args = {{"kind", std::string(opName(op.kind))}, {"flops", op.flops}, {"bytes", op.bytes}};
    if (op.pipelineStage != kNoPipelineStage && op.microBatch != kNoMicroBatch) {
      args["pipelineStage"] = op.pipelineStage;
      args["microBatch"] = op.microBatch;
    }
    if (op.executionPhase != kNoExecutionPhase) args["executionPhase"] = op.executionPhase;
    events.push_back({{"name", op.name},
                      {"cat", nameOf(op.lane)},
                      {"ph", "X"},
                      {"ts", op.start * kMicrosecondsPerSecond},
                      {"dur", op.duration * kMicrosecondsPerSecond},
                      {"pid", 0},
                      {"tid", perIpu ? kPipelineIpus + static_cast<int>(op.ipu) : threads.of(op)},
                      {"args", std::move(args)}});
  }
  if (pipeline.enabled) {
    const double fillEnd = pipeline.startSeconds + pipeline.fillSeconds;
    const double mainEnd = fillEnd + pipeline.mainSeconds;
    const std::array<std::pair<const char*, std::pair<double, double>>, 3> phases = {
        std::pair{"fill", std::pair{pipeline.startSeconds, pipeline.fillSeconds}},
        std::pair{"main", std::pair{fillEnd, pipeline.mainSeconds}},
        std::pair{"flush", std::pair{mainEnd, pipeline.flushSeconds}}};
    for (const auto& phase : phases) {
      events.push_back({{"name", phase.first},
                        {"cat", "pipeline"},
                        {"ph", "X"},
                        {"ts", phase.second.first * kMicrosecondsPerSecond},
                        {"dur", phase.second.second * kMicrosecondsPerSecond},
                        {"pid", 0},
                        {"tid", kPipelinePhases},
                        {"args", {{"bubbleFraction", pipeline.bubbleFraction}}}});
    }
  }
  json named = json::array();
  named.push_back(metadata("process_name", 0, {{"name", "tessera modelled step (one replica)"}}));
  auto thread = [&](int tid, const std::string& label) {
    named.push_back(metadata("thread_name", tid, {{"name", label}}));
    named.push_back(metadata("thread_sort_index", tid, {{"sort_index", tid}}));
  };
  thread(TraceThreads::kComputeTiles, "compute tiles");
  thread(TraceThreads::kIOTiles, "IO tiles");
  thread(TraceThreads::kStreaming, "streaming");
  for (const std::string& group : threads.linkOrder) thread(threads.links.at(group), group);
  // One IPU: "host link"; several: a link per IPU.
  const bool severalIpus =
      std::any_of(time.ops.begin(), time.ops.end(), [](const OpTime& op) { return op.ipu > 0; });
  for (int64_t ipu : threads.hostOrder)
    thread(threads.hostIO.at(ipu),
           severalIpus ? fmt::format("host link IPU {}", ipu) : std::string("host link"));
  if (pipeline.enabled) {
    thread(kPipelinePhases, fmt::format("pipeline: {} micro-batches, {} stages, bubble {:.1f} %",
                                        pipeline.microBatches, pipeline.stages, 100.0 * pipeline.bubbleFraction));
    for (const auto& [ipu, stages] : stagesOf)
      thread(kPipelineIpus + static_cast<int>(ipu),
             fmt::format("IPU {} compute tiles: stage{} {}", ipu, stages.size() == 1 ? "" : "s", fmt::join(stages, ", ")));
  }
  for (json& e : events) named.push_back(std::move(e));
  return {{"traceEvents", std::move(named)}, {"displayTimeUnit", "ns"}};
}

void writeProfile(const std::string& path, const MemoryReport& memory, const TimeReport& time,
                  int64_t steps) {
  writeText(path, profileJson(memory, time, steps).dump(1));
}

void writeChromeTrace(const std::string& path, const TimeReport& time) {
  writeText(path, chromeTraceJson(time).dump());
}

void writeTrainingProfiles(const OutputConfig& output, const TrainingSession& session, int64_t steps) {
  if (!output.profile.empty()) writeProfile(output.profile, session.memory(), session.modelledTime(), steps);
  if (!output.trace.empty()) writeChromeTrace(output.trace, session.modelledTime());
}

}  // namespace tessera
