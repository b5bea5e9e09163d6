// The model-state accounting of `tessera explain --json` checked against the
// ZeRO paper's formulas (Rajbhandari et al., 2020, section 5), and the
// gpt2_xl_pod64.json and gpt3_pod1024.json samples explained.
//
// ZeRO counts 2 + 2 + K bytes per parameter for float16 weights and
// gradients and K = 12 bytes of Adam state (float32 master weights and two
// moments). In float32 training there are no master weights: weights 4,
// gradient accumulators 4 and Adam's two moments K' = 8 bytes per parameter.
// With Nd replicas, sharding (RTS) the optimizer state, then also the
// accumulators, then also the weights gives per replica
//   (4+4+8) Psi,  4 Psi + 4 Psi + 8 Psi / Nd,  4 Psi + (4+8) Psi / Nd,  (4+4+8) Psi / Nd
// up to CBR padding: each sharded tensor of n elements takes ceil(n / Nd)
// slots, less than one element (4 bytes) above n / Nd.
#include <cstdint>
#include <string>
#include <vector>

#include <doctest/doctest.h>
#include <nlohmann/json.hpp>

#include "support/process.hpp"
#include "test_support.hpp"

namespace {

using nlohmann::json;
using tessera::test::runCli;
using tessera::test::TempDir;

// The report of a program that fits (exit status 0) or does not (4).
json explainJson(const std::vector<std::string>& args, bool fits) {
  const tessera::test::ProcessResult result = runCli(args);
  INFO("stderr: ", result.err);
  REQUIRE(result.exitCode == (fits ? 0 : 4));
  return json::parse(result.out);
}

// About 7.5 B parameters: 36 blocks of width 4096 (32 heads), GPT-2's
// vocabulary and sequence, head tied; Adam; 64 replicas; accumulation on.
// Every size is sharded when its category is (the default threshold keeps
// tensors under 8192 elements whole, which the formulas do not).
const char* const kZeroConfig = R"({
  "sessionOptions": {
    "enableReplicatedGraphs": true, "replicatedGraphCount": 64,
    "enableGradientAccumulation": true, "accumulationFactor": 2,
    "weightTensorLocationSettings": {"minElementsForReplicatedTensorSharding": 0},
    "accumulatorTensorLocationSettings": {"minElementsForReplicatedTensorSharding": 0},
    "optimizerStateTensorLocationSettings": {"minElementsForReplicatedTensorSharding": 0}
  },
  "model": {"type": "Transformer", "layers": 36, "hidden": 4096, "heads": 32, "vocab": 50257, "sequence": 1024},
  "optimizer": {"type": "Adam", "learningRate": 0.0001},
  "data": {"dataset": "Tensors", "path": "tokens.safetensors", "batchSize": 1},
  "limits": {"maxTensorBytes": 34359738368}
})";

constexpr int64_t kPsi = 7459729408;  // 36 (12 x 4096^2 + 13 x 4096) + (50257 + 1024 + 2) x 4096
constexpr int64_t kNd = 64;
constexpr int64_t kWeightTensors = 2 + 36 * 12 + 2;  // embeddings, 12 per block, ln_f
constexpr int64_t kElementBytes = 4;
// Adam's scalars, optimizer state of one float32 element each whatever the
// sharding (ceil(1 / Nd) = 1): the learning rate and the two bias corrections.
constexpr int64_t kAdamScalarBytes = 3 * kElementBytes;

std::string rtsOn(const char* category) {
  return std::string("/sessionOptions/") + category +
         "TensorLocationSettings/location/replicatedTensorSharding=On";
}

