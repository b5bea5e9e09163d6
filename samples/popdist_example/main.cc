// The PopDist example of the PopRun and PopDist user guide (listing 4.3),
// ported to tessera: parse the command line, initialise the distributed run
// when the launcher's environment is set, then configure the session options
// from it. Launch it like the guide does with poprun:
//
//   tessera launch --num-replicas 4 --num-instances 2 -- popdist_example --replicas 4
//
// Unlike the listing, it then checks what it configured: every instance runs
// a replicated all-reduce of its replicas' global indices and expects the sum
// over all replicas of the run. Run without the launcher it does the same on
// one instance. Exits non-zero on a mismatch.
//
// --drop-instance I shows what happens when an instance goes missing:
// instance I leaves right after starting, and the others report it as lost
// after the launcher's --timeout.
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include <fmt/core.h>

#include "tessera/popdist/communicator.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/popdist/dist.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/sessions/session.hpp"

using namespace tessera;

namespace {

struct Options {
  int64_t replicas = 1;
  int64_t dropInstance = -1;
  bool usePopdist = false;
  int64_t popdistRank = 0;
  int64_t popdistSize = 1;
  std::shared_ptr<Communicator> communicator;
};

int failures = 0;

void expect(bool ok, const std::string& what) {
  fmt::print("{} {}\n", ok ? "ok  " : "FAIL", what);
  if (!ok) ++failures;
}

Options commandLineArguments(int argc, char** argv) {
  Options opts;
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--replicas" && i + 1 < argc) {
      opts.replicas = std::atoll(argv[++i]);
    } else if (arg == "--drop-instance" && i + 1 < argc) {
      opts.dropInstance = std::atoll(argv[++i]);
    } else {
      fmt::print(stderr, "usage: popdist_example [--replicas N] [--drop-instance I]\n");
      std::exit(2);
    }
  }
  return opts;
}

void initPopdist(Options& opts) {
  // Horovod's hvd.init() in the listing: connect the instances.
  opts.communicator = dist::instanceCommunicator();
  opts.usePopdist = true;
  if (dist::numTotalReplicas() != opts.replicas) {
    fmt::print("The number of replicas is overridden by the launcher. The new value is {}.\n",
               dist::numTotalReplicas());
  }
  opts.replicas = dist::numLocalReplicas();
  opts.popdistRank = dist::instanceIndex();
  opts.popdistSize = dist::numInstances();
}

SessionOptions createModel(const Options& opts) {
  SessionOptions options;
  if (opts.usePopdist) {
    dist::configureSessionOptions(options);
  } else {
    options.enableReplicatedGraphs = opts.replicas > 1;
    options.replicatedGraphCount = opts.replicas;
  }
  return options;
}

// Every replica contributes its global index + 1; the all-reduced sum must
// be the same on every replica of every instance.
void checkAllReduce(const Options& opts, const SessionOptions& options) {
  const int64_t total = options.getGlobalReplicationFactor();
  const int64_t local = options.getLocalReplicationFactor();
  const int64_t offset = options.getGlobalReplicaOffset();
  Graph g(total);
  const Tensor x = ops::input(g, "x", {1});
  const Tensor sum = ops::replicatedAllReduce(x);
  const std::string name = sum.name();
  InferenceSession session(
      std::move(g), {name}, options,
      opts.communicator ? makeSimDevice({}, ExecutionMode::Vectorized, opts.communicator) : makeSimDevice());
  std::vector<float> values;
  for (int64_t r = 0; r < local; ++r) values.push_back(static_cast<float>(offset + r + 1));
  session.run({StepInput("x", values)});
  const float expected = static_cast<float>(total * (total + 1) / 2);
  bool same = true;
  for (float v : session.output(name).data) same = same && v == expected;
  expect(same, fmt::format("instance {}: the all-reduce over {} replicas gives {} on its {} replica(s)",
                           opts.popdistRank, total, expected, local));
}

}  // namespace

int main(int argc, char** argv) {
  try {
    Options opts = commandLineArguments(argc, argv);

    // Initialise PopDist
    if (dist::isDistEnvSet()) {
      initPopdist(opts);
    } else {
      opts.usePopdist = false;
    }
    if (opts.popdistRank == opts.dropInstance) {
      fmt::print("instance {} leaves now (--drop-instance)\n", opts.popdistRank);
      return 0;
    }

    const SessionOptions options = createModel(opts);
    expect(options.getLocalReplicationFactor() == opts.replicas,
           fmt::format("instance {} of {}: {} local replica(s)", opts.popdistRank, opts.popdistSize,
                       opts.replicas));
    expect(options.getGlobalReplicationFactor() == opts.replicas * opts.popdistSize,
           fmt::format("global replication factor {} = {} instance(s) x {} replica(s)",
                       options.getGlobalReplicationFactor(), opts.popdistSize, opts.replicas));
    expect(options.getGlobalReplicaOffset() == opts.popdistRank * opts.replicas,
           fmt::format("first replica {} = instance {} x {}", options.getGlobalReplicaOffset(),
                       opts.popdistRank, opts.replicas));
    checkAllReduce(opts, options);
  } catch (const Error& e) {
    fmt::print(stderr, "error: {}\n", e.what());
    dist::abortInstances(1);
    return 1;
  }
  return failures == 0 ? 0 : 1;
}
