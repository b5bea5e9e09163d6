#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iterator>
#include <numbers>
#include <random>
#include <set>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "json_reader.hpp"
#include "tessera/lib/json.hpp"
#include "tessera/app/config_notes.hpp"
#include "tessera/app/run_config.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const std::vector<std::string> kSampleConfigs = {"mnist.json", "mnist_rts.json", "rts_recipe.json",
                                                 "multipod_recipe.json", "gpt2_xl_pod64.json"};

LoadedRunConfig parse(const std::string& text, const std::vector<std::string>& overrides = {}) {
  return parseRunConfig(text, "cfg.json", overrides);
}

// The leaves of a dump: scalars, arrays and empty objects.
void jsonLeaves(const json& value, const std::string& path, std::vector<std::string>& out) {
  if (!value.is_object() || value.empty()) {
    out.push_back(path);
    return;
  }
  for (const auto& [key, member] : value.items()) jsonLeaves(member, jsonio::childPath(path, key), out);
}

RunConfig nonDefaultConfig(OptimizerType type) {
  RunConfig c;
  c.sessionOptions.enableReplicatedGraphs = true;
  c.sessionOptions.replicatedGraphCount = 2;
  c.sessionOptions.weightTensorLocationSettings.location.replicatedTensorSharding =
      ReplicatedTensorSharding::On;
  c.sessionOptions.tensorLocationSettingsOverride["W0"] = TensorLocation(TensorStorage::OffChip);
  c.device.tilesPerIpu = 256;
  c.device.computeFlopsPerSecond = 1e12;
  c.model.layers = {784, 7, 10};
  c.model.activation = Activation::Tanh;
  c.optimizer.type = type;
  if (type == OptimizerType::Sgd) {
    c.optimizer.sgd = SgdOptions{
        .learningRate = 0.05, .momentum = 0.9, .dampening = 0, .weightDecay = 1e-4, .nesterov = true};
  } else {
    c.optimizer.adam.learningRate = 3e-4;
    c.optimizer.adam.beta2 = 0.98;
    c.optimizer.adam.weightDecay = 0.01;
    c.optimizer.adam.decoupledWeightDecay = type == OptimizerType::AdamW;
  }
  c.data = DataConfig{.dataset = DatasetKind::Synthetic,
                      .path = "data/x",
                      .batchSize = 8,
                      .testBatchSize = 10,
                      .epochs = 3,
                      .seed = -7,
                      .limitTrainSamples = 640,
                      .limitTestSamples = 100,
                      .shuffle = false};
  c.output =
      OutputConfig{.checkpoint = "out/model.safetensors", .profile = "out/profile.json", .trace = "t.json"};
  return c;
}

// --- Sample configs ---------------------------------------------------------------

TEST_CASE("the sample configs load and validate") {
  for (const std::string& name : kSampleConfigs) {
    CAPTURE(name);
    const LoadedRunConfig loaded = loadRunConfig(test::sourcePath("samples/configs/" + name));
    CHECK_NOTHROW(validate(loaded.config));
  }
}

TEST_CASE("the sample configs say what they are meant to") {
  const auto load = [](const std::string& name) {
    return loadRunConfig(test::sourcePath("samples/configs/" + name)).config;
  };
  const RunConfig mnist = load("mnist.json");
  CHECK(mnist.model.layers == std::vector<int64_t>{784, 256, 128, 10});
  CHECK(mnist.model.activation == Activation::Relu);
  CHECK(mnist.data.dataset == DatasetKind::FashionMnist);
  CHECK(mnist.data.batchSize == 64);
  CHECK(mnist.data.epochs == 10);
  CHECK(mnist.data.seed == 0);
  CHECK(mnist.optimizer.type == OptimizerType::Adam);
  CHECK(mnist.optimizer.adam.learningRate == 0.001);
  CHECK(mnist.sessionOptions.getLocalReplicationFactor() == 1);

  const RunConfig rts = load("mnist_rts.json");
  CHECK(rts.model == mnist.model);
  CHECK(rts.sessionOptions.getLocalReplicationFactor() == 2);
  for (const TensorCategory category : {TensorCategory::Weight, TensorCategory::OptimizerState}) {
    const TensorLocationSettings& settings = rts.sessionOptions.locationSettings(category);
    CHECK(settings.location.replicatedTensorSharding == ReplicatedTensorSharding::On);
    CHECK(settings.minElementsForReplicatedTensorSharding == 2);
  }
  CHECK(rts.optimizer.type == OptimizerType::Sgd);
  CHECK(rts.optimizer.sgd.learningRate == 0.05);
  CHECK(rts.optimizer.sgd.momentum == 0.9);
  CHECK(rts.data.batchSize == 32);
  CHECK(rts.data.epochs == 2);

  const RunConfig recipe = load("rts_recipe.json");
  CHECK(recipe.sessionOptions.getLocalReplicationFactor() == 4);
  CHECK(recipe.sessionOptions.weightTensorLocationSettings.minElementsForReplicatedTensorSharding == 4);
  CHECK(recipe.sessionOptions.optimizerStateTensorLocationSettings.location.replicatedTensorSharding ==
        ReplicatedTensorSharding::On);

  const RunConfig multipod = load("multipod_recipe.json");
  const SessionOptions& o = multipod.sessionOptions;
  CHECK(o.getGlobalReplicationFactor() == 4);
  CHECK(o.getLocalReplicationFactor() == 2);
  CHECK(o.getGlobalReplicaOffset() == 0);
  CHECK(o.optimizerStateTensorLocationSettings.location.replicatedTensorSharding ==
        ReplicatedTensorSharding::On);
  CHECK(o.optimizerStateTensorLocationSettings.minElementsForReplicatedTensorSharding == 2);
  CHECK(o.weightTensorLocationSettings.location.replicatedTensorSharding == ReplicatedTensorSharding::Off);
  for (const TensorCategory category :
       {TensorCategory::Weight, TensorCategory::OptimizerState, TensorCategory::Accumulator}) {
    CHECK(o.locationSettings(category).location.shardingDomain == CommGroup(CommGroupType::Consecutive, 2));
  }
}

// --- Round trips --------------------------------------------------------------------

TEST_CASE("run configs and their sections survive a round trip") {
  for (const RunConfig& config :
       {RunConfig{}, nonDefaultConfig(OptimizerType::Sgd), nonDefaultConfig(OptimizerType::Adam),
        nonDefaultConfig(OptimizerType::AdamW)}) {
    const json j = config;
    CHECK(j.get<RunConfig>() == config);
    CHECK(json(j.get<RunConfig>()).dump() == j.dump());
    CHECK(parse(j.dump()).config == config);
    CHECK(json(config.model).get<ModelConfig>() == config.model);
    CHECK(json(config.optimizer).get<OptimizerConfig>() == config.optimizer);
    CHECK(json(config.data).get<DataConfig>() == config.data);
    CHECK(json(config.output).get<OutputConfig>() == config.output);
  }
  for (const auto& [value, name] : EnumNames<Activation>::kNames)
    CHECK(json(value).get<Activation>() == value);
  for (const auto& [value, name] : EnumNames<DatasetKind>::kNames)
    CHECK(json(value).get<DatasetKind>() == value);
  for (const auto& [value, name] : EnumNames<Provenance>::kNames) {
    CHECK(json(value) == std::string(name));
    CHECK(json(value).get<Provenance>() == value);
  }
}

TEST_CASE("the optimizer section is flat and holds the options of its type") {
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.05;
  sgd.sgd.momentum = 0.9;
  CHECK(json(sgd) == json{{"type", "SGD"},
                          {"learningRate", 0.05},
                          {"momentum", 0.9},
                          {"dampening", 0.0},
                          {"weightDecay", 0.0},
                          {"nesterov", false},
                          {"lossScaling", 1.0},
                          {"accumType", "float32"},
                          {"accl1Type", "float32"},
                          {"masterWeights", true}});
  OptimizerConfig adamw;
  adamw.type = OptimizerType::AdamW;
  adamw.adam.decoupledWeightDecay = true;
  const json j = adamw;
  CHECK(j["type"] == "AdamW");
  CHECK_FALSE(j.contains("decoupledWeightDecay"));
  CHECK_FALSE(j.contains("momentum"));
  CHECK(j["beta1"] == 0.9);

  CHECK(json::parse(R"({"type": "AdamW"})").get<OptimizerConfig>().adam.decoupledWeightDecay);
  CHECK_FALSE(json::parse(R"({"type": "Adam"})").get<OptimizerConfig>().adam.decoupledWeightDecay);
  const auto read =
      json::parse(R"({"type": "SGD", "learningRate": 0.05, "momentum": 0.9})").get<OptimizerConfig>();
  CHECK(read.type == OptimizerType::Sgd);
  CHECK(read.sgd.learningRate == 0.05);
  CHECK(read.sgd.momentum == 0.9);
  CHECK(read.adam == AdamOptions{});
  // Without a type the section is SGD.
  CHECK(json::parse(R"({"momentum": 0.5})").get<OptimizerConfig>().sgd.momentum == 0.5);
}

