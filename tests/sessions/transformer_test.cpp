// The transformer model type of the run config: its section read strictly,
// its rules, its graph, and training it on a tensors dataset of token
// sequences, with the same losses whatever the replication, sharding,
// streaming and accumulation settings.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <set>
#include <limits>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "tessera/lib/error.hpp"
#include "tessera/sessions/placement.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/run_plan.hpp"
#include "tessera/app/trainer.hpp"
#include "tessera/app/transformer.hpp"
#include "support/process.hpp"
#include "support/training_fixtures.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

LoadedRunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parseRunConfig(text, "gpt.json", overrides);
}

template <class Fn>
void checkError(Fn&& fn, ErrorCode code, const std::string& subject, const std::string& fragment) {
  const std::optional<Error> error = test::catchError<Error>(fn);
  REQUIRE(error.has_value());
  INFO(std::string(error->what()));
  CHECK(error->code() == code);
  CHECK(error->subject() == subject);
  CHECK(std::string(error->what()).find(fragment) != std::string::npos);
}

TEST_CASE("the transformer section is flat: the options of the type beside \"type\"") {
  const LoadedRunConfig loaded = parse(
      R"({"model": {"type": "Transformer", "layers": 48, "hidden": 1600, "heads": 25, "vocab": 50257,
                    "sequence": 1024, "tiedHead": false},
          "data": {"dataset": "Tensors", "path": "tokens.safetensors", "batchSize": 1, "testBatchSize": 1},
          "limits": {"maxTensorBytes": 8589934592}})");
  const TransformerConfig& t = loaded.config.model.transformer;
  CHECK(t.layers == 48);
  CHECK(t.hidden == 1600);
  CHECK(t.heads == 25);
  CHECK(t.vocab == 50257);
  CHECK(t.sequence == 1024);
  CHECK_FALSE(t.tiedHead);
  CHECK_NOTHROW(validate(loaded.config));
  // The JSON of the section has the keys of its type (and the dtype of every
  // type) only, and reads back the same.
  const json written = loaded.config.model;
  CHECK(written == json{{"type", "Transformer"},
                        {"dtype", "float32"},
                        {"layers", 48},
                        {"hidden", 1600},
                        {"heads", 25},
                        {"vocab", 50257},
                        {"sequence", 1024},
                        {"tiedHead", false}});
  CHECK(written.get<ModelConfig>() == loaded.config.model);
  // GPT-2 XL has 1,557,611,200 parameters with its head tied to the token embedding.
  TransformerConfig xl = t;
  xl.tiedHead = true;
  CHECK(transformerParameterCount(xl) == 1557611200);
  CHECK(transformerParameterCount(t) == 1557611200 + 1600 * 50257);
}

TEST_CASE("bad transformer sections are refused at the JSON path, with the values and what is allowed") {
  const std::string data = R"("data": {"dataset": "Tensors", "path": "t.safetensors"})";
  const auto config = [&](const std::string& model) { return "{\"model\": " + model + ", " + data + "}"; };
  checkError(
      [&] { validate(parse(config(R"({"type": "Transformer", "hidden": 1600, "heads": 7})")).config); },
      ErrorCode::InvalidModel, "/model/heads",
      "heads 7 does not divide hidden 1600: every head attends over hidden / heads dimensions");
  checkError([&] { parse(config(R"({"type": "Transformer", "hiden": 64})")); }, ErrorCode::UnknownKey,
             "/model/hiden", "for model type \"Transformer\" (did you mean \"hidden\"?)");
  checkError([&] { parse(config(R"({"type": "Transformer", "activation": "Gelu"})")); },
             ErrorCode::UnknownKey, "/model/activation", "it is an option of model type \"Mlp\"");
  checkError([&] { parse(config(R"({"type": "Mlp", "heads": 4})")); }, ErrorCode::UnknownKey, "/model/heads",
             "it is an option of model type \"Transformer\"");
  checkError([&] { parse(config(R"({"type": "Transformer", "layers": 0})")); }, ErrorCode::InvalidModel,
             "/model/layers", "layers is 0; it must be >= 1");
  checkError([&] { parse(config(R"({"type": "Transformer", "layers": [784, 10]})")); }, ErrorCode::WrongType,
             "/model/layers", "expected an integer");
  checkError([&] { parse(config(R"({"type": "Transformer", "tiedHead": 1})")); }, ErrorCode::WrongType,
             "/model/tiedHead", "expected a boolean");
  checkError(
      [&] {
        validate(
            parse(
                R"({"model": {"type": "Transformer", "hidden": 64, "heads": 4, "vocab": 100, "sequence": 16}})")
                .config);
      },
      ErrorCode::InvalidData, "/data/dataset", "set /data/dataset to \"Tensors\"");
  // A size over the limits is refused before anything is built.
  checkError(
      [&] {
        validate(
            parse(config(R"({"type": "Transformer", "vocab": 50257, "hidden": 30000, "heads": 1})")).config);
      },
      ErrorCode::ShapeTooLarge, "/model/vocab", "the token embedding wte.weight of 50257 x 30000 float32");
  checkError(
      [&] { validate(parse(config(R"({"type": "Transformer", "layers": 9223372036854775807})")).config); },
      ErrorCode::ShapeTooLarge, "/model/layers", "more than /limits/maxLayers (1024)");
  // With /limits/maxLayers raised, the sizes themselves are counted in 64 bits.
  checkError(
      [&] {
        RunConfig many = parse(config(R"({"type": "Transformer", "layers": 9223372036854775807})")).config;
        many.limits.maxLayers = std::numeric_limits<int64_t>::max();
        validate(many);
      },
      ErrorCode::ShapeTooLarge, "/model/layers", "more than 2^63");
  // The builder checks as the config does, for callers that skip validate().
  TransformerConfig bad;
  bad.heads = 5;
  checkError([&] { buildTransformer(bad, 1, 1, 0); }, ErrorCode::InvalidModel, "/model/heads",
             "heads 5 does not divide hidden 768");
  TransformerConfig huge;
  huge.vocab = int64_t{1} << 50;
  checkError([&] { buildTransformer(huge, 1 << 20, 1, 0); }, ErrorCode::ShapeTooLarge, "/model",
             "has tensors whose sizes do not fit in 64 bits");
}

