// float16 models: the builders' graphs (float16 weights and activations,
// float32 logits and loss) and their checkpoints (F16 bits, conversions to
// and from float32 runs, other replica counts).
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "half.hpp"
#include "support/process.hpp"
#include "support/toy_data.hpp"
#include "tessera/app/checkpoint.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "tessera/app/transformer.hpp"
#include "test_support.hpp"

using namespace tessera;

namespace {

constexpr int64_t kFeatures = 12;
constexpr int64_t kGlobalBatch = 8;

ModelConfig toyModel(DType dtype) {
  ModelConfig model;
  model.layers = {kFeatures, 8, 4};
  model.dtype = dtype;
  return model;
}

OptimizerConfig sgd() {
  OptimizerConfig config;
  config.sgd.learningRate = 0.1;
  return config;
}

TrainingSession makeSession(DType dtype, int64_t replicas) {
  MlpGraph mlp = buildMlp(toyModel(dtype), kGlobalBatch / replicas, replicas, 3);
  return TrainingSession(std::move(mlp.graph), mlp.loss, makeOptimizer(sgd()),
                         test::replicated(replicas, ReductionType::Mean), makeSimDevice());
}

bool isHalf(float value) { return halfToFloat(floatToHalf(value)) == value || std::isnan(value); }

}  // namespace

TEST_CASE("a float16 MLP has float16 weights and activations and float32 logits and loss") {
  const MlpGraph mlp = buildMlp(toyModel(DType::Float16), 4, 1, 3);
  const Graph& g = mlp.graph;
  CHECK(g.tensor(mlp.input).dtype == DType::Float16);
  CHECK(g.tensor(mlp.labels).dtype == DType::Int32);
  REQUIRE(mlp.weights.size() == 4);
  for (const TensorId w : mlp.weights) {
    CAPTURE(g.tensor(w).name);
    CHECK(g.tensor(w).dtype == DType::Float16);
    CHECK(g.tensor(w).category == TensorCategory::Weight);
  }
  // The logits are the float32 cast of the last layer's float16 output.
  const TensorNode& logits = g.tensor(mlp.logits);
  CHECK(logits.dtype == DType::Float32);
  const OpNode& cast = g.op(logits.producer);
  REQUIRE(cast.inputs.size() == 1);
  CHECK(g.tensor(cast.inputs[0]).dtype == DType::Float16);
  CHECK(g.tensor(cast.inputs[0]).shape == Shape{4, 4});
  CHECK(g.tensor(mlp.loss).dtype == DType::Float32);
  CHECK(g.tensor(mlp.predictions).dtype == DType::Int32);
  // Every other float tensor is float16: the matmuls, adds and ReLUs.
  int64_t floats = 0;
  for (const OpNode& op : g.ops()) {
    for (const TensorId out : op.outputs) {
      const TensorNode& t = g.tensor(out);
      if (out == mlp.logits || out == mlp.loss || t.dtype != DType::Float32) continue;
      if (g.op(t.producer).kind == OpKind::Constant) continue;
      ++floats;
      INFO(t.name);
    }
  }
  CHECK(floats == 0);

  // float32 stays as it was: no cast.
  const MlpGraph plain = buildMlp(toyModel(DType::Float32), 4, 1, 3);
  CHECK(plain.graph.tensor(plain.input).dtype == DType::Float32);
  CHECK(plain.graph.op(plain.graph.tensor(plain.logits).producer).kind == OpKind::Add);
}

TEST_CASE("a float16 transformer has float16 parameters and float32 logits and loss") {
  TransformerConfig config;
  config.layers = 2;
  config.hidden = 8;
  config.heads = 2;
  config.vocab = 11;
  config.sequence = 5;
  for (const bool tied : {true, false}) {
    config.tiedHead = tied;
    CAPTURE(tied);
    const TransformerGraph t = buildTransformer(config, 2, 1, 0, DType::Float16);
    const Graph& g = t.graph;
    CHECK(t.weights.size() == (tied ? 2u + 2 * 12 + 2 : 2u + 2 * 12 + 3));
    for (const TensorId w : t.weights) {
      CAPTURE(g.tensor(w).name);
      CHECK(g.tensor(w).dtype == DType::Float16);
    }
    CHECK(g.tensor(t.tokens).dtype == DType::Int32);
    const TensorNode& logits = g.tensor(t.logits);
    CHECK(logits.dtype == DType::Float32);
    CHECK(logits.shape == Shape{2, 5, 11});
    CHECK(g.tensor(g.op(logits.producer).inputs.at(0)).dtype == DType::Float16);
    CHECK(g.tensor(t.loss).dtype == DType::Float32);
    // The attention scores and the MLP activations are float16.
    int64_t batchMatmuls = 0;
    for (const OpNode& op : g.ops()) {
      if (op.kind != OpKind::BatchMatMul) continue;
      ++batchMatmuls;
      CHECK(g.tensor(op.outputs.at(0)).dtype == DType::Float16);
    }
    CHECK(batchMatmuls == 2 * 2);
  }
  TESSERA_CHECK_ERROR(buildTransformer(config, 2, 1, 0, DType::Int32), ConfigError, ErrorCode::InvalidModel);
  ModelConfig integer = toyModel(DType::Int32);
  TESSERA_CHECK_ERROR(buildMlp(integer, 2, 1, 0), ConfigError, ErrorCode::InvalidModel);
}