// --- Strict reading -----------------------------------------------------------------

struct BadConfig {
  const char* name;
  std::string text;
  ErrorCode code;
  std::string subject;
  std::string fragment;
};

TEST_CASE("parseRunConfig rejects bad input at the JSON pointer of the value, naming the source") {
  const std::vector<BadConfig> cases = {
      {"unknown section", R"({"sessionOption": {}})", ErrorCode::UnknownKey, "/sessionOption",
       "did you mean \"sessionOptions\"?); allowed keys: data, device, io, limits, model, optimizer, output, "
       "schedule, sessionOptions"},
      {"unknown option", R"({"sessionOptions": {"replicatedGraphCont": 2}})", ErrorCode::UnknownKey,
       "/sessionOptions/replicatedGraphCont", "did you mean \"replicatedGraphCount\""},
      {"root not an object", R"([])", ErrorCode::WrongType, "",
       "expected an object (the run config), got an array"},
      {"section not an object", R"({"device": 5})", ErrorCode::WrongType, "/device", "expected an object"},
      {"wrong type in a section", R"({"sessionOptions": {"replicatedGraphCount": "4"}})",
       ErrorCode::WrongType, "/sessionOptions/replicatedGraphCount", "expected an integer, got string \"4\""},
      {"invalid enum",
       R"({"sessionOptions": {"weightTensorLocationSettings": {"location": {"storage": "onchip"}}}})",
       ErrorCode::InvalidEnumValue, "/sessionOptions/weightTensorLocationSettings/location/storage",
       "(did you mean \"OnChip\"?)"},
      {"SGD key under adam", R"({"optimizer": {"type": "Adam", "momentum": 0.9}})", ErrorCode::UnknownKey,
       "/optimizer/momentum",
       "unknown key \"momentum\" for optimizer type \"Adam\": it is an option of optimizer type \"SGD\""},
      {"Adam key under sgd", R"({"optimizer": {"beta1": 0.9}})", ErrorCode::UnknownKey, "/optimizer/beta1",
       "for optimizer type \"SGD\": it is an option of optimizer types \"Adam\" and \"AdamW\""},
      {"decoupledWeightDecay under sgd", R"({"optimizer": {"decoupledWeightDecay": false}})",
       ErrorCode::UnknownKey, "/optimizer/decoupledWeightDecay",
       "for optimizer type \"SGD\": the optimizer type decides it"},
      {"decoupledWeightDecay set by hand",
       R"({"optimizer": {"type": "AdamW", "decoupledWeightDecay": true}})", ErrorCode::UnknownKey,
       "/optimizer/decoupledWeightDecay", "the optimizer type decides it"},
      {"typo in an optimizer key", R"({"optimizer": {"type": "Adam", "lerningRate": 0.1}})",
       ErrorCode::UnknownKey, "/optimizer/lerningRate",
       "for optimizer type \"Adam\" (did you mean \"learningRate\"?)"},
      {"optimizer type in capitals", R"({"optimizer": {"type": "ADAMW"}})", ErrorCode::InvalidEnumValue,
       "/optimizer/type", "expected one of \"SGD\", \"Adam\", \"AdamW\" (did you mean \"AdamW\"?)"},
      {"zero learning rate", R"({"optimizer": {"learningRate": 0}})", ErrorCode::OutOfRange,
       "/optimizer/learningRate", "learningRate is 0; it must be > 0"},
      {"nesterov without momentum", R"({"optimizer": {"nesterov": true}})", ErrorCode::InvalidOptimizer,
       "/optimizer/nesterov", "nesterov needs momentum > 0"},
      {"unknown model type", R"({"model": {"type": "cnn"}})", ErrorCode::InvalidModel, "/model/type",
       "model type \"cnn\" is not supported; expected one of \"Mlp\", \"Onnx\", \"Transformer\""},
      {"misspelled model type", R"({"model": {"type": "onx"}})", ErrorCode::InvalidModel, "/model/type",
       "(did you mean \"Onnx\"?)"},
      {"onnx model without a path", R"({"model": {"type": "Onnx"}})", ErrorCode::InvalidModel, "/model/path",
       "model type \"Onnx\" needs the path of its .onnx file"},
      {"mlp key under onnx", R"({"model": {"type": "Onnx", "path": "m.onnx", "layers": [784, 10]}})",
       ErrorCode::UnknownKey, "/model/layers", "it is an option of model type \"Mlp\""},
      {"onnx key under mlp", R"({"model": {"loss": "loss"}})", ErrorCode::UnknownKey, "/model/loss",
       "it is an option of model type \"Onnx\""},
      {"typo in an onnx key", R"({"model": {"type": "Onnx", "path": "m.onnx", "los": "loss"}})",
       ErrorCode::UnknownKey, "/model/los", "(did you mean \"loss\"?)"},
      {"a dimension that is no count",
       R"({"model": {"type": "Onnx", "path": "m.onnx", "dimensions": {"batch": "batchsize"}}})",
       ErrorCode::InvalidModel, "/model/dimensions/batch", "(did you mean \"batchSize\"?)"},
      {"a dimension as a number",
       R"({"model": {"type": "Onnx", "path": "m.onnx", "dimensions": {"batch": 8}}})", ErrorCode::WrongType,
       "/model/dimensions/batch", ""},
      {"tensors without a path", R"({"data": {"dataset": "Tensors"}})", ErrorCode::InvalidData, "/data/path",
       "the Tensors dataset needs the path of its training .safetensors file"},
      {"a test file for an IDX dataset", R"({"data": {"dataset": "Synthetic", "test": "test.safetensors"}})",
       ErrorCode::InvalidData, "/data/test", "only the Tensors dataset reads"},
      {"one layer", R"({"model": {"layers": [784]}})", ErrorCode::InvalidModel, "/model/layers",
       "layers has 1 entry; it needs at least 2"},
      {"empty layer", R"({"model": {"layers": [784, 0, 10]}})", ErrorCode::InvalidModel, "/model/layers/1",
       "layers[1] is 0; it must be >= 1"},
      {"layer width as a float", R"({"model": {"layers": [784, 1.5, 10]}})", ErrorCode::WrongType,
       "/model/layers/1", "expected an integer"},
      {"layers not an array", R"({"model": {"layers": 784}})", ErrorCode::WrongType, "/model/layers",
       "expected an array"},
      {"invalid activation", R"({"model": {"activation": "ReLU"}})", ErrorCode::InvalidEnumValue,
       "/model/activation", "did you mean \"Relu\""},
      {"zero batch size", R"({"data": {"batchSize": 0}})", ErrorCode::OutOfRange, "/data/batchSize", ">= 1"},
      {"zero epochs", R"({"data": {"epochs": 0}})", ErrorCode::OutOfRange, "/data/epochs", ">= 1"},
      {"unknown schedule", R"({"schedule": {"type": "cosin"}})", ErrorCode::InvalidEnumValue, "/schedule/type",
       "did you mean \"Cosine\""},
      {"final factor above 1", R"({"schedule": {"type": "Cosine", "finalFactor": 1.5}})", ErrorCode::OutOfRange,
       "/schedule/finalFactor", "in [0, 1]"},
      {"decay factor 0", R"({"schedule": {"type": "Step", "gamma": 0}})", ErrorCode::OutOfRange, "/schedule/gamma",
       "in (0, 1]"},
      {"zero step epochs", R"({"schedule": {"stepEpochs": 0}})", ErrorCode::OutOfRange, "/schedule/stepEpochs",
       ">= 1"},
      {"negative limit", R"({"data": {"limitTestSamples": -1}})", ErrorCode::OutOfRange,
       "/data/limitTestSamples", ">= 0"},
      {"mnist without a path", R"({"data": {"dataset": "Mnist"}})", ErrorCode::InvalidData, "/data/path",
       "the Mnist dataset needs a path"},
      {"invalid dataset", R"({"data": {"dataset": "fashion_mnist"}})", ErrorCode::InvalidEnumValue,
       "/data/dataset", "did you mean \"FashionMnist\""},
      {"number for a path", R"({"output": {"checkpoint": 5}})", ErrorCode::WrongType, "/output/checkpoint",
       "expected a string, got integer 5"},
      {"no tiles", R"({"device": {"tilesPerIpu": 0}})", ErrorCode::OutOfRange, "/device/tilesPerIpu", ">= 1"},
      {"duplicate key", R"({"data": {"epochs": 1, "epochs": 2}})", ErrorCode::DuplicateKey, "/data/epochs",
       "duplicate key \"epochs\""},
  };
  for (const BadConfig& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { parse(c.text); });
    REQUIRE_MESSAGE(error.has_value(), "no error for ", c.text);
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
    CHECK(error->detail().ends_with("(in cfg.json)"));
  }
  const auto syntax = test::catchError<ConfigError>([] { parse("{\"data\": {\"epochs\": 1,}}"); });
  REQUIRE(syntax.has_value());
  CHECK(syntax->code() == ErrorCode::JsonSyntax);
  CHECK(syntax->subject() == "cfg.json:1:23");
}

