// The launcher's environment variables: parsing, cross-checks and what
// they mean for SessionOptions.
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <fmt/ranges.h>

#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"

namespace tessera::dist {
namespace {

std::optional<std::string> processLookup(std::string_view name) {
  const char* value = std::getenv(std::string(name).c_str());
  if (value == nullptr) return std::nullopt;
  return std::string(value);
}

[[noreturn]] void inconsistent(std::string_view variable, std::string message) {
  throw DistError(ErrorCode::InconsistentDistEnv, std::string(variable), message);
}

// A whole number >= `minimum`, or nullopt when the variable is unset.
std::optional<int64_t> readCount(const EnvLookup& lookup, std::string_view name, int64_t minimum) {
  const std::optional<std::string> text = lookup(name);
  if (!text) return std::nullopt;
  int64_t value = 0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, value);
  if (text->empty() || ec != std::errc() || ptr != end) {
    inconsistent(name,
                 fmt::format("\"{}\" is not a whole number; expected an integer >= {} (tessera launch sets "
                             "it; unset it or give a number)",
                             *text, minimum));
  }
  if (value < minimum) {
    inconsistent(name, fmt::format("{} is below the minimum {}", value, minimum));
  }
  return value;
}

std::string launchHint(int64_t total, int64_t instances) {
  return fmt::format(
      "start the instances with `tessera launch --num-replicas {} --num-instances {} -- ...` "
      "rather than setting the variables by hand",
      total, instances);
}

}  // namespace

DistEnv readDistEnv(const EnvLookup& lookup) {
  DistEnv env;
  const std::optional<int64_t> total = readCount(lookup, kNumTotalReplicasVar, 1);
  const std::optional<int64_t> local = readCount(lookup, kNumLocalReplicasVar, 1);
  const std::optional<int64_t> offset = readCount(lookup, kReplicaIndexOffsetVar, 0);
  const std::optional<int64_t> ipus = readCount(lookup, kNumIpusPerReplicaVar, 1);
  const std::optional<int64_t> localIndex = readCount(lookup, kLocalInstanceIndexVar, 0);
  const std::optional<int64_t> worldSize = readCount(lookup, kMpiWorldSizeVar, 1);
  const std::optional<int64_t> worldRank = readCount(lookup, kMpiWorldRankVar, 0);
  const std::optional<int64_t> worldLocalRank = readCount(lookup, kMpiLocalRankVar, 0);

  env.set = total.has_value() || local.has_value();
  env.numTotalReplicas = total.value_or(1);
  env.numLocalReplicas = local.value_or(1);
  env.replicaIndexOffset = offset.value_or(0);
  env.numIpusPerReplica = ipus.value_or(1);
  env.localInstanceIndex = localIndex.value_or(worldLocalRank.value_or(0));

  if (!env.set) {
    // PopTorch's fallback: an mpirun launch without replica variables.
    env.numInstances = worldSize.value_or(1);
    env.instanceIndex = worldRank.value_or(0);
    if (env.instanceIndex >= env.numInstances) {
      inconsistent(kMpiWorldRankVar, fmt::format("rank {} is not below the world size {} ({})",
                                                 env.instanceIndex, env.numInstances, kMpiWorldSizeVar));
    }
    return env;
  }

  const int64_t replicas = env.numTotalReplicas;
  const int64_t perInstance = env.numLocalReplicas;
  if (replicas % perInstance != 0) {
    inconsistent(
        kNumTotalReplicasVar,
        fmt::format("{} total replicas are not a multiple of {}={}; every instance runs the same number "
                    "of replicas, so the total must be instances x local replicas",
                    replicas, kNumLocalReplicasVar, perInstance));
  }
  env.numInstances = replicas / perInstance;
  const int64_t first = env.replicaIndexOffset;
  if (first % perInstance != 0 || first + perInstance > replicas) {
    std::vector<int64_t> offsets;
    for (int64_t o = 0; o < replicas && offsets.size() < 4; o += perInstance) offsets.push_back(o);
    inconsistent(kReplicaIndexOffsetVar,
                 fmt::format("offset {} is not the first replica of an instance: with {} replicas, {} per "
                             "instance, the offsets are {}{} (instance index x local replicas)",
                             first, replicas, perInstance, fmt::join(offsets, ", "),
                             env.numInstances > 4 ? fmt::format(", ..., {}", replicas - perInstance) : ""));
  }
  env.instanceIndex = first / perInstance;
  if (worldSize && *worldSize != env.numInstances) {
    inconsistent(kMpiWorldSizeVar,
                 fmt::format("mpirun started {} instance(s) but {}={} / {}={} make {}; {}", *worldSize,
                             kNumTotalReplicasVar, replicas, kNumLocalReplicasVar, perInstance,
                             env.numInstances, launchHint(replicas, *worldSize)));
  }
  if (worldRank && *worldRank != env.instanceIndex) {
    inconsistent(kReplicaIndexOffsetVar,
                 fmt::format("offset {} belongs to instance {}, but this is instance {} ({}), whose replicas "
                             "start at {} x {} = {}; {}",
                             first, env.instanceIndex, *worldRank, kMpiWorldRankVar, *worldRank, perInstance,
                             *worldRank * perInstance, launchHint(replicas, env.numInstances)));
  }
  if (localIndex && worldLocalRank && *localIndex != *worldLocalRank) {
    inconsistent(kLocalInstanceIndexVar, fmt::format("{} differs from {}={}; they must be equal", *localIndex,
                                                     kMpiLocalRankVar, *worldLocalRank));
  }
  if (env.localInstanceIndex >= env.numInstances) {
    inconsistent(
        localIndex ? kLocalInstanceIndexVar : kMpiLocalRankVar,
        fmt::format("{} is not below the number of instances {}", env.localInstanceIndex, env.numInstances));
  }
  return env;
}