TEST_CASE("the graph: one embedding lookup, two batched products and a causal select per block") {
  TransformerConfig config;
  config.layers = 3;
  config.hidden = 8;
  config.heads = 2;
  config.vocab = 11;
  config.sequence = 5;
  for (const bool tied : {true, false}) {
    config.tiedHead = tied;
    CAPTURE(tied);
    const TransformerGraph t = buildTransformer(config, 2, 1, 0);
    std::multiset<OpKind> kinds;
    for (const OpNode& op : t.graph.ops()) kinds.insert(op.kind);
    CHECK(kinds.count(OpKind::Gather) == 1);
    CHECK(kinds.count(OpKind::BatchMatMul) == 2 * 3);
    CHECK(kinds.count(OpKind::Where) == 3);
    CHECK(kinds.count(OpKind::Softmax) == 3);
    CHECK(kinds.count(OpKind::Erf) == 3);
    CHECK(kinds.count(OpKind::SoftmaxCrossEntropy) == 1);
    CHECK(t.graph.tensor(t.logits).shape == Shape{2, 5, 11});
    CHECK(t.graph.tensor(t.tokens).dtype == DType::Int32);
    CHECK(t.weights.size() == 2 + 12 * 3 + 2 + (tied ? 0 : 1));
    int64_t count = 0;
    for (const TensorId id : t.weights) count += numElements(t.graph.tensor(id).shape);
    CHECK(transformerParameterCount(config) == count);
  }
}

RunConfig tinyRun(const std::string& tokens, const std::vector<std::string>& overrides) {
  const json document = {{"model",
                          {{"type", "Transformer"},
                           {"layers", 2},
                           {"hidden", 16},
                           {"heads", 2},
                           {"vocab", 12},
                           {"sequence", 6}}},
                         {"optimizer", {{"type", "Adam"}, {"learningRate", 0.02}}},
                         {"data",
                          {{"dataset", "Tensors"},
                           {"path", tokens},
                           {"batchSize", 8},
                           {"epochs", 5},
                           {"shuffle", false},
                           {"seed", 4}}}};
  return parse(document.dump(), overrides).config;
}

std::vector<std::string> replicas(int64_t count, int64_t batch) {
  return {"/sessionOptions/enableReplicatedGraphs=" + std::string(count > 1 ? "true" : "false"),
          fmt::format("/sessionOptions/replicatedGraphCount={}", count),
          "/sessionOptions/accumulationAndReplicationReductionType=Mean",
          fmt::format("/data/batchSize={}", batch)};
}

std::vector<std::string> with(std::vector<std::string> base, const std::vector<std::string>& more) {
  base.insert(base.end(), more.begin(), more.end());
  return base;
}

std::vector<std::string> rts(const std::vector<std::string>& categories) {
  std::vector<std::string> out;
  for (const std::string& category : categories) {
    const std::string at = fmt::format("/sessionOptions/{}TensorLocationSettings", category);
    out.push_back(at + "/location/replicatedTensorSharding=On");
    out.push_back(at + "/minElementsForReplicatedTensorSharding=0");
  }
  return out;
}