TEST_CASE("the lowercase spellings of enum values are refused with the PascalCase name") {
  struct Old {
    const char* section;
    const char* key;
    const char* written;
    const char* name;
  };
  const std::vector<Old> cases = {
      {"optimizer", "type", "sgd", "SGD"},          {"optimizer", "type", "adamw", "AdamW"},
      {"model", "activation", "gelu", "Gelu"},      {"model", "type", "transformer", "Transformer"},
      {"data", "dataset", "fashion-mnist", "FashionMnist"}, {"schedule", "type", "cosine", "Cosine"},
  };
  for (const Old& c : cases) {
    const std::string pointer = fmt::format("/{}/{}", c.section, c.key);
    INFO(pointer << " = " << c.written);
    const std::string hint = fmt::format("(did you mean \"{}\"?)", c.name);
    const ErrorCode code = std::string_view(c.section) == "model" && std::string_view(c.key) == "type"
                               ? ErrorCode::InvalidModel
                               : ErrorCode::InvalidEnumValue;
    // In a file and in a --set override alike.
    const auto inFile = test::catchError<ConfigError>(
        [&] { parse(fmt::format(R"({{"{}": {{"{}": "{}"}}}})", c.section, c.key, c.written)); });
    REQUIRE(inFile.has_value());
    CHECK(inFile->code() == code);
    CHECK(inFile->subject() == pointer);
    CHECK(inFile->detail().find(hint) != std::string::npos);
    const auto inSet = test::catchError<ConfigError>(
        [&] { parse("{}", {fmt::format("{}=\"{}\"", pointer, c.written)}); });
    REQUIRE(inSet.has_value());
    CHECK(inSet->code() == code);
    CHECK(inSet->detail().find(hint) != std::string::npos);
    // The new spelling reads.
    CHECK_NOTHROW(parse("{}", {fmt::format("{}=\"{}\"", pointer, c.name)}));
  }
  // dtypes stay lowercase: type names as NumPy and PyTorch spell them.
  const auto dtype = test::catchError<ConfigError>([] { parse(R"({"model": {"dtype": "Float16"}})"); });
  REQUIRE(dtype.has_value());
  CHECK(dtype->detail().find("(did you mean \"float16\"?)") != std::string::npos);
  CHECK(enumFromFoldedString<DatasetKind>("fashion-mnist") == DatasetKind::FashionMnist);
  CHECK(enumFromFoldedString<OptimizerType>("adamw") == OptimizerType::AdamW);
  CHECK(enumFromFoldedString<OptimizerType>("adamx") == std::nullopt);
}

// --- validate(RunConfig) -------------------------------------------------------------

TEST_CASE("validate checks the device, the options against it, and every section") {
  struct Case {
    const char* name;
    std::function<void(RunConfig&)> change;
    ErrorCode code;
    std::string subject;
  };
  const std::vector<Case> cases = {
      {"replicas without replication", [](RunConfig& c) { c.sessionOptions.replicatedGraphCount = 2; },
       ErrorCode::ReplicationDisabledButCount, "/sessionOptions/replicatedGraphCount"},
      {"IO tiles beyond the device",
       [](RunConfig& c) {
         c.sessionOptions.numIOTiles = 64;
         c.device.tilesPerIpu = 64;
       },
       ErrorCode::IOTilesExceedTiles, "/sessionOptions/numIOTiles"},
      {"device without tiles", [](RunConfig& c) { c.device.tilesPerIpu = 0; }, ErrorCode::OutOfRange,
       "/device/tilesPerIpu"},
      {"device memory beyond 64 bits",
       [](RunConfig& c) {
         c.device.tilesPerIpu = int64_t{1} << 40;
         c.device.bytesPerTile = int64_t{1} << 40;
       },
       ErrorCode::InvalidDeviceSpec, "/device/bytesPerTile"},
      {"model type", [](RunConfig& c) { c.model.type = "cnn"; }, ErrorCode::InvalidModel, "/model/type"},
      {"one layer", [](RunConfig& c) { c.model.layers = {784}; }, ErrorCode::InvalidModel, "/model/layers"},
      {"no layers", [](RunConfig& c) { c.model.layers.clear(); }, ErrorCode::InvalidModel, "/model/layers"},
      {"input width of the dataset",
       [](RunConfig& c) {
         c.model.layers = {100, 10};
       },
       ErrorCode::InvalidModel, "/model/layers/0"},
      {"classes of the dataset",
       [](RunConfig& c) {
         c.model.layers = {784, 64, 5};
       },
       ErrorCode::InvalidModel, "/model/layers/2"},
      {"learning rate", [](RunConfig& c) { c.optimizer.sgd.learningRate = -1; }, ErrorCode::OutOfRange,
       "/optimizer/learningRate"},
      {"adam options checked for adam",
       [](RunConfig& c) {
         c.optimizer.type = OptimizerType::Adam;
         c.optimizer.adam.beta1 = 1;
       },
       ErrorCode::OutOfRange, "/optimizer/beta1"},
      {"decoupled weight decay that contradicts the type",
       [](RunConfig& c) {
         c.optimizer.type = OptimizerType::Adam;
         c.optimizer.adam.decoupledWeightDecay = true;
       },
       ErrorCode::InvalidOptimizer, "/optimizer/type"},
      {"nesterov", [](RunConfig& c) { c.optimizer.sgd.nesterov = true; }, ErrorCode::InvalidOptimizer,
       "/optimizer/nesterov"},
      {"epochs", [](RunConfig& c) { c.data.epochs = 0; }, ErrorCode::OutOfRange, "/data/epochs"},
      {"mnist without a path", [](RunConfig& c) { c.data.dataset = DatasetKind::Mnist; },
       ErrorCode::InvalidData, "/data/path"},
      {"a training subset smaller than a step",
       [](RunConfig& c) {
         c.sessionOptions.enableReplicatedGraphs = true;
         c.sessionOptions.replicatedGraphCount = 2;
         c.data.batchSize = 64;
         c.data.limitTrainSamples = 100;
       },
       ErrorCode::InvalidData, "/data/limitTrainSamples"},
  };
  CHECK_NOTHROW(validate(RunConfig{}));
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    RunConfig config;
    c.change(config);
    const auto error = test::catchError<ConfigError>([&] { validate(config); });
    REQUIRE(error.has_value());
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
  }
  // The synthetic set stands in for Fashion-MNIST: 784 pixels, 10 classes.
  RunConfig synthetic;
  synthetic.data.dataset = DatasetKind::Synthetic;
  synthetic.model.layers = {784, 16, 10};
  synthetic.data.limitTrainSamples = 64;
  CHECK_NOTHROW(validate(synthetic));
  for (const auto& [layers, subject] : std::vector<std::pair<std::vector<int64_t>, std::string>>{
           {{16, 10}, "/model/layers/0"}, {{784, 16, 2}, "/model/layers/2"}}) {
    synthetic.model.layers = layers;
    const auto error = test::catchError<ConfigError>([&] { validate(synthetic); });
    REQUIRE(error.has_value());
    CHECK(error->code() == ErrorCode::InvalidModel);
    CHECK(error->subject() == subject);
    CHECK(std::string(error->what()).find("Synthetic") != std::string::npos);
  }
  for (const OptimizerType type : {OptimizerType::Sgd, OptimizerType::Adam, OptimizerType::AdamW}) {
    CHECK_NOTHROW(validate(nonDefaultConfig(type)));
  }
}

TEST_CASE("reading a section and validating it give the same code and path") {
  struct Case {
    const char* name;
    std::function<void(RunConfig&)> change;
    std::string text;
  };
  const std::vector<Case> cases = {
      {"model type", [](RunConfig& c) { c.model.type = "rnn"; }, R"({"model": {"type": "rnn"}})"},
      {"layer count", [](RunConfig& c) { c.model.layers = {10}; }, R"({"model": {"layers": [10]}})"},
      {"layer width",
       [](RunConfig& c) {
         c.model.layers = {784, -3, 10};
       },
       R"({"model": {"layers": [784, -3, 10]}})"},
      {"momentum", [](RunConfig& c) { c.optimizer.sgd.momentum = 1.5; },
       R"({"optimizer": {"momentum": 1.5}})"},
      {"eps",
       [](RunConfig& c) {
         c.optimizer.type = OptimizerType::AdamW;
         c.optimizer.adam.decoupledWeightDecay = true;
         c.optimizer.adam.eps = 0;
       },
       R"({"optimizer": {"type": "AdamW", "eps": 0}})"},
      {"nesterov",
       [](RunConfig& c) {
         c.optimizer.sgd.nesterov = true;
         c.optimizer.sgd.momentum = 0.9;
         c.optimizer.sgd.dampening = 0.5;
       },
       R"({"optimizer": {"nesterov": true, "momentum": 0.9, "dampening": 0.5}})"},
      {"test batch size", [](RunConfig& c) { c.data.testBatchSize = 0; },
       R"({"data": {"testBatchSize": 0}})"},
      {"mnist path", [](RunConfig& c) { c.data.dataset = DatasetKind::Mnist; },
       R"({"data": {"dataset": "Mnist"}})"},
      {"device", [](RunConfig& c) { c.device.streamingBandwidthBytesPerSecond = 0; },
       R"({"device": {"streamingBandwidthBytesPerSecond": 0}})"},
  };
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    RunConfig config;
    c.change(config);
    const auto validated = test::catchError<ConfigError>([&] { validate(config); });
    const auto read = test::catchError<ConfigError>([&] { parse(c.text); });
    REQUIRE(validated.has_value());
    REQUIRE(read.has_value());
    CHECK(validated->code() == read->code());
    CHECK(validated->subject() == read->subject());
  }
}