DistEnv readDistEnv() { return readDistEnv(processLookup); }

bool isDistEnvSet() { return readDistEnv().set; }
int64_t numInstances() { return readDistEnv().numInstances; }
int64_t instanceIndex() { return readDistEnv().instanceIndex; }
int64_t localInstanceIndex() { return readDistEnv().localInstanceIndex; }
int64_t numLocalReplicas() { return readDistEnv().numLocalReplicas; }
int64_t numTotalReplicas() { return readDistEnv().numTotalReplicas; }
int64_t replicaIndexOffset() { return readDistEnv().replicaIndexOffset; }
int64_t numIpusPerReplica() { return readDistEnv().numIpusPerReplica; }

void configureSessionOptions(SessionOptions& options, const DistEnv& env) {
  if (!env.set) return;
  options.enableReplicatedGraphs = env.numLocalReplicas > 1;
  options.replicatedGraphCount = env.numLocalReplicas;
  options.enableDistributedReplicatedGraphs = true;
  options.globalReplicationFactor = env.numTotalReplicas;
  options.globalReplicaOffset = env.replicaIndexOffset;
}

void configureSessionOptions(SessionOptions& options) { configureSessionOptions(options, readDistEnv()); }

std::chrono::milliseconds exchangeTimeout(const EnvLookup& lookup) {
  const std::optional<std::string> text = lookup(kTimeoutVar);
  if (!text) return kDefaultTimeout;
  double seconds = 0.0;
  const char* end = text->data() + text->size();
  const auto [ptr, ec] = std::from_chars(text->data(), end, seconds);
  // Up to a year: enough for any run, and far from overflowing milliseconds.
  constexpr double kMaxSeconds = 365.0 * 24 * 3600;
  if (text->empty() || ec != std::errc() || ptr != end || !std::isfinite(seconds) || seconds <= 0.0 ||
      seconds > kMaxSeconds) {
    inconsistent(kTimeoutVar, fmt::format("\"{}\" is not a number of seconds in (0, {}]; e.g. {}={} for the "
                                          "default",
                                          *text, kMaxSeconds, kTimeoutVar, kDefaultTimeout.count()));
  }
  return std::chrono::milliseconds(std::max<int64_t>(1, std::llround(seconds * 1000.0)));
}

std::chrono::milliseconds exchangeTimeout() { return exchangeTimeout(processLookup); }

std::string_view tesseraVersion() noexcept { return TESSERA_VERSION; }

}  // namespace tessera::dist
