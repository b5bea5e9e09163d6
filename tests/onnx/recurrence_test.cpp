// PyTorch's recurrent layers through ONNX: the GRU, bidirectional LSTM and
// RNN sequence classifiers of tests/data/onnx (generate_recurrent.py), and
// their two-layer forms (a GRU, a bidirectional LSTM, a bidirectional RNN:
// one node per layer chained by the export's Transpose/Reshape glue), train
// from a run config with PyTorch's per-step SGD losses, on one replica and
// on two with the same global batch; and what the recurrences do not
// compute is refused with the node and the attribute or input named.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include <fmt/format.h>
#include <nlohmann/json.hpp>
#include <onnx/onnx_pb.h>

#include "support/onnx_models.hpp"
#include "tessera/lib/error.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/app/trainer.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const json& reference() {
  static const json value = test::readJson("tests/data/onnx/recurrent_training_reference.json");
  return value;
}

// The run config of `model` on the committed dataset: SGD as the reference,
// batches of 8 in file order for the reference's steps, `replicas` replicas
// sharing the global batch.
RunConfig recurrentConfig(const std::string& model, int64_t replicas) {
  const json& r = reference();
  const int64_t globalBatch = r.at("globalBatch").get<int64_t>();
  const int64_t epochs = r.at("steps").get<int64_t>() * globalBatch / r.at("trainSamples").get<int64_t>();
  const json document = {{"model",
                          {{"type", "Onnx"},
                           {"path", test::sourcePath("tests/data/onnx/" + model + ".onnx")},
                           {"loss", "loss"}}},
                         {"optimizer", r.at("optimizer")},
                         {"data",
                          {{"dataset", "Tensors"},
                           {"path", test::sourcePath("tests/data/onnx/recurrent_train.safetensors")},
                           {"batchSize", globalBatch / replicas},
                           {"epochs", epochs},
                           {"shuffle", false}}}};
  const std::vector<std::string> overrides = {
      "/sessionOptions/enableReplicatedGraphs=" + std::string(replicas > 1 ? "true" : "false"),
      fmt::format("/sessionOptions/replicatedGraphCount={}", replicas),
      "/sessionOptions/accumulationAndReplicationReductionType=Mean"};
  return parseRunConfig(document.dump(), model + ".json", overrides).config;
}

TEST_CASE(
    "GRU, bidirectional LSTM and RNN classifiers, one layer and two, train with PyTorch's per-step SGD "
    "losses") {
  for (const std::string model : {"gru_classifier", "bilstm_classifier", "rnn_classifier", "gru2_classifier",
                                  "bilstm2_classifier", "birnn2_classifier"}) {
    CAPTURE(model);
    const json& expected = reference().at("models").at(model);
    const std::vector<double> float32 = expected.at("losses").get<std::vector<double>>();
    const std::vector<double> float64 = expected.at("lossesFloat64").get<std::vector<double>>();
    const TrainSummary one = train(recurrentConfig(model, 1));
    REQUIRE(one.losses.size() == float32.size());
    double worst = 0.0;
    double worst64 = 0.0;
    double torch64 = 0.0;
    for (std::size_t i = 0; i < float32.size(); ++i) {
      worst = std::max(worst, std::fabs(one.losses[i] - float32[i]));
      worst64 = std::max(worst64, std::fabs(one.losses[i] - float64[i]));
      torch64 = std::max(torch64, std::fabs(float32[i] - float64[i]));
    }
    INFO(
        fmt::format("{}: largest |loss - PyTorch float32| {:.3g}, |loss - PyTorch float64| {:.3g} (PyTorch "
                    "float32's: {:.3g})",
                    model, worst, worst64, torch64));
    CHECK(worst <= 1e-5);
    CHECK(worst64 <= 1e-5);
    CHECK(test::worstRelativeDifference(one.losses, float32) <= 1e-6);
    // The losses fall: the model learns.
    CHECK(one.losses.back() < one.losses.front());

    // Two replicas of half the batch: the losses of one replica.
    const TrainSummary two = train(recurrentConfig(model, 2));
    CHECK(two.globalBatch == one.globalBatch);
    CHECK(test::worstRelativeDifference(two.losses, one.losses) <= 1e-6);
  }
}

// The GRU export with its recurrent node edited by `edit`.
std::string editedGru(void (*edit)(onnx::NodeProto&)) {
  onnx::ModelProto model;
  REQUIRE(model.ParseFromString(test::readText(test::sourcePath("tests/data/onnx/gru_classifier.onnx"))));
  for (onnx::NodeProto& node : *model.mutable_graph()->mutable_node())
    if (node.op_type() == "GRU") edit(node);
  return model.SerializeAsString();
}