// --- Overrides ------------------------------------------------------------------------

TEST_CASE("overrides set numbers, strings, objects and array entries before reading") {
  const std::string file = R"({"data": {"epochs": 2}, "model": {"layers": [784, 256, 10]}})";
  const RunConfig c = parse(file,
                            {
                                "/sessionOptions/enableReplicatedGraphs=true",
                                "/sessionOptions/replicatedGraphCount=4",
                                "/optimizer/learningRate=0.1",
                                "/data/dataset=Synthetic",
                                "/data/path=",
                                "/output/checkpoint=out/model.safetensors",
                                "/output/profile=\"quoted.json\"",
                                "/model/layers/1=300",
                                "/data/epochs=5",
                                "/data/epochs=7",
                            })
                          .config;
  CHECK(c.sessionOptions.enableReplicatedGraphs);
  CHECK(c.sessionOptions.replicatedGraphCount == 4);
  CHECK(c.optimizer.sgd.learningRate == 0.1);
  CHECK(c.data.dataset == DatasetKind::Synthetic);
  CHECK(c.data.path.empty());
  CHECK(c.output.checkpoint == "out/model.safetensors");
  CHECK(c.output.profile == "quoted.json");
  CHECK(c.model.layers == std::vector<int64_t>{784, 300, 10});
  CHECK(c.data.epochs == 7);  // the last override wins
}

TEST_CASE("overrides create missing objects and replace whole ones") {
  const RunConfig created =
      parse("{}",
            {"/sessionOptions/weightTensorLocationSettings/location/storage=OffChip",
             "/sessionOptions/tensorLocationSettingsOverride/a~1b~0c={\"replicatedTensorSharding\": \"On\"}"})
          .config;
  CHECK(created.sessionOptions.weightTensorLocationSettings.location.storage == TensorStorage::OffChip);
  REQUIRE(created.sessionOptions.tensorLocationSettingsOverride.contains("a/b~c"));
  CHECK(created.sessionOptions.tensorLocationSettingsOverride.at("a/b~c").replicatedTensorSharding ==
        ReplicatedTensorSharding::On);

  const std::string file =
      R"({"sessionOptions": {"weightTensorLocationSettings":
        {"location": {"storage": "OffChip", "loadTileSet": "IO"}}}})";
  const RunConfig replaced =
      parse(file,
            {"/sessionOptions/weightTensorLocationSettings/location={\"replicatedTensorSharding\": \"On\"}"})
          .config;
  const TensorLocation& location = replaced.sessionOptions.weightTensorLocationSettings.location;
  CHECK(location.storage == TensorStorage::OnChip);
  CHECK(location.loadTileSet == TileSet::Compute);
  CHECK(location.replicatedTensorSharding == ReplicatedTensorSharding::On);
  CHECK(parse("{}", {"/optimizer={\"type\": \"Adam\", \"beta1\": 0.5}"}).config.optimizer.adam.beta1 == 0.5);
}

TEST_CASE("overridden values are read as strictly as the file, and errors name the override") {
  const std::vector<BadConfig> cases = {
      {"word for an integer", "/data/epochs=zero", ErrorCode::WrongType, "/data/epochs",
       "expected an integer, got string \"zero\" (in --set /data/epochs=zero)"},
      {"unknown key", "/data/epoch=3", ErrorCode::UnknownKey, "/data/epoch",
       "did you mean \"epochs\"?); allowed keys: batchSize"},
      {"out of range", "/sessionOptions/replicatedGraphCount=0", ErrorCode::OutOfRange,
       "/sessionOptions/replicatedGraphCount", "(in --set /sessionOptions/replicatedGraphCount=0)"},
      {"below an override", "/sessionOptions/weightTensorLocationSettings={\"location\": {\"storage\": 1}}",
       ErrorCode::WrongType, "/sessionOptions/weightTensorLocationSettings/location/storage",
       "(in --set /sessionOptions"},
      {"duplicate key in a value", "/sessionOptions={\"numIOTiles\": 0, \"numIOTiles\": 32}",
       ErrorCode::DuplicateKey, "/sessionOptions/numIOTiles", "duplicate key \"numIOTiles\""},
  };
  for (const BadConfig& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { parse(R"({"data": {"epochs": 2}})", {c.text}); });
    REQUIRE(error.has_value());
    INFO(std::string(error->what()));
    CHECK(error->code() == c.code);
    CHECK(error->subject() == c.subject);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
}

TEST_CASE("malformed overrides are BadOverride naming the override") {
  struct Case {
    const char* name;
    std::string text;
    std::string fragment;
  };
  const std::vector<Case> cases = {
      {"no '='", "/data/epochs", "missing \"=\""},
      {"no leading '/'", "data/epochs=3", "must be a JSON pointer starting with \"/\""},
      {"empty path", "=3", "starting with \"/\""},
      {"bad escape", "/sessionOptions/tensorLocationSettingsOverride/a~2=1", "\"~\" must be followed by 0"},
      {"through a number", "/data/epochs/x=3",
       "goes through /data/epochs, which holds integer 2, not an object"},
      {"through a string", "/model/type/x=1", "which holds string \"Mlp\""},
      {"array index out of range", "/model/layers/3=1", "/model/layers is an array of 3 entries"},
      {"array index not a number", "/model/layers/first=1", "\"first\" is not the index"},
      {"array index with a leading zero", "/model/layers/01=1", "\"01\" is not the index"},
  };
  const std::string file = R"({"data": {"epochs": 2}, "model": {"type": "Mlp", "layers": [784, 64, 10]}})";
  for (const Case& c : cases) {
    INFO(std::string(c.name));
    const auto error = test::catchError<ConfigError>([&] { parse(file, {c.text}); });
    REQUIRE(error.has_value());
    INFO(std::string(error->what()));
    CHECK(error->code() == ErrorCode::BadOverride);
    CHECK(error->subject() == c.text);
    CHECK(error->detail().find(c.fragment) != std::string::npos);
  }
}

// --- Provenance -------------------------------------------------------------------------

TEST_CASE("provenance says where every leaf value came from") {
  const std::string file = R"({
    "sessionOptions": {
      "replicatedGraphCount": 1,
      "weightTensorLocationSettings": {"location": {"replicatedTensorSharding": "On"}},
      "tensorLocationSettingsOverride": {"w/1": {"storage": "OffChip"}}
    },
    "optimizer": {"type": "Adam", "learningRate": 0.001},
    "model": {"layers": [784, 10]},
    "data": {"epochs": 2}
  })";
  const LoadedRunConfig loaded =
      parse(file, {"/data/epochs=3", "/sessionOptions/activationTensorLocationSettings/location={}",
                   "/model/layers/0=784", "/output/trace=t.json"});
  const auto& p = loaded.provenance;
  const auto at = [&](const std::string& path) {
    CAPTURE(path);
    REQUIRE(p.contains(path));
    return p.at(path);
  };
  CHECK(at("/sessionOptions/replicatedGraphCount") == Provenance::File);
  CHECK(at("/sessionOptions/weightTensorLocationSettings/location/replicatedTensorSharding") ==
        Provenance::File);
  CHECK(at("/sessionOptions/weightTensorLocationSettings/location/storage") == Provenance::Default);
  CHECK(at("/sessionOptions/numIOTiles") == Provenance::Default);
  CHECK(at("/sessionOptions/tensorLocationSettingsOverride/w~11/storage") == Provenance::File);
  CHECK(at("/sessionOptions/tensorLocationSettingsOverride/w~11/loadTileSet") == Provenance::Default);
  CHECK(at("/sessionOptions/activationTensorLocationSettings/location/storage") == Provenance::Set);
  CHECK(at("/sessionOptions/activationTensorLocationSettings/location/shardingDomain/type") ==
        Provenance::Set);
  CHECK(at("/sessionOptions/activationTensorLocationSettings/minElementsForOffChip") == Provenance::Default);
  CHECK(at("/optimizer/type") == Provenance::File);
  CHECK(at("/optimizer/learningRate") == Provenance::File);
  CHECK(at("/optimizer/beta1") == Provenance::Default);
  CHECK(at("/model/layers") == Provenance::Set);  // an entry was overridden
  CHECK(at("/model/type") == Provenance::Default);
  CHECK(at("/data/epochs") == Provenance::Set);
  CHECK(at("/data/batchSize") == Provenance::Default);
  CHECK(at("/output/trace") == Provenance::Set);
  CHECK_FALSE(p.contains("/optimizer/momentum"));  // not an option of adam

  // Exactly the leaves of the canonical dump.
  std::vector<std::string> leaves;
  jsonLeaves(json(loaded.config), "", leaves);
  std::vector<std::string> keys;
  for (const auto& [path, source] : p) keys.push_back(path);
  std::sort(leaves.begin(), leaves.end());
  CHECK(keys == leaves);
}

