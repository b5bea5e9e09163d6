// writeOnnx: a trained model goes back out as ONNX (PopART's modelToHost).
// The written model re-imports with the trained values in its initializers
// and computes what the session computes with them; values that do not fit
// the model's initializers are refused with tessera.onnx.710.
#include "tessera/onnx/onnx.hpp"

#include <doctest/doctest.h>

#include <cstddef>
#include <filesystem>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "support/onnx_models.hpp"
#include "support/process.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const std::string kMlp = test::sourcePath("tests/data/onnx/mlp.onnx");

// The initial values of every variable of `model` named in `names`.
std::vector<std::vector<float>> initialValues(const OnnxModel& model, const std::vector<std::string>& names) {
  std::vector<std::vector<float>> values;
  for (const std::string& name : names) values.push_back(model.graph.tensor(model.graph.find(name)).initial.values());
  return values;
}

std::vector<OnnxTensorValues> asOnnxValues(const std::vector<std::pair<std::string, HostTensor>>& tensors) {
  std::vector<OnnxTensorValues> values;
  for (const auto& [name, tensor] : tensors) values.push_back({name, tensor.shape, tensor.data});
  return values;
}

TEST_CASE("a trained MLP written as ONNX re-imports with its trained weights and computes the session's loss") {
  const json reference = test::readJson("tests/data/onnx/mlp_reference.json");
  const json& c = reference.at("cases").at(2);
  const auto batch = c.at("batch").get<int64_t>();
  const std::vector<float> x = c.at("x").get<std::vector<float>>();
  const std::vector<int32_t> labels = c.at("labels").get<std::vector<int32_t>>();
  const auto step = [&](auto& session) { session.run({StepInput("x", x), StepInput("labels", labels)}); };

  OnnxModel model = test::importWithBatch("mlp.onnx", batch);
  const TensorId loss = model.graph.find("loss");
  const std::vector<std::string> weights = model.weights;
  const std::vector<std::vector<float>> initial = initialValues(model, weights);
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.1;
  TrainingSession trained(std::move(model.graph), loss, makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  for (int k = 0; k < 3; ++k) step(trained);
  const auto trainedWeights = trained.readWeights();

  const test::TempDir folder;
  const fs::path written = folder.path() / "trained.onnx";
  writeOnnx(kMlp, asOnnxValues(trainedWeights), written);

  // The file holds the trained weights, under their names, and nothing else changed.
  OnnxImportOptions importOptions;
  importOptions.dimensions = {{"batch", batch}};
  OnnxModel back = importOnnx(written, importOptions);
  CHECK(back.weights == weights);
  // Named variables, not structured bindings: clang before 16 cannot capture
  // those in a lambda (CAPTURE makes one).
  for (const auto& weight : trainedWeights) {
    const std::string& name = weight.first;
    CAPTURE(name);
    CHECK(back.graph.tensor(back.graph.find(name)).initial.values() == weight.second.data);
  }
  CHECK(initialValues(back, weights) != initial);
  const OnnxSignature before = readOnnxSignature(kMlp);
  const OnnxSignature after = readOnnxSignature(written);
  REQUIRE(after.inputs.size() == before.inputs.size());
  for (std::size_t i = 0; i < before.inputs.size(); ++i) {
    CHECK(after.inputs[i].name == before.inputs[i].name);
    CHECK(after.inputs[i].dims == before.inputs[i].dims);
  }
  // The fourth step of the trained session and the first of a session of the
  // written model see the same weights: the same loss, bit for bit.
  step(trained);
  const TensorId backLoss = back.graph.find("loss");
  TrainingSession fromFile(std::move(back.graph), backLoss, makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  step(fromFile);
  CHECK(fromFile.meanLoss() == trained.meanLoss());
  // No temporary file is left beside it.
  CHECK(std::distance(fs::directory_iterator(folder.path()), fs::directory_iterator()) == 1);
}

TEST_CASE("BatchNormalization's running statistics go out with the weights") {
  const json reference = test::readJson("tests/data/onnx/batchnorm_train_reference.json");
  const auto batch = reference.at("batch").get<int64_t>();
  const std::string source = test::sourcePath("tests/data/onnx/batchnorm_train.onnx");
  OnnxImportOptions importOptions;
  importOptions.dimensions = {{"batch", batch}};
  OnnxModel model = importOnnx(source, importOptions);
  Graph& g = model.graph;
  const Tensor y{&g, g.find("y")};
  const Tensor loss = ops::reduceMean(ops::mul(y, y));
  const std::vector<std::string> state = model.state;
  REQUIRE(state.size() == 2);
  const std::vector<std::vector<float>> initial = initialValues(model, state);
  OptimizerConfig sgd;
  sgd.sgd.learningRate = 0.1;
  TrainingSession session(std::move(model.graph), loss.id(), makeOptimizer(sgd), SessionOptions{}, makeSimDevice());
  for (const json& s : reference.at("steps")) session.run({StepInput("x", s.at("x").get<std::vector<float>>())});

  std::vector<std::pair<std::string, HostTensor>> tensors = session.readWeights();
  for (const std::string& name : state) tensors.emplace_back(name, session.readVariable(name, RetrievalMode::OnePerGroup));
  const test::TempDir folder;
  const fs::path written = folder.path() / "bn.onnx";
  writeOnnx(source, asOnnxValues(tensors), written);
  const OnnxModel back = importOnnx(written, importOptions);
  for (const auto& value : tensors) {
    const std::string& name = value.first;
    CAPTURE(name);
    CHECK(back.graph.tensor(back.graph.find(name)).initial.values() == value.second.data);
  }
  CHECK(initialValues(back, state) != initial);
}

TEST_CASE("values that do not fit the model's initializers are refused, and nothing is written") {
  const test::TempDir folder;
  const fs::path written = folder.path() / "out.onnx";
  const auto refused = [&](const std::vector<OnnxTensorValues>& values, const std::string& part) {
    try {
      writeOnnx(kMlp, values, written);
      FAIL("no error");
    } catch (const OnnxError& e) {
      CHECK(e.code() == ErrorCode::OnnxExportMismatch);
      CHECK(errorId(e.code()) == "tessera.onnx.710");
      INFO(e.what());
      CHECK(std::string(e.what()).find(part) != std::string::npos);
    }
    CHECK(!fs::exists(written));
  };
  const std::vector<float> zeros(4, 0.0f);
  refused({{"fc9.weight", {4}, zeros}}, "initializer \"fc9.weight\": the model has no initializer of that name");
  refused({{"fc2.bias", {2, 2}, zeros}}, "the model's initializer has shape [4], the values [2, 2]");
  refused({{"fc2.bias", {4}, std::vector<float>(3)}}, "3 values for an initializer of 4 elements");
  // A file that is not a model.
  const fs::path notModel = folder.write("not.onnx", "not a model");
  try {
    writeOnnx(notModel, {}, written);
    FAIL("no error");
  } catch (const OnnxError& e) {
    CHECK(e.code() == ErrorCode::OnnxMalformed);
  }
  CHECK(!fs::exists(written));
}

TEST_CASE("a link is followed and its target replaced; a device is refused, not replaced") {
  const test::TempDir folder;
  const std::vector<OnnxTensorValues> none;
  const fs::path target = folder.write("target.onnx", "old");
  const fs::path link = folder.path() / "link.onnx";
  fs::create_symlink(target, link);
  writeOnnx(kMlp, none, link);
  CHECK(fs::is_symlink(link));
  CHECK(test::readFile(target) == test::readFile(kMlp));
  try {
    writeOnnx(kMlp, none, "/dev/null");
    FAIL("no error");
  } catch (const IoError& e) {
    CHECK(e.code() == ErrorCode::FileUnwritable);
    CHECK(std::string(e.what()).find("not a regular file") != std::string::npos);
  }
  CHECK(fs::is_character_file("/dev/null"));
  CHECK(std::distance(fs::directory_iterator(folder.path()), fs::directory_iterator()) == 2);
}

}  // namespace
}  // namespace tessera