onnx::AttributeProto& addAttribute(onnx::NodeProto& node, const std::string& name,
                                   onnx::AttributeProto::AttributeType type) {
  onnx::AttributeProto* a = node.add_attribute();
  a->set_name(name);
  a->set_type(type);
  return *a;
}

TEST_CASE("what the recurrences do not compute is refused with the node and what is allowed") {
  struct Case {
    const char* name;
    void (*edit)(onnx::NodeProto&);
    const char* detail;
  };
  const Case cases[] = {
      {"another activation",
       [](onnx::NodeProto& node) {
         onnx::AttributeProto& a = addAttribute(node, "activations", onnx::AttributeProto::STRINGS);
         a.add_strings("Relu");
         a.add_strings("Tanh");
       },
       "attribute activations is [Relu, Tanh]; allowed: [Sigmoid, Tanh] (ONNX's default for forward GRU)"},
      {"clip",
       [](onnx::NodeProto& node) { addAttribute(node, "clip", onnx::AttributeProto::FLOAT).set_f(3.0f); },
       "attribute clip (3) is not supported; allowed: no clip (the cell state and gates unclipped)"},
      {"batch-first layout",
       [](onnx::NodeProto& node) { addAttribute(node, "layout", onnx::AttributeProto::INT).set_i(1); },
       "attribute layout is 1; allowed: 0 ([seq, batch, ...], as PyTorch exports; transpose a batch-first "
       "input "
       "around the node instead)"},
      {"an unknown direction",
       [](onnx::NodeProto& node) {
         addAttribute(node, "direction", onnx::AttributeProto::STRING).set_s("sideways");
       },
       "attribute direction is \"sideways\"; allowed: \"forward\", \"reverse\", \"bidirectional\""},
      {"sequence lengths computed by the model", [](onnx::NodeProto& node) { node.set_input(4, "x"); },
       "input 4 (sequence_lens, \"x\") must be known at import and equal to the 6 steps of X for every "
       "sequence; "
       "allowed: absent, or all 6 (pad the sequences to one length)"},
  };
  for (const Case& c : cases) {
    CAPTURE(c.name);
    const std::string bytes = editedGru(c.edit);
    OnnxImportOptions options;
    options.dimensions = {{"batch", 2}};
    const auto error = test::catchError<OnnxError>([&] {
      (void)importOnnx(std::span(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size()), options);
    });
    REQUIRE(error);
    CHECK(error->code() == ErrorCode::OnnxUnsupportedRecurrence);
    CHECK(error->subject().ends_with("node /rnn/GRU (GRU, opset 14)"));
    CHECK(error->detail() == c.detail);
  }
}

TEST_CASE("the GRU export imports as one Gru op whose states give Y_h, with PyTorch's weights trainable") {
  OnnxImportOptions options;
  options.dimensions = {{"batch", 4}};
  const OnnxModel model = importOnnx(test::sourcePath("tests/data/onnx/gru_classifier.onnx"), options);
  CHECK(model.weights == std::vector<std::string>{"rnn.weight_ih_l0", "rnn.weight_hh_l0", "rnn.bias_ih_l0",
                                                  "rnn.bias_hh_l0", "fc.weight", "fc.bias"});
  int grus = 0;
  for (const OpNode& op : model.graph.ops()) {
    if (op.kind != OpKind::Gru) continue;
    ++grus;
    CHECK(op.attributes.linearBeforeReset);
    CHECK(op.attributes.direction == RecurrenceDirection::Forward);
    // States [S+1, D, B, 5H]: h, z, r, n and the reset's operand per step.
    CHECK(model.graph.tensor(op.outputs[0]).shape == Shape{7, 1, 4, 40});
  }
  CHECK(grus == 1);
}

TEST_CASE("a two-layer bidirectional LSTM export is one Lstm op per layer, each layer's parameters weights") {
  const OnnxModel model = test::importWithBatch("bilstm2_classifier.onnx", 4);
  for (const std::string layer : {"l0", "l1", "l0_reverse", "l1_reverse"}) {
    for (const std::string name : {"weight_ih", "weight_hh", "bias_ih", "bias_hh"}) {
      CAPTURE(name + "_" + layer);
      CHECK(std::find(model.weights.begin(), model.weights.end(), "rnn." + name + "_" + layer) !=
            model.weights.end());
    }
  }
  CHECK(model.weights.size() == 18);
  int lstms = 0;
  for (const OpNode& op : model.graph.ops()) {
    if (op.kind != OpKind::Lstm) continue;
    ++lstms;
    CHECK(op.attributes.direction == RecurrenceDirection::Bidirectional);
  }
  CHECK(lstms == 2);
}

}  // namespace
}  // namespace tessera