TEST_CASE("an empty map is a leaf of its own") {
  const LoadedRunConfig defaults = parse("{}");
  CHECK(defaults.provenance.at("/sessionOptions/tensorLocationSettingsOverride") == Provenance::Default);
  const LoadedRunConfig fromFile = parse(R"({"sessionOptions": {"tensorLocationSettingsOverride": {}}})");
  CHECK(fromFile.provenance.at("/sessionOptions/tensorLocationSettingsOverride") == Provenance::File);
  for (const auto& entry : defaults.provenance) {
    CAPTURE(entry.first);
    CHECK(entry.second == Provenance::Default);
  }
}

// --- Files --------------------------------------------------------------------------------

TEST_CASE("loadRunConfig names the file in IO and syntax errors") {
  // A name of its own, so that test runs of several build folders do not meet.
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("tessera_run_config_test_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir);
  const std::string missing = (dir / "missing.json").string();
  const auto notFound = test::catchError<IoError>([&] { loadRunConfig(missing); });
  REQUIRE(notFound.has_value());
  CHECK(notFound->code() == ErrorCode::FileUnreadable);
  CHECK(notFound->subject() == missing);
  CHECK(notFound->detail() == "cannot read the file: No such file or directory");

  const auto directory = test::catchError<IoError>([&] { loadRunConfig(dir.string()); });
  REQUIRE(directory.has_value());
  CHECK(directory->code() == ErrorCode::FileUnreadable);
  CHECK(directory->detail() == "cannot read the file: it is a folder, not a regular file");

  const std::string broken = (dir / "broken.json").string();
  std::ofstream(broken) << "{\n  \"data\": {\n    \"epochs\": 3,\n  }\n}\n";
  const auto syntax = test::catchError<ConfigError>([&] { loadRunConfig(broken); });
  REQUIRE(syntax.has_value());
  CHECK(syntax->code() == ErrorCode::JsonSyntax);
  CHECK(syntax->subject() == broken + ":4:3");

  const std::string good = (dir / "good.json").string();
  std::ofstream(good) << R"({"data": {"epochs": 3}})";
  const LoadedRunConfig loaded = loadRunConfig(good, {"/data/batchSize=16"});
  CHECK(loaded.config.data.epochs == 3);
  CHECK(loaded.config.data.batchSize == 16);
  const auto wrong = test::catchError<ConfigError>([&] { loadRunConfig(good, {"/data/epochs=-1"}); });
  REQUIRE(wrong.has_value());
  CHECK(wrong->detail().ends_with("(in --set /data/epochs=-1)"));
  std::filesystem::remove_all(dir);
}

TEST_CASE("the files of an ONNX model and a tensors dataset are relative to the config file") {
  const std::filesystem::path dir = std::filesystem::temp_directory_path() /
                                    ("tessera_run_config_test_" + std::to_string(std::random_device{}()));
  std::filesystem::create_directories(dir / "configs");
  const std::filesystem::path file = dir / "configs" / "run.json";
  {
    std::ofstream out(file);
    out << R"({"model": {"type": "Onnx", "path": "models/mlp.onnx"},
               "data": {"dataset": "Tensors", "path": "../data/train.safetensors", "test": "/abs/test.safetensors"}})";
  }
  const RunConfig config = loadRunConfig(file.string()).config;
  CHECK(config.model.path == (dir / "configs/models/mlp.onnx").generic_string());
  CHECK(config.data.path == (dir / "data/train.safetensors").generic_string());
  CHECK(config.data.test == "/abs/test.safetensors");
  // Parsed from text, the paths stay as given; an IDX folder is not moved.
  CHECK(parse(R"({"model": {"type": "Onnx", "path": "m.onnx"}})").config.model.path == "m.onnx");
  {
    std::ofstream out(file);
    out << R"({"data": {"dataset": "Mnist", "path": "idx"}})";
  }
  CHECK(loadRunConfig(file.string()).config.data.path == "idx");
  std::filesystem::remove_all(dir);
}

// --- Schema -----------------------------------------------------------------------------------

// Checks that `node` describes exactly the keys of `value` (a dump), closed,
// with a description for every property and the dump's defaults.
void checkSchemaCovers(const json& node, const json& value, const std::string& path) {
  CAPTURE(path);
  if (node.contains("oneOf")) {
    return;  // the optimizer section: checked on its own
  }
  if (value.is_object() && node.contains("properties")) {
    CHECK(node["type"] == "object");
    CHECK(node["additionalProperties"] == false);
    std::set<std::string> schemaKeys;
    for (const auto& [key, property] : node["properties"].items()) schemaKeys.insert(key);
    std::set<std::string> dumpKeys;
    for (const auto& [key, member] : value.items()) dumpKeys.insert(key);
    CHECK(schemaKeys == dumpKeys);
    for (const auto& [key, member] : value.items()) {
      const json& property = node["properties"][key];
      CHECK_FALSE(property.value("description", std::string()).empty());
      checkSchemaCovers(property, member, path + "/" + key);
    }
    return;
  }
  if (node.contains("default")) CHECK(node["default"] == value);
}

void collectEnums(const json& node, std::set<std::vector<std::string>>& out) {
  if (node.is_object()) {
    if (node.contains("enum")) out.insert(node["enum"].get<std::vector<std::string>>());
    for (const auto& [key, member] : node.items()) collectEnums(member, out);
  } else if (node.is_array()) {
    for (const json& member : node) collectEnums(member, out);
  }
}

template <NamedEnum E>
std::vector<std::string> names() {
  std::vector<std::string> out;
  for (const auto& [value, name] : EnumNames<E>::kNames) out.emplace_back(name);
  return out;
}

TEST_CASE("the run config schema is generated from the field tables") {
  const json schema = runConfigSchema();
  CHECK(schema["$schema"] == "https://json-schema.org/draft/2020-12/schema");
  CHECK(schema["title"] == "tessera run config");
  checkSchemaCovers(schema, json(RunConfig{}), "");

  // The optimizer: one closed alternative per type, each with the keys of
  // that type's dump.
  const json& optimizer = schema["properties"]["optimizer"];
  REQUIRE(optimizer.contains("oneOf"));
  CHECK_FALSE(optimizer["description"].get<std::string>().empty());
  std::vector<std::string> consts;
  for (const json& alternative : optimizer["oneOf"]) {
    const std::string type = alternative["properties"]["type"]["const"];
    consts.push_back(type);
    OptimizerConfig config;
    config.type = *enumFromString<OptimizerType>(type);
    config.adam.decoupledWeightDecay = config.type == OptimizerType::AdamW;
    checkSchemaCovers(alternative, json(config), "/optimizer(" + type + ")");
  }
  CHECK(consts == names<OptimizerType>());
  CHECK(optimizer["oneOf"][0]["properties"]["type"]["default"] == "SGD");
  CHECK_FALSE(optimizer["oneOf"][0].contains("required"));
  CHECK(optimizer["oneOf"][1]["required"] == json{"type"});

  // Enum lists are the name tables.
  std::set<std::vector<std::string>> enums;
  collectEnums(schema, enums);
  const std::set<std::vector<std::string>> expected = {
      names<TensorStorage>(), names<TileSet>(),       names<ReplicatedTensorSharding>(),
      names<CommGroupType>(), names<ReductionType>(), names<MeanReductionStrategy>(),
      names<Activation>(),    names<DatasetKind>(),   names<ScheduleType>(), names<RecomputationType>(),
      names<VirtualGraphMode>(), names<ExecutionPhaseIOSchedule>(), names<ExecutionPhaseSchedule>(),
      names<ExchangeStrategy>(),
      {"float32", "float16"},  // /model/dtype: the floating DTypes
      names<DType>(),          // optimizer state dtypes
  };
  CHECK(enums == expected);

  // The model: one closed alternative per type, each with the keys of that
  // type's dump; onnx requires its path.
  const json& model = schema["properties"]["model"];
  REQUIRE(model.contains("oneOf"));
  CHECK_FALSE(model["description"].get<std::string>().empty());
  std::vector<std::string> modelTypes;
  for (const json& alternative : model["oneOf"]) {
    const std::string type = alternative["properties"]["type"]["const"];
    modelTypes.push_back(type);
    ModelConfig config;
    config.type = type;
    checkSchemaCovers(alternative, json(config), "/model(" + type + ")");
  }
  CHECK(modelTypes == std::vector<std::string>{"Mlp", "Onnx", "Transformer"});
  CHECK(model["oneOf"][2]["required"] == json{"type"});
  CHECK(model["oneOf"][2]["properties"]["heads"]["minimum"] == 1);
  CHECK(model["oneOf"][2]["properties"]["tiedHead"]["default"] == true);
  CHECK(model["oneOf"][1]["required"] == json{"type", "path"});
  CHECK(model["oneOf"][1]["properties"]["dimensions"]["additionalProperties"]["type"] == "string");
  CHECK(schema["properties"]["data"]["properties"].contains("test"));

  const json& layers = schema["properties"]["model"]["oneOf"][0]["properties"]["layers"];
  CHECK(layers["minItems"] == 2);
  CHECK(layers["items"]["minimum"] == 1);
  CHECK(schema["properties"]["sessionOptions"]["properties"]["weightTensorLocationSettings"]["properties"]
              ["minElementsForReplicatedTensorSharding"]["default"] == 8192);
}

