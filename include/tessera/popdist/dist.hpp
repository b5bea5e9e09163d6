// Multi-instance runs, PopDist style.
//
// A run too large for one host process is split into instances: processes
// started together by `tessera launch` (which runs mpirun, like PopRun),
// each simulating its own replicas. The launcher describes the run in
// environment variables, PopRun's names, so that code written against
// PopDist ports line by line:
//
//   POPDIST_NUM_TOTAL_REPLICAS    replicas of the whole run (R)
//   POPDIST_NUM_LOCAL_REPLICAS    replicas of each instance (L)
//   POPDIST_REPLICA_INDEX_OFFSET  global index of this instance's first replica
//   POPDIST_NUM_IPUS_PER_REPLICA  processors per replica (1)
//   POPDIST_LOCAL_INSTANCE_INDEX  index of this instance on its host
//
// and Open MPI adds OMPI_COMM_WORLD_SIZE, _RANK and _LOCAL_RANK, which must
// agree with them. Instance i of P = R / L runs global replicas i*L ..
// i*L + L - 1. The queries below read the variables each time they are
// called; inconsistent or malformed values are DistError(InconsistentDistEnv)
// naming the variable and the values involved.
//
//   tessera::SessionOptions options = ...;
//   tessera::dist::configureSessionOptions(options);   // replicas from the launcher
//   auto device = tessera::makeSimDevice(spec, tessera::ExecutionMode::Vectorized,
//                                        tessera::dist::instanceCommunicator());
//
// Instances must run the same program: sessions compare their options,
// graphs and tessera versions before the first step (checkInstancesAgree)
// and fail on every instance, naming the first difference, when they do not
// agree. An instance that stops taking part makes the others fail within
// TESSERA_DIST_TIMEOUT seconds (default 60) with DistError(InstanceLost).
#pragma once

#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include <nlohmann/json_fwd.hpp>

#include "tessera/popdist/communicator.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera::dist {

inline constexpr std::string_view kNumTotalReplicasVar = "POPDIST_NUM_TOTAL_REPLICAS";
inline constexpr std::string_view kNumLocalReplicasVar = "POPDIST_NUM_LOCAL_REPLICAS";
inline constexpr std::string_view kReplicaIndexOffsetVar = "POPDIST_REPLICA_INDEX_OFFSET";
inline constexpr std::string_view kNumIpusPerReplicaVar = "POPDIST_NUM_IPUS_PER_REPLICA";
inline constexpr std::string_view kLocalInstanceIndexVar = "POPDIST_LOCAL_INSTANCE_INDEX";
inline constexpr std::string_view kMpiWorldSizeVar = "OMPI_COMM_WORLD_SIZE";
inline constexpr std::string_view kMpiWorldRankVar = "OMPI_COMM_WORLD_RANK";
inline constexpr std::string_view kMpiLocalRankVar = "OMPI_COMM_WORLD_LOCAL_RANK";
// Seconds an instance waits for the others in one exchange before it
// declares them lost. A positive number; default kDefaultTimeout.
inline constexpr std::string_view kTimeoutVar = "TESSERA_DIST_TIMEOUT";
inline constexpr std::chrono::seconds kDefaultTimeout{60};

// The launcher's description of this instance.
struct DistEnv {
  // POPDIST_NUM_TOTAL_REPLICAS or POPDIST_NUM_LOCAL_REPLICAS is present:
  // the process was started by `tessera launch` (or PopRun).
  bool set = false;
  int64_t numTotalReplicas = 1;
  int64_t numLocalReplicas = 1;
  int64_t replicaIndexOffset = 0;
  int64_t numIpusPerReplica = 1;
  // numTotalReplicas / numLocalReplicas and replicaIndexOffset /
  // numLocalReplicas. Without POPDIST_* variables they fall back to Open
  // MPI's world size and rank, as PopTorch does.
  int64_t numInstances = 1;
  int64_t instanceIndex = 0;
  // POPDIST_LOCAL_INSTANCE_INDEX, else OMPI_COMM_WORLD_LOCAL_RANK, else 0.
  int64_t localInstanceIndex = 0;
  bool operator==(const DistEnv&) const = default;
};

// Looks a variable up: its value, or nullopt when it is not set.
using EnvLookup = std::function<std::optional<std::string>(std::string_view name)>;

// Reads and checks the variables above through `lookup`. Every value must be
// a whole number in range (counts >= 1, indices >= 0); the total must be a
// multiple of the local count, the offset a multiple of the local count with
// offset + local <= total, and Open MPI's world size and rank, when set,
// must equal the number of instances and this instance's index.
DistEnv readDistEnv(const EnvLookup& lookup);
// The same from the process environment.
DistEnv readDistEnv();

// PopDist's queries, from the process environment.
bool isDistEnvSet();
int64_t numInstances();
int64_t instanceIndex();
int64_t localInstanceIndex();
int64_t numLocalReplicas();
int64_t numTotalReplicas();
int64_t replicaIndexOffset();
int64_t numIpusPerReplica();

// Fills the replication fields as PopDist's configureSessionOptions does when
// `env.set`: enableReplicatedGraphs = local > 1, replicatedGraphCount =
// local, enableDistributedReplicatedGraphs = true, globalReplicationFactor =
// total, globalReplicaOffset = offset. Leaves `options` alone otherwise.
void configureSessionOptions(SessionOptions& options, const DistEnv& env);
// The same with the process environment's readDistEnv().
void configureSessionOptions(SessionOptions& options);

// TESSERA_DIST_TIMEOUT through `lookup` (kDefaultTimeout when unset);
// DistError(InconsistentDistEnv) for anything but a positive number of
// seconds.
std::chrono::milliseconds exchangeTimeout(const EnvLookup& lookup);
std::chrono::milliseconds exchangeTimeout();

// The communicator of the instances launched together (MPI_COMM_WORLD),
// started on first use with the exchangeTimeout() of the environment and
// closed when the process exits. Every call returns the same one.
// DistError(MpiUnavailable) when this build has no MPI support or MPI
// cannot start.
std::shared_ptr<Communicator> instanceCommunicator();

// Whether this build can run several instances (it was built with MPI).
bool mpiAvailable() noexcept;

// Stops every instance of the run at once (MPI_Abort with `exitCode`)
// after this one failed, instead of leaving the others to wait for it until
// their timeout. Does nothing when instanceCommunicator() was never used.
// For the caller that decides a process ends (a CLI's error handler).
void abortInstances(int exitCode) noexcept;

// Checks that every instance passes the same `settings` (any JSON value,
// compared leaf by leaf in document order; `what` names them in messages,
// e.g. "run config"): when they differ, every instance throws
// DistError(InstanceMismatch) whose subject is the JSON pointer of the first
// difference and whose message gives the value there on instance 0 and on
// every instance that differs from it.
void checkInstancesAgree(Communicator& communicator, const nlohmann::json& settings, std::string_view what);

// The version of this tessera build ("0.1.0"); instances compare it.
std::string_view tesseraVersion() noexcept;

}  // namespace tessera::dist