TEST_CASE(
    "a tiny transformer trains on token sequences: the loss falls, whatever the replicas and locations") {
  const test::TempDir folder;
  const std::string tokens = test::writeCountingTokens(folder.path(), 32, 6, 12);
  const TrainSummary one = train(tinyRun(tokens, {}));
  REQUIRE(one.steps == 20);  // 32 samples / 8 per step x 5 epochs
  INFO("losses: ", fmt::format("{}", fmt::join(one.losses, ", ")));
  // From about log(12) = 2.48 (GPT-2's initialisation predicts nearly uniformly).
  CHECK(std::fabs(one.losses.front() - std::log(12.0)) < 0.1);
  CHECK(one.losses.back() < 0.25 * one.losses.front());  // 2.52 -> 0.23 in 20 steps

  const std::vector<std::pair<std::string, std::vector<std::string>>> variants = {
      {"R=2 x batch 4", replicas(2, 4)},
      {"R=4 x batch 2, RTS of weights, optimizer state",
       with(replicas(4, 2), rts({"weight", "optimizerState"}))},
      {"R=2 x batch 4, optimizer state OffChip",
       with(replicas(2, 4),
            {"/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip",
             "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForOffChip=0"})},
      {"accumulation 2 x R=2 x batch 2, everything sharded",
       with(with(replicas(2, 2), rts({"weight", "optimizerState", "accumulator"})),
            {"/sessionOptions/enableGradientAccumulation=true", "/sessionOptions/accumulationFactor=2"})},
  };
  for (const auto& variant : variants) {
    CAPTURE(variant.first);
    const TrainSummary other = train(tinyRun(tokens, variant.second));
    REQUIRE(other.losses.size() == one.losses.size());
    double worst = 0;
    for (std::size_t k = 0; k < one.losses.size(); ++k)
      worst = std::max(worst, std::fabs(other.losses[k] - one.losses[k]) / std::fabs(one.losses[k]));
    INFO("worst relative difference of a step's loss: ", worst);
    CHECK(worst <= 1e-5);
  }
}

// Recomputation clones forward ops into the backward pass: the same bits,
// alone and with the splits of a step; Standard and NormOnly keep fewer
// activations.
TEST_CASE("every recomputation type trains the tiny transformer to the same bits, with a lower peak") {
  const test::TempDir folder;
  const std::string tokens = test::writeCountingTokens(folder.path(), 32, 6, 12);
  const std::string option = "/sessionOptions/autoRecomputation=";
  const std::vector<std::vector<std::string>> splits = {
      {},
      with(replicas(2, 4), rts({"weight", "optimizerState"})),
      with(replicas(2, 4), {"/sessionOptions/optimizerStateTensorLocationSettings/location/storage=OffChip",
                            "/sessionOptions/optimizerStateTensorLocationSettings/minElementsForOffChip=0"}),
      with(replicas(2, 2), {"/sessionOptions/enableGradientAccumulation=true",
                            "/sessionOptions/accumulationFactor=2"}),
  };
  for (std::size_t s = 0; s < splits.size(); ++s) {
    CAPTURE(s);
    const TrainSummary plain = train(tinyRun(tokens, splits[s]));
    const int64_t plainPeak = plain.memory.perReplica.at(0).peakActivationBytes;
    for (const std::string type : {"Standard", "NormOnly", "RecomputeAll"}) {
      CAPTURE(type);
      const TrainSummary summary = train(tinyRun(tokens, with(splits[s], {option + type})));
      CHECK(summary.losses == plain.losses);
      CHECK(summary.weights == plain.weights);
      const int64_t peak = summary.memory.perReplica.at(0).peakActivationBytes;
      INFO("peak activation bytes ", peak, " without recomputation ", plainPeak);
      if (type == "RecomputeAll") {
        CHECK(peak == plainPeak);
      } else {
        CHECK(peak < plainPeak);
      }
    }
  }
}

TEST_CASE("planning GPT-2 XL makes no values and keeps every tensor's name and size") {
  const LoadedRunConfig loaded = parse(
      R"({"model": {"type": "Transformer", "layers": 48, "hidden": 1600, "heads": 25, "vocab": 50257,
                    "sequence": 1024},
          "optimizer": {"type": "Adam"},
          "data": {"dataset": "Tensors", "path": "tokens.safetensors", "batchSize": 1, "testBatchSize": 1},
          "limits": {"maxTensorBytes": 8589934592}})");
  validate(loaded.config);
  const RunPlan plan = planRun(loaded.config);
  int64_t parameters = 0;
  int64_t moments = 0;
  for (const TensorPlacement& t : plan.tensors) {
    if (t.category == TensorCategory::Weight) parameters += t.elements;
    if (t.category == TensorCategory::OptimizerState) moments += t.elements;
  }
  CHECK(parameters == 1557611200);
  // Two moments per parameter, and the learning rate and two bias corrections.
  CHECK(moments == 2 * parameters + 3);
  // The planned program holds its variables' initial values as generators only.
  for (const TensorNode& node : plan.program.graph.tensors()) {
    if (node.initial.elements() > 1024) CHECK(node.initial.explicitValues() == nullptr);
  }
}

}  // namespace
}  // namespace tessera