TEST_CASE("limits bound every size a config implies, at the path of the setting") {
  struct Case {
    std::string name;
    std::string config;
    std::optional<std::string> subject;  // of ShapeTooLarge; nullopt: valid
  };
  const std::vector<Case> cases = {
      {"the defaults", "{}", std::nullopt},
      {"a wide layer", R"({"model": {"layers": [784, 2000000000, 10]}})", "/model/layers/1"},
      {"a wide layer with the limit raised",
       R"({"model": {"layers": [784, 2000000000, 10]}, "limits": {"maxTensorBytes": 9223372036854775807}})",
       std::nullopt},
      {"a wide input", R"({"data": {"dataset": "Synthetic"}, "model": {"layers": [2000000000, 10]}})",
       "/model/layers/0"},
      {"a width whose weight overflows", R"({"model": {"layers": [784, 4611686018427387904, 10]}})",
       "/model/layers/1"},
      {"the weights together", R"({"model": {"layers": [784, 16384, 16384, 16384, 16384, 16384, 10]}})",
       "/model/layers"},
      {"a micro-batch of activations", R"({"data": {"batchSize": 2000000}})", "/data/batchSize"},
      {"a test micro-batch", R"({"data": {"testBatchSize": 2000000}})", "/data/testBatchSize"},
      {"a step's host buffer",
       R"({"sessionOptions": {"enableReplicatedGraphs": true, "replicatedGraphCount": 64,
           "enableGradientAccumulation": true, "accumulationFactor": 64}, "data": {"batchSize": 512}})",
       "/data/batchSize"},
      {"a global batch that overflows",
       R"({"sessionOptions": {"enableDistributedReplicatedGraphs": true, "enableReplicatedGraphs": true,
           "replicatedGraphCount": 2, "globalReplicationFactor": 4611686018427387904},
           "data": {"batchSize": 4}, "limits": {"maxReplicas": 4611686018427387904}})",
       "/data/batchSize"},
      {"more replicas over the instances than /limits/maxReplicas",
       R"({"sessionOptions": {"enableDistributedReplicatedGraphs": true, "enableReplicatedGraphs": true,
           "replicatedGraphCount": 2, "globalReplicationFactor": 4611686018427387904}})",
       "/sessionOptions/globalReplicationFactor"},
      // The default model: W0 is 802816 bytes, all weights and biases 940584.
      {"a limit of exactly the weights", R"({"limits": {"maxTensorBytes": 940584}})", std::nullopt},
      {"a limit of W0 alone", R"({"limits": {"maxTensorBytes": 802816}})", "/model/layers"},
      {"a limit one byte below W0", R"({"limits": {"maxTensorBytes": 802815}})", "/model/layers/0"},
      // float16 weights take half the bytes: 470292 all together, W0 401408.
      {"float16: a limit of exactly the weights", R"({"model": {"dtype": "float16"}, "limits": {"maxTensorBytes": 470292}})",
       std::nullopt},
      {"float16: a limit one byte below the weights",
       R"({"model": {"dtype": "float16"}, "limits": {"maxTensorBytes": 470291}})", "/model/layers"},
      {"float16: a limit one byte below W0",
       R"({"model": {"dtype": "float16"}, "limits": {"maxTensorBytes": 401407}})", "/model/layers/0"},
      // 2^30 float16 activations fit in 2 GiB, float32 ones do not.
      {"float16: a micro-batch of activations that fits",
       R"({"data": {"dataset": "Tensors", "path": "t.safetensors", "batchSize": 1048576}, "model": {"dtype": "float16", "layers": [16, 1024, 10]}, "limits": {"maxTensorBytes": 2147483648}})",
       std::nullopt},
      {"float32: the same micro-batch",
       R"({"data": {"dataset": "Tensors", "path": "t.safetensors", "batchSize": 1048576}, "model": {"layers": [16, 1024, 10]}, "limits": {"maxTensorBytes": 2147483648}})",
       "/data/batchSize"},
      // The float32 logits of a float16 model count at 4 bytes.
      {"float16: logits wider than the layers in bytes",
       R"({"model": {"dtype": "float16", "layers": [784, 10]}, "data": {"dataset": "Synthetic", "batchSize": 1000, "testBatchSize": 1}, "limits": {"maxTensorBytes": 39999}})",
       "/data/batchSize"},
      {"float16 transformer: wte at 2 bytes",
       R"({"model": {"type": "Transformer", "dtype": "float16", "layers": 1, "hidden": 64, "heads": 1, "vocab": 1000, "sequence": 8},
           "data": {"dataset": "Tensors", "path": "t.safetensors", "batchSize": 1, "testBatchSize": 1},
           "limits": {"maxTensorBytes": 127999}})",
       "/model/vocab"},
      {"float16 transformer: wte that fits",
       R"({"model": {"type": "Transformer", "dtype": "float16", "layers": 1, "hidden": 64, "heads": 1, "vocab": 1000, "sequence": 8},
           "data": {"dataset": "Tensors", "path": "t.safetensors", "batchSize": 1, "testBatchSize": 1},
           "limits": {"maxTensorBytes": 256000}})",
       std::nullopt},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const RunConfig config = parse(c.config).config;
    const auto error = test::catchError<ConfigError>([&] { validate(config); });
    if (!c.subject) {
      CHECK_FALSE(error.has_value());
      continue;
    }
    REQUIRE(error.has_value());
    INFO(error->what());
    CHECK(error->code() == ErrorCode::ShapeTooLarge);
    CHECK(error->subject() == *c.subject);
    // The message says which setting to change.
    CHECK(error->detail().find("lower " + *c.subject) != std::string::npos);
  }
}

TEST_CASE("validateForPlanning answers past the host limits and rejects only sizes 64 bits cannot count") {
  // GPT-3's shape: 174.6 B weights, far over the default 4 GiB the host may
  // allocate to train, but nothing that planning makes.
  const RunConfig gpt3 =
      parse(R"({"model": {"type": "Transformer", "layers": 96, "hidden": 12288, "heads": 96,
      "vocab": 50257, "sequence": 2048}, "data": {"dataset": "Tensors", "path": "t.safetensors", "batchSize": 1}})")
          .config;
  const RunConfig wide = parse(R"({"model": {"layers": [784, 2000000000, 10]}})").config;
  for (const auto& c : {std::pair{gpt3, "/model/layers"}, std::pair{wide, "/model/layers/1"}}) {
    const RunConfig& config = c.first;
    const std::string subject = c.second;
    CAPTURE(subject);
    const auto refused = test::catchError<ConfigError>([&] { validate(config); });
    REQUIRE(refused.has_value());
    CHECK(refused->code() == ErrorCode::ShapeTooLarge);
    CHECK(refused->subject() == subject);
    CHECK(refused->detail().find("/limits/maxTensorBytes (4294967296 bytes)") != std::string::npos);
    CHECK_FALSE(test::catchError<ConfigError>([&] { validateForPlanning(config); }).has_value());
  }
  // A weight whose bytes overflow is refused by both, without the limit to raise.
  const RunConfig overflow = parse(R"({"model": {"layers": [784, 4611686018427387904, 10]}})").config;
  const auto error = test::catchError<ConfigError>([&] { validateForPlanning(overflow); });
  REQUIRE(error.has_value());
  CHECK(error->code() == ErrorCode::ShapeTooLarge);
  CHECK(error->subject() == "/model/layers/1");
  CHECK(error->detail() ==
        "weight W0 of 784 x 4611686018427387904 float32 would take more bytes than 64 bits count; lower "
        "/model/layers/1");
  CHECK(test::catchError<ConfigError>([&] { validate(overflow); }).has_value());
}