TEST_CASE("explain --json gives ZeRO's model state per replica for a 7.5 B transformer on 64 replicas") {
  const TempDir dir;
  const std::string path = dir.write("zero.json", kZeroConfig);
  // The formulas in float32 (Psi divides by 64, so each is a whole number of bytes):
  //   16 Psi = 119,355,670,528;  8 Psi + 8 Psi / 64 = 60,610,301,440;
  //   4 Psi + 12 Psi / 64 = 31,237,616,896;  16 Psi / 64 = 1,864,932,352;
  // each plus Adam's three scalars (12 bytes).
  struct Stage {
    const char* name;
    std::vector<std::string> sets;
    int64_t weights, accumulators, optimizerState, total;
    int64_t shardedTensors;  // each pads less than one element (4 bytes) per replica
  };
  const std::vector<Stage> stages = {
      {"nothing sharded", {}, 4 * kPsi, 4 * kPsi, 8 * kPsi, 119355670528, 0},
      {"optimizer state sharded",
       {rtsOn("optimizerState")},
       4 * kPsi,
       4 * kPsi,
       8 * kPsi / kNd,
       60610301440,
       2 * kWeightTensors},
      {"optimizer state and accumulators sharded",
       {rtsOn("optimizerState"), rtsOn("accumulator")},
       4 * kPsi,
       4 * kPsi / kNd,
       8 * kPsi / kNd,
       31237616896,
       3 * kWeightTensors},
      {"optimizer state, accumulators and weights sharded",
       {rtsOn("optimizerState"), rtsOn("accumulator"), rtsOn("weight")},
       4 * kPsi / kNd,
       4 * kPsi / kNd,
       8 * kPsi / kNd,
       1864932352,
       4 * kWeightTensors},
  };
  for (const Stage& stage : stages) {
    CAPTURE(stage.name);
    CHECK(stage.weights + stage.accumulators + stage.optimizerState == stage.total);
    // The model state is the question here, not the levers: no search.
    std::vector<std::string> args = {"explain", path, "--json", "--per-replica", "--lever-plans", "0"};
    for (const std::string& set : stage.sets) args.insert(args.end(), {"--set", set});
    const json report = explainJson(args, false);
    CHECK(report.at("parameters") == kPsi);
    const json& replicas = report.at("memory").at("perReplica");
    REQUIRE(replicas.size() == static_cast<std::size_t>(kNd));
    for (const json& replica : {replicas.front(), replicas.back()}) {
      const json& state = replica.at("modelState");
      const auto bytes = [&](const char* category) { return state.at(category).at("total").get<int64_t>(); };
      const int64_t allowed = stage.shardedTensors * kElementBytes;
      const int64_t weights = bytes("Weight");
      const int64_t accumulators = bytes("Accumulator");
      const int64_t optimizer = bytes("OptimizerState");
      const int64_t total = state.at("totalBytes").get<int64_t>();
      CAPTURE(weights);
      CAPTURE(accumulators);
      CAPTURE(optimizer);
      CAPTURE(total);
      CHECK(total == weights + accumulators + optimizer);
      // Never below the formula; above it by the padding of the shards at most.
      CHECK(weights >= stage.weights);
      CHECK(accumulators >= stage.accumulators);
      CHECK(optimizer >= stage.optimizerState + kAdamScalarBytes);
      // Exact when nothing is sharded; else less than one element of padding per sharded tensor.
      const int64_t excess = total - stage.total - kAdamScalarBytes;
      CAPTURE(excess);
      CHECK(excess >= 0);
      CHECK(excess <= allowed);
    }
  }
}

TEST_CASE("gpt2_xl_pod64.json fits on every one of its 64 IPUs: 2 replicas of 32, float16") {
  const std::string path = tessera::test::sourcePath("samples/configs/gpt2_xl_pod64.json");
  const json report = explainJson({"explain", path, "--json"}, true);
  CHECK(report.at("parameters") == 1557611200);
  CHECK(report.at("config").at("model").at("layers") == 48);
  CHECK(report.at("config").at("model").at("hidden") == 1600);
  CHECK(report.at("config").at("model").at("heads") == 25);
  CHECK(report.at("config").at("model").at("sequence") == 1024);
  CHECK(report.at("config").at("model").at("vocab") == 50257);
  const json& memory = report.at("memory");
  CHECK(memory.at("fits") == true);
  CHECK(memory.at("shortfall").is_null());
  CHECK(report.at("replication").at("global").get<int64_t>() * memory.at("ipusPerReplica").get<int64_t>() == 64);
  CHECK(memory.at("ipusPerReplica") == 32);
  // Every IPU within the capacities: one row per IPU of the two replicas alike.
  const json& classes = memory.at("replicaClasses");
  CHECK(classes.size() == 32);
  for (const json& c : classes) {
    CAPTURE(c.at("ipu").get<int64_t>());
    CHECK(c.at("count") == 2);
    CHECK(c.at("computeTilesBytes").get<int64_t>() <= memory.at("computeTilesCapacity").get<int64_t>());
    CHECK(c.at("ioTilesBytes").get<int64_t>() <= memory.at("ioTilesCapacity").get<int64_t>());
    CHECK(c.at("streamingBytes").get<int64_t>() <= memory.at("streamingCapacity").get<int64_t>());
  }
  // float16 weights and activations; Adam's moments and the float32 master weights sharded over both
  // replicas in streaming memory.
  for (const json& tensor : report.at("tensors")) {
    if (tensor.at("category") == "Weight") CHECK(tensor.at("dtype") == "float16");
    if (tensor.at("category") != "OptimizerState" || tensor.at("elements") == 1) continue;
    CAPTURE(tensor.at("name").get<std::string>());
    CHECK(tensor.at("storage") == "OffChip");
  }
  CHECK(report.at("levers").empty());
  const json& time = report.at("modelledStepTime");
  CHECK(time.at("seconds").get<double>() > 0);
  CHECK(time.at("computeSeconds").get<double>() > 0);
  CHECK(time.at("ipuCopySeconds").get<double>() > 0);  // activations cross the IPUs of a replica
  CHECK(report.at("ipuCopies").at("count").get<int64_t>() > 0);

  // The text form answers first; the layout before (64 replicas of one IPU, float32, no recomputation)
  // does not fit.
  const tessera::test::ProcessResult text = runCli({"explain", path});
  INFO("stderr: ", text.err);
  REQUIRE(text.exitCode == 0);
  CHECK(text.out.find(": valid; fits: every IPU's peaks are within the capacities (32 kinds of IPU over 64)") !=
        std::string::npos);
  const tessera::test::ProcessResult before =
      runCli({"validate", path, "--set", "/device/ipusPerReplica=1", "--set", "/sessionOptions/replicatedGraphCount=64",
              "--set", "/sessionOptions/virtualGraphMode=Off", "--set", "/sessionOptions/autoRecomputation=None",
              "--set", "/model/dtype=float32"});
  CHECK(before.exitCode == 4);
  CHECK(before.err.find("tessera.device.401") != std::string::npos);
}

