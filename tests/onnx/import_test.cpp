// importOnnx: a PyTorch export of an MLP with its loss inside the graph runs
// forward (and trains) on the simulated device with PyTorch's numbers, at
// several batch sizes and replication factors; bad models are refused with
// their ids and messages.
#include "tessera/onnx/onnx.hpp"

#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "support/onnx_models.hpp"
#include "tessera/simdevice/device.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/optimizers/optimizer.hpp"
#include "tessera/sessions/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const std::string kModel = test::sourcePath("tests/data/onnx/mlp.onnx");

const json& reference() {
  static const json value = test::readJson("tests/data/onnx/mlp_reference.json");
  return value;
}

using test::relativeDifference;
using test::replicated;

OnnxModel importMlp(int64_t batchPerReplica, int64_t replicas) {
  return test::importWithBatch("mlp.onnx", batchPerReplica, replicas);
}

TEST_CASE("the MLP export imports with its ONNX names, weights and folded shape arithmetic") {
  const OnnxModel model = importMlp(4, 1);
  CHECK(model.inputs == std::vector<std::string>{"x", "labels"});
  CHECK(model.outputs == std::vector<std::string>{"loss", "logits"});
  CHECK(model.initializers == std::vector<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  CHECK(model.weights == model.initializers);
  CHECK(model.opset == 14);

  const Graph& g = model.graph;
  CHECK(g.tensor(g.find("x")).shape == Shape{4, 2, 3});
  CHECK(g.tensor(g.find("labels")).dtype == DType::Int32);
  CHECK(g.tensor(g.find("loss")).shape == Shape{});
  CHECK(g.tensor(g.find("logits")).shape == Shape{4, 4});
  // Named variables, not structured bindings: clang before 16 cannot capture
  // those in a lambda (CAPTURE makes one).
  for (const auto& item : reference().at("weights").items()) {
    const std::string name = item.key();
    const json& values = item.value();
    CAPTURE(name);
    const TensorNode& weight = g.tensor(g.find(name));
    CHECK(weight.category == TensorCategory::Weight);
    CHECK(g.op(weight.producer).kind == OpKind::Variable);
    const std::vector<float> expected = values.get<std::vector<float>>();
    CHECK(weight.initial.values() == expected);
  }
  // Torch's Shape/Gather/Unsqueeze/Concat chain is folded into Reshape's
  // attribute: the device runs the model's math only.
  std::multiset<OpKind> kinds;
  for (const OpNode& op : g.ops()) kinds.insert(op.kind);
  CHECK(kinds.count(OpKind::Input) == 2);
  CHECK(kinds.count(OpKind::Variable) == 4);
  CHECK(kinds.count(OpKind::Constant) == 0);
  CHECK(kinds.count(OpKind::Reshape) == 1);
  CHECK(kinds.count(OpKind::MatMul) == 2);
  CHECK(kinds.count(OpKind::SoftmaxCrossEntropy) == 1);
  for (const OpNode& op : g.ops()) {
    if (op.kind == OpKind::Reshape) CHECK(op.attributes.shape == Shape{4, 6});
  }
}

TEST_CASE("the forward loss and logits equal PyTorch's at every batch size and replication factor") {
  for (const json& c : reference().at("cases")) {
    const auto batch = c.at("batch").get<int64_t>();
    const std::vector<float> x = c.at("x").get<std::vector<float>>();
    const std::vector<int32_t> labels = c.at("labels").get<std::vector<int32_t>>();
    const std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const double loss = c.at("loss").get<double>();
    for (int64_t replicas : {1, 2}) {
      CAPTURE(batch);
      CAPTURE(replicas);
      // Replica r takes the r-th slice of the batch: host data [R, B/R, ...]
      // is the batch in order.
      OnnxModel model = importMlp(batch / replicas, replicas);
      InferenceSession session(std::move(model.graph), model.outputs, replicated(replicas), makeSimDevice());
      session.run({StepInput("x", x), StepInput("labels", labels)});
      const HostTensor& losses = session.output("loss");
      REQUIRE(losses.data.size() == static_cast<std::size_t>(replicas));
      // With a mean over equal slices, the mean of the replicas' losses is the batch's.
      double mean = 0;
      for (float l : losses.data) mean += l / static_cast<double>(replicas);
      CHECK(relativeDifference(mean, loss) <= 1e-5);
      const HostTensor& got = session.output("logits");
      REQUIRE(got.data.size() == logits.size());
      for (std::size_t k = 0; k < logits.size(); ++k) CHECK(std::fabs(got.data[k] - logits[k]) <= 1e-5);
    }
  }
}

TEST_CASE("an imported model trains: the first step's loss is PyTorch's and the loss goes down") {
  const json& c = reference().at("cases").at(2);
  const auto batch = c.at("batch").get<int64_t>();
  const std::vector<float> x = c.at("x").get<std::vector<float>>();
  const std::vector<int32_t> labels = c.at("labels").get<std::vector<int32_t>>();
  for (int64_t replicas : {1, 2}) {
    CAPTURE(replicas);
    OnnxModel model = importMlp(batch / replicas, replicas);
    const TensorId loss = model.graph.find("loss");
    SessionOptions options = replicated(replicas);
    options.accumulationAndReplicationReductionType = ReductionType::Mean;
    OptimizerConfig sgd;
    sgd.sgd.learningRate = 0.1;
    TrainingSession session(std::move(model.graph), loss, makeOptimizer(sgd), options, makeSimDevice());
    session.run({StepInput("x", x), StepInput("labels", labels)});
    CHECK(relativeDifference(session.meanLoss(), c.at("loss").get<double>()) <= 1e-5);
    const double first = session.meanLoss();
    for (int step = 0; step < 5; ++step) session.run({StepInput("x", x), StepInput("labels", labels)});
    CHECK(session.meanLoss() < first);
    // The weights keep their ONNX names on the host.
    std::set<std::string> names;
    for (const auto& [name, value] : session.readWeights()) names.insert(name);
    CHECK(names == std::set<std::string>{"fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias"});
  }
}

TEST_CASE("a model of opset 6 is upgraded by ONNX's version converter and computes the same") {
  // y = softmax(relu(x + b) * 2) on rows, b = [0.5, -1, 0.25, 2] (tests/data/onnx/generate.py).
  const std::vector<double> b = {0.5, -1.0, 0.25, 2.0};
  const std::vector<float> x = {0.1f, 0.2f, -0.3f, 0.4f, -2.0f, 1.5f, 0.0f, -1.0f, 3.0f, 0.5f, 0.75f, -4.0f};
  for (int64_t replicas : {1, 3}) {
    CAPTURE(replicas);
    OnnxImportOptions options;
    options.dimensions = {{"batch", 3 / replicas}};
    options.replicationFactor = replicas;
    OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/old_opset.onnx"), options);
    CHECK(model.opset == 11);
    InferenceSession session(std::move(model.graph), {"y"}, replicated(replicas), makeSimDevice());
    session.run({StepInput("x", x)});
    const HostTensor& y = session.output("y");
    REQUIRE(y.data.size() == x.size());
    for (std::size_t row = 0; row < 3; ++row) {
      std::vector<double> e(4);
      double sum = 0;
      for (std::size_t k = 0; k < 4; ++k) {
        e[k] = std::exp(2.0 * std::max(0.0, static_cast<double>(x[row * 4 + k]) + b[k]));
        sum += e[k];
      }
      for (std::size_t k = 0; k < 4; ++k) CHECK(std::fabs(y.data[row * 4 + k] - e[k] / sum) <= 1e-6);
    }
  }
}

TEST_CASE(
    "a double model computes in double on the device, at any replica count; doubleAsFloat makes it float32") {
  const std::string path = test::sourcePath("tests/data/onnx/double_relu.onnx");
  // y = relu(x) + shift, z = float(y); shift = [1e200, 1 + 2^-40, -0.5, 1e-300].
  const std::vector<double> shift = {1e200, 1.0 + 0x1p-40, -0.5, 1e-300};
  const std::vector<double> x = {-1.5, 0x1p-45, 0.0, 3.25, 1e300, 1.0, -2.0, 0x1.0000000001p0};
  for (int64_t replicas : {1, 2}) {
    INFO("R = " << replicas);
    OnnxImportOptions options;
    options.dimensions = {{"batch", 2 / replicas}};
    options.replicationFactor = replicas;
    OnnxModel model = importOnnx(path, options);
    CHECK(model.graph.tensor(model.graph.find("x")).dtype == DType::Float64);
    CHECK(model.graph.tensor(model.graph.find("shift")).dtype == DType::Float64);
    CHECK(model.graph.tensor(model.graph.find("y")).dtype == DType::Float64);
    CHECK(model.graph.tensor(model.graph.find("z")).dtype == DType::Float32);
    InferenceSession session(std::move(model.graph), {"y", "z"}, replicated(replicas), makeSimDevice());
    session.run({StepInput("x", std::span<const double>(x))});
    const HostTensor& y = session.output("y");
    const HostTensor& z = session.output("z");
    CHECK(y.data.empty());
    REQUIRE(y.doubles.size() == x.size());
    REQUIRE(z.data.size() == x.size());
    for (std::size_t k = 0; k < x.size(); ++k) {
      const double want = std::max(0.0, x[k]) + shift[k % 4];
      INFO("element " << k);
      CHECK(y.doubles[k] == want);  // bit for bit: 1e200 and 1 + 2^-40 are not float32 values
      CHECK(z.data[k] == static_cast<float>(want));
    }
    // float64 streams take doubles, or floats (exact in double); not int32.
    const std::vector<float> xf = {-1.5f, 2.0f, 0.0f, 3.25f, -0.5f, 1.0f, -2.0f, 4.0f};
    session.run({StepInput("x", xf)});
    CHECK(session.output("y").doubles[1] == 2.0 + 1.0 + 0x1p-40);
    const std::vector<int32_t> xi(8, 1);
    const auto wrongType = test::catchError<GraphError>([&] { session.run({StepInput("x", xi)}); });
    REQUIRE(wrongType);
    CHECK(wrongType->code() == ErrorCode::HostShapeMismatch);
    CHECK(std::string(wrongType->what()).find("int32 data given for a float64 stream") != std::string::npos);
  }
  // As float32, 1e200 is beyond range: the input refuses it, and the constant becomes +inf.
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  options.doubleAsFloat = true;
  OnnxModel model = importOnnx(path, options);
  CHECK(model.graph.tensor(model.graph.find("x")).dtype == DType::Float32);
  CHECK(model.graph.tensor(model.graph.find("y")).dtype == DType::Float32);
  InferenceSession session(std::move(model.graph), {"y"}, replicated(1), makeSimDevice());
  const std::vector<float> xf = {-1.5f, 2.0f, 0.0f, 3.25f, -0.5f, 1.0f, -2.0f, 4.0f};
  session.run({StepInput("x", xf)});
  const HostTensor& y = session.output("y");
  REQUIRE(y.data.size() == xf.size());
  CHECK(y.doubles.empty());
  CHECK(y.data[1] == 3.0f);  // 2 + (1 + 2^-40) rounds to 3 in float32
  CHECK(y.data[2] == -0.5f);
}

TEST_CASE("a symbolic dimension without a value names the input, the axis and the dimension") {
  const auto error = test::catchError<OnnxError>([] { (void)importOnnx(kModel, {}); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OnnxUnboundDimension);
  CHECK(std::string(error->what()) ==
        "[tessera.onnx.706] " + kModel +
            ": input x: axis 0 is the symbolic dimension \"batch\", which has no value; set "
            "OnnxImportOptions::dimensions[\"batch\"] (per replica)");
}

TEST_CASE("bad models are refused with their id and a message that names the node") {
  struct Row {
    std::string file;
    ErrorCode code;
    std::string message;  // after "[id] FILE"
  };
  const std::vector<Row> rows = {
      {"truncated.onnx", ErrorCode::OnnxMalformed,
       ": not an ONNX model: the 51 bytes do not parse as a ModelProto (truncated, or another kind of file)"},
      {"not-onnx.onnx", ErrorCode::OnnxMalformed,
       ": not an ONNX model: the 33 bytes do not parse as a ModelProto (truncated, or another kind of file)"},
      {"empty.onnx", ErrorCode::OnnxMalformed,
       ": not an ONNX model: the file has no graph (a ModelProto with a graph of nodes and outputs is "
       "expected)"},
      {"opset-18.onnx", ErrorCode::OnnxUnsupportedOpset,
       ": opset 18 of the default domain (ai.onnx) is not supported; opsets 1 to 17 are (those before 11 "
       "upgraded on import); export the model with opset_version=17"},
      {"opset-9-invalid.onnx", ErrorCode::OnnxUnsupportedOpset,
       ": opset 9 of the default domain (ai.onnx) is upgraded to opset 11 on import, but ONNX's checker "
       "refuses the model: Node (relu) has input size 2 not in range [min=1, max=1]. ==> Context: Bad node "
       "spec for node. Name: relu OpType: Relu; opsets 11 to 17 are imported as they are"},
      {"other-domain.onnx", ErrorCode::OnnxUnsupportedOpset,
       ": node relu (Relu, opset 14): domain \"com.example\" is not supported; only the default domain "
       "(ai.onnx), "
       "opsets 1 to 17"},
      {"cycle.onnx", ErrorCode::OnnxInvalidGraph,
       ": node first (Relu, opset 14): the node is on a cycle: one of its inputs depends on its own output"},
      {"no-producer.onnx", ErrorCode::OnnxInvalidGraph,
       ": node fc2 (Add, opset 14): input \"hidden\" has no producer: it is neither a graph input, an "
       "initializer "
       "nor the output of a node"},
      {"unbound-dim.onnx", ErrorCode::OnnxUnboundDimension,
       ": input x: axis 0 is the symbolic dimension \"sequence\", which has no value; set "
       "OnnxImportOptions::dimensions[\"sequence\"] (per replica)"},
      {"huge-constant-of-shape.onnx", ErrorCode::OnnxTooLarge,
       ": node fill (ConstantOfShape, opset 14): shape [1000000, 1000000] has more than 16777216 elements, "
       "the "
       "limit for values computed at import"},
      {"initializer-data-short.onnx", ErrorCode::OnnxMalformed,
       ": initializer w: shape [1000, 4] has 4000 elements but the tensor holds data for 4 (0 bytes of raw "
       "data)"},
      {"vector-times-batched-matmul.onnx", ErrorCode::OnnxUnsupportedFeature,
       ": node matmul (MatMul, opset 14): a vector times the batched [2, 4, 5]: give the vector a matrix "
       "axis"},
      {"reshape-computed-shape.onnx", ErrorCode::OnnxUnsupportedFeature,
       ": node reshape (Reshape, opset 14): input 1 (shape, \"s\") is computed by the model; tessera needs "
       "it known "
       "at import (a constant, or shape arithmetic on constants)"},
      {"where-float-condition.onnx", ErrorCode::OnnxUnsupportedFeature,
       ": node where (Where, opset 14): the condition \"x\" is float; bool expected"},
      {"uint8-input.onnx", ErrorCode::OnnxUnsupportedFeature,
       ": input x: element type uint8 is not supported; graph inputs may be float, float16, double, bool (a "
       "float32 0/1 mask), int64 or int32"},
      {"bfloat16-input.onnx", ErrorCode::OnnxUnsupportedFeature,
       ": input x: element type bfloat16 is not supported; graph inputs may be float, float16, double, bool "
       "(a float32 0/1 mask), int64 or int32 (bfloat16 has no device dtype: convert the model to float16 or "
       "float)"},
      {"float16-type-mismatch.onnx", ErrorCode::OnnxInvalidGraph,
       ": node add (Add, opset 14): input 0 (\"x\") is float16 and input 1 (\"b\") is float: Add takes its "
       "float operands in one type (float, float16 or double); cast one of them with a Cast node"},
  };
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  for (const Row& row : rows) {
    CAPTURE(row.file);
    const std::string path = test::sourcePath("tests/data/bad/onnx/" + row.file);
    const auto error = test::catchError<OnnxError>([&] { (void)importOnnx(path, options); });
    REQUIRE(error);
    CHECK(error->code() == row.code);
    CHECK(std::string(error->what()) == "[" + errorId(row.code) + "] " + path + row.message);
  }
}

TEST_CASE("an unsupported op names the node, its op type, the opset and the supported ops") {
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  const std::string path = test::sourcePath("tests/data/bad/onnx/unsupported-op.onnx");
  const auto error = test::catchError<OnnxError>([&] { (void)importOnnx(path, options); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OnnxUnsupportedOp);
  CHECK(error->subject() == path + ": node lrn1 (LRN, opset 14)");
  CHECK(error->detail().starts_with(
      "op type LRN is not supported; supported: Abs, Add, And, AveragePool, BatchNormalization, Cast, Clip, "
      "Concat, Constant, Conv, ConvTranspose, Div,"));
  CHECK(error->detail().find("SoftmaxCrossEntropyLoss") != std::string::npos);
  CHECK(error->detail().find("on values known at import also: ConstantOfShape") != std::string::npos);
  // The lists are the mapping table's (onnx/op_mapping.hpp); docs/onnx.md describes each op type.
  const std::string doc = test::readText(test::sourcePath("docs/onnx.md"));
  std::string list = error->detail().substr(error->detail().find("supported: ") + 11);
  const std::string also = "; on values known at import also: ";
  list.replace(list.find(also), also.size(), ", ");
  std::size_t names = 0;
  for (std::size_t at = 0; at < list.size(); ++names) {
    const std::size_t end = std::min(list.find(", ", at), list.size());
    const std::string name = list.substr(at, end - at);
    CHECK_MESSAGE(doc.find("`" + name + "`") != std::string::npos, name, " is not described in docs/onnx.md");
    at = end + 2;
  }
  CHECK(names > 70);
}

TEST_CASE("a shape that does not fit an op wraps the graph's error with the node named") {
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  const std::string path = test::sourcePath("tests/data/bad/onnx/shape-mismatch.onnx");
  const auto error = test::catchError<OnnxError>([&] { (void)importOnnx(path, options); });
  REQUIRE(error);
  CHECK(error->code() == ErrorCode::OnnxNodeShape);
  CHECK(error->subject() == path + ": node matmul (MatMul, opset 14)");
  CHECK(error->detail().starts_with("[tessera.graph.201]"));
}

TEST_CASE("import from bytes names the source; a missing file is unreadable") {
  const std::string text = "not a model";
  const auto fromBytes = test::catchError<OnnxError>([&] {
    (void)importOnnx(std::as_bytes(std::span<const char>(text.data(), text.size())), {}, "upload");
  });
  REQUIRE(fromBytes);
  CHECK(fromBytes->code() == ErrorCode::OnnxMalformed);
  CHECK(fromBytes->subject() == "upload");

  const auto missing = test::catchError<IoError>([] { (void)importOnnx("no/such/model.onnx", {}); });
  REQUIRE(missing);
  CHECK(missing->code() == ErrorCode::FileUnreadable);

  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  options.replicationFactor = 0;
  const auto badReplication = test::catchError<OnnxError>([&] { (void)importOnnx(kModel, options); });
  REQUIRE(badReplication);
  CHECK(badReplication->code() == ErrorCode::OnnxInvalidGraph);
}

TEST_CASE("constantInputs fix an input at import so that it can feed Reshape's shape") {
  const std::string path = test::sourcePath("tests/data/bad/onnx/reshape-computed-shape.onnx");
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  options.constantInputs["s"] = OnnxTensor{"s", "int64", {2}, {4, 2}};
  OnnxModel model = importOnnx(path, options);
  CHECK(model.inputs == std::vector<std::string>{"x"});
  CHECK(model.graph.tensor(model.graph.find("y")).shape == Shape{4, 2});

  options.constantInputs["s"] = OnnxTensor{"s", "float", {2}, {4, 2}};
  const auto wrongType = test::catchError<OnnxError>([&] { (void)importOnnx(path, options); });
  REQUIRE(wrongType);
  CHECK(wrongType->code() == ErrorCode::OnnxInvalidGraph);
  CHECK(wrongType->detail() == "constantInputs gives a float tensor for an input of type int64");
}

// The MLP export with PopART's __recompute_output_in_backward_pass on every
// node of type `opType`, holding `value`, as bytes.
std::string withRecomputeAttribute(const std::string& opType, int64_t value) {
  onnx::ModelProto model;
  REQUIRE(model.ParseFromString(test::readText(test::sourcePath("tests/data/onnx/mlp.onnx"))));
  bool found = false;
  for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node()) {
    if (node.op_type() != opType) continue;
    onnx::AttributeProto* attribute = node.add_attribute();
    attribute->set_name("__recompute_output_in_backward_pass");
    attribute->set_type(onnx::AttributeProto::INT);
    attribute->set_i(value);
    found = true;
  }
  REQUIRE(found);
  return model.SerializeAsString();
}

OnnxModel importBytes(const std::string& bytes) {
  OnnxImportOptions options;
  options.dimensions = {{"batch", 2}};
  return importOnnx(std::as_bytes(std::span(bytes.data(), bytes.size())), options, "mlp.onnx");
}

TEST_CASE("PopART's __recompute_output_in_backward_pass marks the ops a node became; other values are refused") {
  const OnnxModel plain = importBytes(withRecomputeAttribute("Relu", 0));
  for (const OpNode& op : plain.graph.ops()) CHECK(op.recompute == RecomputeType::Undefined);
  const OnnxModel recompute = importBytes(withRecomputeAttribute("Relu", 2));
  int64_t marked = 0;
  for (const OpNode& op : recompute.graph.ops()) {
    if (op.recompute == RecomputeType::Undefined) continue;
    CHECK(op.recompute == RecomputeType::Recompute);
    CHECK(op.kind == OpKind::Relu);
    ++marked;
  }
  CHECK(marked >= 1);
  const OnnxModel checkpoint = importBytes(withRecomputeAttribute("Relu", 1));
  CHECK(std::any_of(checkpoint.graph.ops().begin(), checkpoint.graph.ops().end(),
                    [](const OpNode& op) { return op.recompute == RecomputeType::Checkpoint; }));
  for (const int64_t value : {int64_t{3}, int64_t{-1}, int64_t{7}}) {
    CAPTURE(value);
    const auto error = test::catchError<OnnxError>([&] { (void)importBytes(withRecomputeAttribute("Relu", value)); });
    REQUIRE(error.has_value());
    CHECK(error->id() == "tessera.onnx.720");
    const std::string message = error->what();
    CHECK(message.find("(Relu, opset") != std::string::npos);
    CHECK(message.find(fmt::format("attribute __recompute_output_in_backward_pass is {}; it must be 0 "
                                   "(Undefined), 1 (Checkpoint) or 2 (Recompute)",
                                   value)) != std::string::npos);
  }
}

}  // namespace
}  // namespace tessera