TEST_CASE("the model's dtype is float32 or float16") {
  CHECK(RunConfig{}.model.dtype == DType::Float32);
  CHECK(json(RunConfig{})["model"]["dtype"] == "float32");
  for (const std::string model : {R"({"type": "Mlp", "dtype": "float16"})",
                                  R"({"type": "Transformer", "dtype": "float16"})"}) {
    CAPTURE(model);
    const RunConfig config = parse(R"({"model": )" + model + "}").config;
    CHECK(config.model.dtype == DType::Float16);
    CHECK(json(config)["model"]["dtype"] == "float16");
  }
  const auto unknown = test::catchError<ConfigError>([] { parse(R"({"model": {"dtype": "half"}})"); });
  REQUIRE(unknown);
  CHECK(unknown->code() == ErrorCode::InvalidEnumValue);
  CHECK(unknown->subject() == "/model/dtype");
  INFO(unknown->what());
  CHECK(unknown->detail().find("\"float16\"") != std::string::npos);

  const auto error = test::catchError<ConfigError>([] { parse(R"({"model": {"dtype": "int32"}})"); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::InvalidModel);
  CHECK(error->subject() == "/model/dtype");
  CHECK(error->detail().starts_with(
      "dtype \"int32\" is not a model dtype: weights and activations are floats; expected one of "
      "\"float32\", \"float16\""));
  // float64 is an IR dtype, not a model dtype (variables are never float64).
  const auto wide = test::catchError<ConfigError>([] { parse(R"({"model": {"dtype": "float64"}})"); });
  REQUIRE(wide);
  CHECK(wide->code() == ErrorCode::InvalidModel);
  CHECK(wide->detail().starts_with("dtype \"float64\" is not a model dtype"));
  // An onnx model is cast to float16 on import when asked.
  CHECK(parse(R"({"model": {"type": "Onnx", "path": "m.onnx", "dtype": "float16"}})").config.model.dtype ==
        DType::Float16);
  const auto onnxInteger = test::catchError<ConfigError>(
      [] { parse(R"({"model": {"type": "Onnx", "path": "m.onnx", "dtype": "int32"}})"); });
  REQUIRE(onnxInteger);
  CHECK(onnxInteger->code() == ErrorCode::InvalidModel);
  CHECK(onnxInteger->subject() == "/model/dtype");
  CHECK(parse(R"({"model": {"type": "Onnx", "path": "m.onnx", "dtype": "float32"}})").config.model.dtype ==
        DType::Float32);
  // A C++ config is checked by validate().
  RunConfig integer;
  integer.model.dtype = DType::Int32;
  TESSERA_CHECK_ERROR(validate(integer), ConfigError, ErrorCode::InvalidModel);
}

TEST_CASE("configNotes warns of float16 weights without master weights and of loss scaling in float32") {
  // Sensible configs have no notes: float32 without loss scaling, float16
  // with master weights and loss scaling (the sample's settings).
  CHECK(configNotes(RunConfig{}).empty());
  CHECK(configNotes(parse(R"({"model": {"dtype": "float16"}, "optimizer": {"type": "Adam", "lossScaling": 1024},
                              "sessionOptions": {"automaticLossScalingSettings": {"enabled": true}}})")
                        .config)
            .empty());
  // A float16 model with master weights and float16 state keeps float32
  // masters: no note.
  CHECK(configNotes(parse(R"({"model": {"dtype": "float16"},
                              "optimizer": {"type": "Adam", "accl1Type": "float16"}})")
                        .config)
            .empty());

  const std::vector<ConfigNote> sgd =
      configNotes(parse(R"({"model": {"dtype": "float16"}, "optimizer": {"masterWeights": false}})").config);
  REQUIRE(sgd.size() == 1);
  CHECK(sgd[0].code == NoteCode::Float16WeightsWithoutMasterWeights);
  CHECK(sgd[0].path == "/optimizer/masterWeights");
  CHECK(sgd[0].text() ==
        "[tessera.note.801] /optimizer/masterWeights: masterWeights is false on a float16 model: the SGD "
        "update writes the float16 weights directly, and an update below half a float16 ulp of a weight "
        "(2^-11 of its value) is lost; the rest of the optimizer state is float32; set masterWeights to true "
        "to keep float32 master weights as optimizer state");

  const std::vector<ConfigNote> adam = configNotes(
      parse(R"({"model": {"dtype": "float16"},
                "optimizer": {"type": "Adam", "masterWeights": false, "accl1Type": "float16", "accl2Type": "float16"}})")
          .config);
  REQUIRE(adam.size() == 1);
  CHECK(adam[0].code == NoteCode::Float16WeightsWithoutMasterWeights);
  INFO(adam[0].message);
  CHECK(adam[0].message.find("accl1Type float16, accl2Type float16 keep(s) the optimizer state in half too") !=
        std::string::npos);

  // masterWeights false on a float32 model changes nothing: no note.
  CHECK(configNotes(parse(R"({"optimizer": {"masterWeights": false}})").config).empty());

  const std::vector<ConfigNote> fixed = configNotes(parse(R"({"optimizer": {"lossScaling": 128}})").config);
  REQUIRE(fixed.size() == 1);
  CHECK(fixed[0].code == NoteCode::LossScalingWithoutFloat16);
  CHECK(fixed[0].path == "/optimizer/lossScaling");
  CHECK(fixed[0].text().starts_with("[tessera.note.802] /optimizer/lossScaling: lossScaling is 128 on a "
                                    "float32 model: it runs as asked"));
  const std::vector<ConfigNote> automatic = configNotes(
      parse(R"({"sessionOptions": {"automaticLossScalingSettings": {"enabled": true}}})").config);
  REQUIRE(automatic.size() == 1);
  CHECK(automatic[0].code == NoteCode::LossScalingWithoutFloat16);
  CHECK(automatic[0].path == "/sessionOptions/automaticLossScalingSettings/enabled");
  // A note is not an error: the configs validate.
  CHECK_NOTHROW(validate(parse(R"({"optimizer": {"lossScaling": 128}})").config));
  CHECK_NOTHROW(validate(parse(R"({"model": {"dtype": "float16"}, "optimizer": {"masterWeights": false}})").config));

  // Auto virtual graphs on one IPU place every op on IPU 0 (PopART warns).
  const std::vector<ConfigNote> oneIpu =
      configNotes(parse(R"({"sessionOptions": {"virtualGraphMode": "Auto"}})").config);
  REQUIRE(oneIpu.size() == 1);
  CHECK(oneIpu[0].code == NoteCode::AutoVirtualGraphsOnOneIpu);
  CHECK(oneIpu[0].text().starts_with("[tessera.note.803] /sessionOptions/virtualGraphMode: virtualGraphMode is "
                                     "Auto but /device/ipusPerReplica is 1"));
  CHECK(configNotes(parse(R"({"sessionOptions": {"virtualGraphMode": "Auto"}, "device": {"ipusPerReplica": 2}})")
                        .config)
            .empty());
}

TEST_CASE("virtualGraphMode and ipusPerReplica are read strictly and checked together") {
  const RunConfig config =
      parse(R"({"sessionOptions": {"virtualGraphMode": "Manual"}, "device": {"ipusPerReplica": 4}})").config;
  CHECK(config.sessionOptions.virtualGraphMode == VirtualGraphMode::Manual);
  CHECK(config.device.ipusPerReplica == 4);
  CHECK(json(config)["device"]["interIpuBandwidthBytesPerSecond"] == 64e9);
  CHECK(json(config)["device"]["interIpuLatencySeconds"] == 1e-6);
  const auto misspelt =
      test::catchError<ConfigError>([] { (void)parse(R"({"sessionOptions": {"virtualGraphMode": "Automatic"}})"); });
  REQUIRE(misspelt);
  CHECK(misspelt->id() == "tessera.config.102");
  CHECK(std::string(misspelt->what()).find("Auto") != std::string::npos);
  const auto unknown = test::catchError<ConfigError>([] { (void)parse(R"({"device": {"ipusPerReplicas": 2}})"); });
  REQUIRE(unknown);
  CHECK(unknown->id() == "tessera.config.104");
  CHECK(std::string(unknown->what()).find("ipusPerReplica") != std::string::npos);
  const auto tooMany = test::catchError<ConfigError>([] { (void)parse(R"({"device": {"ipusPerReplica": 65}})"); });
  REQUIRE(tooMany);
  CHECK(tooMany->id() == "tessera.config.106");
  const auto off = test::catchError<ConfigError>([] { validate(parse(R"({"device": {"ipusPerReplica": 2}})").config); });
  REQUIRE(off);
  CHECK(off->id() == "tessera.config.174");
  const auto phases = test::catchError<ConfigError>(
      [] { validate(parse(R"({"sessionOptions": {"virtualGraphMode": "ExecutionPhases"}})").config); });
  REQUIRE(phases);
  CHECK(phases->id() == "tessera.config.191");
  // Did-you-mean on a misspelt phase setting, as on any other option.
  const auto misspeltPhases = test::catchError<ConfigError>(
      [] { (void)parse(R"({"sessionOptions": {"executionPhaseSettings": {"phase": 2}}})"); });
  REQUIRE(misspeltPhases);
  CHECK(misspeltPhases->id() == "tessera.config.104");
  CHECK(std::string(misspeltPhases->what()).find("phases") != std::string::npos);
  const auto schedule = test::catchError<ConfigError>(
      [] { (void)parse(R"({"sessionOptions": {"executionPhaseSettings": {"weightIOSchedule": "Preloaded"}}})"); });
  REQUIRE(schedule);
  CHECK(std::string(schedule->what()).find("Preload") != std::string::npos);
}