TEST_CASE("gpt3_pod1024.json validates and explains at the default limits; train refuses it by the limit") {
  const std::string path = tessera::test::sourcePath("samples/configs/gpt3_pod1024.json");
  // Planned against the device: valid, and it does not fit (exit status 4).
  const tessera::test::ProcessResult valid = runCli({"validate", path});
  INFO("validate stderr: ", valid.err);
  CHECK(valid.exitCode == 4);
  CHECK(valid.out.rfind(path + ": valid\n", 0) == 0);
  CHECK(valid.err.find("tessera.device.401") != std::string::npos);

  // Every plan of 96 blocks costs seconds: no search for levers here.
  const tessera::test::ProcessResult explained = runCli({"explain", path, "--json", "--lever-plans", "0"});
  INFO("explain stderr: ", explained.err);
  REQUIRE(explained.exitCode == 4);
  // The facts of 1,024 replicas in a size that grows with the model, not with R.
  CHECK(explained.out.size() < 20'000'000);
  const json report = json::parse(explained.out);
  // GPT-3 175B's shape: 96 blocks of width 12288, head tied.
  CHECK(report.at("parameters") == 174604259328LL);
  CHECK(report.at("replication").at("global") == 1024);
  const json& memory = report.at("memory");
  CHECK(memory.at("fits") == false);
  CHECK(memory.at("shortfall").at("space") == "ComputeTiles");
  // Every replica holds the same shard sizes: one class of 1,024 replicas.
  REQUIRE(memory.at("replicaClasses").size() == 1);
  const json& replicas = memory.at("replicaClasses").front();
  CHECK(replicas.at("count") == 1024);
  // Weights and Adam's moments sharded over groups of 64 (the tensors under
  // 8192 elements whole); the moments in streaming memory.
  const int64_t weights = replicas.at("modelState").at("Weight").at("total").get<int64_t>();
  CHECK(weights >= 174604259328LL * 4 / 64);
  CHECK(weights < 174604259328LL * 4 / 64 * 101 / 100);
  const json& optimizer = replicas.at("modelState").at("OptimizerState");
  CHECK(optimizer.at("computeTiles") == 0);
  CHECK(optimizer.at("streaming").get<int64_t>() >= 2 * 174604259328LL * 4 / 64);
  for (const json& tensor : report.at("tensors")) {
    if (tensor.at("replicatedTensorSharding") != "On") continue;
    CAPTURE(tensor.at("name").get<std::string>());
    CHECK(tensor.at("shardingDomain").at("groupSize") == 64);
  }

  // train makes the weights (698 GB on the host): refused by the limit before anything is allocated.
  const tessera::test::ProcessResult trained = runCli({"train", path});
  CHECK(trained.exitCode == 1);
  CHECK(trained.err.find("tessera.config.154") != std::string::npos);
  CHECK(trained.err.find("/limits/maxTensorBytes") != std::string::npos);
}

}  // namespace