TEST_CASE("float16 checkpoints: F16 bits, float32 <-> float16 runs, other replica counts") {
  const test::TempDir dir;
  const std::string path = (dir.path() / "half.safetensors").string();

  // Weights that are not halves to begin with (He-normal draws), written
  // into a float16 run: the device holds them rounded.
  TrainingSession first = makeSession(DType::Float16, 2);
  saveCheckpoint(first, path);
  const Checkpoint saved = readCheckpoint(path);
  // Four float16 weights as F16 and their float32 master weights as F32:
  // each weight is its master rounded to half.
  REQUIRE(saved.tensors.size() == 8);
  const auto isMaster = [](const std::string& name) { return name.ends_with(".master"); };
  for (const CheckpointTensor& tensor : saved.tensors) {
    INFO(tensor.name);
    CHECK(tensor.value == first.readVariable(tensor.name, RetrievalMode::OnePerGroup));
    if (isMaster(tensor.name)) {
      CHECK(tensor.dtype == DType::Float32);
      continue;
    }
    CHECK(tensor.dtype == DType::Float16);
    CHECK(std::all_of(tensor.value.data.begin(), tensor.value.data.end(), isHalf));
    HostTensor rounded = first.readVariable(tensor.name + ".master", RetrievalMode::OnePerGroup);
    if (tensor.name.starts_with("W")) {  // He-normal draws (the biases start at zero)
      CHECK_FALSE(std::all_of(rounded.data.begin(), rounded.data.end(), isHalf));
    }
    for (float& v : rounded.data) v = halfToFloat(floatToHalf(v));
    CHECK(tensor.value == rounded);
  }

  // Loaded at 1, 2 and 4 replicas: the same values.
  for (const int64_t replicas : {1, 2, 4}) {
    CAPTURE(replicas);
    TrainingSession other = makeSession(DType::Float16, replicas);
    loadCheckpoint(other, path);
    for (const CheckpointTensor& tensor : saved.tensors) {
      INFO(tensor.name);
      CHECK(other.readVariable(tensor.name, RetrievalMode::OnePerGroup) == tensor.value);
    }
  }

  // Into a float32 run: every value widened exactly.
  TrainingSession wide = makeSession(DType::Float32, 2);
  const CheckpointLoadReport widened = loadCheckpoint(wide, path);
  for (const CheckpointTensor& tensor : saved.tensors) {
    if (isMaster(tensor.name)) continue;  // a float32 run keeps none
    INFO(tensor.name);
    CHECK(wide.readVariable(tensor.name, RetrievalMode::OnePerGroup) == tensor.value);
  }
  CHECK(std::any_of(widened.warnings.begin(), widened.warnings.end(), [](const CheckpointWarning& w) {
    return w.kind == CheckpointWarningKind::WidenedFromHalf &&
           w.text.find("took the checkpoint's F16 values (exactly)") != std::string::npos;
  }));

  // A float32 checkpoint into a float16 run: every value rounded to nearest even.
  const std::string wide32 = (dir.path() / "wide.safetensors").string();
  saveCheckpoint(makeSession(DType::Float32, 1), wide32);
  const Checkpoint singles = readCheckpoint(wide32);
  TrainingSession narrow = makeSession(DType::Float16, 4);
  const CheckpointLoadReport rounded = loadCheckpoint(narrow, wide32);
  std::size_t changed = 0;
  for (const CheckpointTensor& tensor : singles.tensors) {
    INFO(tensor.name);
    CHECK(tensor.dtype == DType::Float32);
    HostTensor expected = tensor.value;
    for (float& v : expected.data) {
      const float half = halfToFloat(floatToHalf(v));
      changed += half != v;
      v = half;
    }
    CHECK(narrow.readVariable(tensor.name, RetrievalMode::OnePerGroup) == expected);
    // The master weight takes the float32 value exactly.
    CHECK(narrow.readVariable(tensor.name + ".master", RetrievalMode::OnePerGroup) == tensor.value);
  }
  CHECK(changed > 0);  // the test rounds something
  CHECK(std::any_of(rounded.warnings.begin(), rounded.warnings.end(), [](const CheckpointWarning& w) {
    return w.kind == CheckpointWarningKind::RoundedToHalf &&
           w.text.find("F32 values rounded to half") != std::string::npos;
  }));
}