TEST_CASE("storageTileSet IO on tensors in streaming memory gets a note: it changes nothing there") {
  const auto notes = [](const std::string& sessionOptions) {
    return configNotes(parse(R"({"sessionOptions": {"numIOTiles": 32, )" + sessionOptions + "}}").config);
  };
  const std::string io = R"("loadTileSet": "IO", "storageTileSet": "IO")";
  const std::vector<ConfigNote> one =
      notes(R"("tensorLocationSettingsOverride": {"W0": {"storage": "OffChip", )" + io + "}}");
  REQUIRE(one.size() == 1);
  CHECK(one[0].code == NoteCode::StorageTileSetOffChip);
  CHECK(one[0].path == "/sessionOptions/tensorLocationSettingsOverride/W0/storageTileSet");
  CHECK(one[0].text().starts_with(
      "[tessera.note.809] /sessionOptions/tensorLocationSettingsOverride/W0/storageTileSet: storageTileSet IO "
      "places a tensor that stays on chip on the IO tiles, but the overridden tensor W0 lives in streaming "
      "memory (storage OffChip)"));
  // Every override in one note, the first five by name.
  std::string many;
  for (int i = 0; i < 7; ++i)
    many += fmt::format(R"({}"W{}": {{"storage": "OffChip", {}}})", i == 0 ? "" : ", ", i, io);
  const std::vector<ConfigNote> seven = notes(R"("tensorLocationSettingsOverride": {)" + many + "}");
  REQUIRE(seven.size() == 1);
  CHECK(seven[0].message.find("the overridden tensors W0, W1, W2, W3, W4 and 2 more live in streaming") !=
        std::string::npos);
  // A category's setting: its tensors below minElementsForOffChip stay on the IO tiles, so no note.
  CHECK(notes(R"("optimizerStateTensorLocationSettings": {"location": {"storage": "OffChip", )" + io + "}}")
            .empty());
  // On chip, IO tiles are where the tensor stays: no note.
  CHECK(notes(R"("tensorLocationSettingsOverride": {"W0": {"storage": "OnChip", )" + io + "}}").empty());
  CHECK(notes(R"("tensorLocationSettingsOverride": {"W0": {"storage": "OffChip", "loadTileSet": "IO"}})")
            .empty());
}

TEST_CASE("docs/errors.md documents every note id with an example") {
  std::ifstream in(test::sourcePath("docs/errors.md"));
  REQUIRE(in.good());
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  for (const NoteCode code : {NoteCode::Float16WeightsWithoutMasterWeights, NoteCode::LossScalingWithoutFloat16,
                              NoteCode::AutoVirtualGraphsOnOneIpu, NoteCode::StorageTileSetOffChip}) {
    const std::string id = noteId(code);
    INFO(id);
    const auto at = text.find("`" + id + "`");
    CHECK(at != std::string::npos);
    CHECK(text.find("[" + id + "]", at) != std::string::npos);
  }
}

TEST_CASE("the limits section is read strictly and survives a round trip") {
  const RunConfig config = parse(R"({"limits": {"maxTensorBytes": 1024}})").config;
  CHECK(config.limits.maxTensorBytes == 1024);
  CHECK(json(config)["limits"] == json{{"maxHostBytes", kDefaultMaxHostBytes},
                                       {"maxLayers", kDefaultMaxLayers},
                                       {"maxReplicas", kDefaultMaxReplicas},
                                       {"maxTensorBytes", 1024}});
  CHECK(json(RunConfig{})["limits"]["maxTensorBytes"] == kDefaultMaxTensorBytes);
  CHECK(parse(R"({"limits": {"maxLayers": 4}})").config.limits.maxLayers == 4);
  TESSERA_CHECK_ERROR(parse(R"({"limits": {"maxLayers": 0}})"), ConfigError, ErrorCode::OutOfRange);
  CHECK(parse(R"({"limits": {"maxReplicas": 8}})").config.limits.maxReplicas == 8);
  TESSERA_CHECK_ERROR(parse(R"({"limits": {"maxReplicas": 0}})"), ConfigError, ErrorCode::OutOfRange);
  TESSERA_CHECK_ERROR(parse(R"({"limits": {"maxTensorBytes": 0}})"), ConfigError, ErrorCode::OutOfRange);
  CHECK(parse(R"({"limits": {"maxHostBytes": 1}})").config.limits.maxHostBytes == 1);
  TESSERA_CHECK_ERROR(parse(R"({"limits": {"maxHostBytes": 0}})"), ConfigError, ErrorCode::OutOfRange);
  TESSERA_CHECK_ERROR(parse(R"({"limits": {"maxBytes": 1}})"), ConfigError, ErrorCode::UnknownKey);
}

TEST_CASE("--set paths are as deep as documents may be, and UTF-8") {
  const auto segments = [](std::size_t n) {
    std::string path;
    for (std::size_t i = 0; i < n; ++i) path += "/a";
    return path + "=1";
  };
  // 64 segments are applied (and then fail as an unknown key), 65 are not.
  TESSERA_CHECK_ERROR(parse("{}", {segments(64)}), ConfigError, ErrorCode::UnknownKey);
  const auto deep = test::catchError<ConfigError>([&] { parse("{}", {segments(65)}); });
  REQUIRE(deep.has_value());
  CHECK(deep->code() == ErrorCode::DocumentLimit);
  CHECK(deep->subject() == segments(65));

  const auto bad = test::catchError<ConfigError>([&] { parse("{}", {"/data/path=\xff"}); });
  REQUIRE(bad.has_value());
  CHECK(bad->code() == ErrorCode::BadOverride);
  CHECK(bad->subject() == "/data/path=\\xff");
  CHECK(bad->detail().find("byte 11 (0xff) is not valid UTF-8") != std::string::npos);
  CHECK(parse("{}", {"/data/path=r\xc3\xa9sum\xc3\xa9"}).config.data.path == "r\xc3\xa9sum\xc3\xa9");
}

}  // namespace
TEST_CASE("learning rate schedules") {
  const json parsed = json::parse(R"({"type": "Cosine", "finalFactor": 0.1})");
  const ScheduleConfig cosine = parsed.get<ScheduleConfig>();
  CHECK(cosine.type == ScheduleType::Cosine);
  CHECK(cosine.finalFactor == 0.1);
  CHECK(json(cosine)["type"] == "Cosine");
  CHECK(RunConfig{}.schedule.type == ScheduleType::Constant);

  // 10 epochs of 100 steps.
  CHECK(learningRateFactor(ScheduleConfig{}, 537, 100, 10) == 1.0);
  CHECK(learningRateFactor(cosine, 0, 100, 10) == doctest::Approx(1.0));
  CHECK(learningRateFactor(cosine, 500, 100, 10) == doctest::Approx(0.55));  // halfway: (1 + 0.1) / 2
  CHECK(learningRateFactor(cosine, 250, 100, 10) ==
        doctest::Approx(0.1 + 0.9 * 0.5 * (1.0 + std::cos(std::numbers::pi / 4))));
  CHECK(learningRateFactor(cosine, 1000, 100, 10) == doctest::Approx(0.1));
  for (int64_t step = 1; step < 1000; ++step)
    CHECK(learningRateFactor(cosine, step, 100, 10) < learningRateFactor(cosine, step - 1, 100, 10));
  // Down to 0, the rate of the last step of even a very long run is still a rate.
  ScheduleConfig toZero;
  toZero.type = ScheduleType::Cosine;
  const int64_t steps = int64_t{1} << 40;
  CHECK(learningRateFactor(toZero, steps - 1, steps, 1) > 0.0);
  CHECK(learningRateFactor(toZero, steps, steps, 1) == 0.0);

  ScheduleConfig step;
  step.type = ScheduleType::Step;
  step.stepEpochs = 3;
  step.gamma = 0.5;
  CHECK(learningRateFactor(step, 0, 100, 10) == 1.0);
  CHECK(learningRateFactor(step, 299, 100, 10) == 1.0);
  CHECK(learningRateFactor(step, 300, 100, 10) == 0.5);
  CHECK(learningRateFactor(step, 599, 100, 10) == 0.5);
  CHECK(learningRateFactor(step, 600, 100, 10) == 0.25);
  CHECK(learningRateFactor(step, 999, 100, 10) == 0.125);
}

}  // namespace tessera
