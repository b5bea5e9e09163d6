// A GPT-style decoder block exported by PyTorch (tests/data/onnx/generate.py,
// gpt_block): embeddings, causal self-attention with a -inf masked_fill (a
// Where on computed scores), LayerNorms, a GELU MLP and the next-token loss
// inside the graph. Forward on the simulated device gives PyTorch's loss and
// logits at several batch sizes and replication factors.
#include <doctest/doctest.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "tessera/device.hpp"
#include "tessera/onnx.hpp"
#include "tessera/session.hpp"
#include "test_support.hpp"

namespace tessera {
namespace {

using nlohmann::json;

const json& reference() {
  static const json value = [] {
    std::ifstream in(test::sourcePath("tests/data/onnx/gpt_block_reference.json"), std::ios::binary);
    std::ostringstream text;
    text << in.rdbuf();
    return json::parse(text.str());
  }();
  return value;
}

OnnxModel importBlock(int64_t batchPerReplica, int64_t replicas) {
  OnnxImportOptions options;
  options.dimensions = {{"batch", batchPerReplica}};
  options.replicationFactor = replicas;
  return importOnnx(test::sourcePath("tests/data/onnx/gpt_block.onnx"), options);
}

TEST_CASE("the GPT block imports: the causal mask is a select on the device, shape arithmetic is folded") {
  const OnnxModel model = importBlock(2, 1);
  CHECK(model.inputs == std::vector<std::string>{"tokens", "targets"});
  CHECK(model.outputs == std::vector<std::string>{"loss", "logits"});
  const Graph& g = model.graph;
  CHECK(g.tensor(g.find("logits")).shape == Shape{2, 8, 32});
  std::multiset<OpKind> kinds;
  for (const OpNode& op : g.ops()) kinds.insert(op.kind);
  // The mask (a sliced buffer compared with 0) is folded; masked_fill runs as Where.
  CHECK(kinds.count(OpKind::Where) == 1);
  CHECK(kinds.count(OpKind::Equal) == 0);
  CHECK(kinds.count(OpKind::BatchMatMul) == 2);
  CHECK(kinds.count(OpKind::Gather) == 2);
  CHECK(kinds.count(OpKind::SoftmaxCrossEntropy) == 1);
  for (const char* name : {"tokens.weight", "positions.weight", "qkv.weight", "head.bias", "lnf.weight"})
    CHECK(g.tensor(g.find(name)).category == TensorCategory::Weight);
}

TEST_CASE("the GPT block's loss and logits equal PyTorch's at every batch size and replication factor") {
  for (const json& c : reference().at("cases")) {
    const auto batch = c.at("batch").get<int64_t>();
    const std::vector<int32_t> tokens = c.at("tokens").get<std::vector<int32_t>>();
    const std::vector<int32_t> targets = c.at("targets").get<std::vector<int32_t>>();
    const std::vector<float> logits = c.at("logits").get<std::vector<float>>();
    const double loss = c.at("loss").get<double>();
    for (int64_t replicas : {1, 2, 4}) {
      if (batch % replicas != 0) continue;
      CAPTURE(batch);
      CAPTURE(replicas);
      OnnxModel model = importBlock(batch / replicas, replicas);
      SessionOptions options;
      options.enableReplicatedGraphs = replicas > 1;
      options.replicatedGraphCount = replicas;
      InferenceSession session(std::move(model.graph), model.outputs, options, makeSimDevice());
      session.run({StepInput("tokens", tokens), StepInput("targets", targets)});
      const HostTensor& losses = session.output("loss");
      REQUIRE(losses.data.size() == static_cast<std::size_t>(replicas));
      // Every replica's loss is a mean over the same number of targets.
      double mean = 0;
      for (float l : losses.data) mean += l / static_cast<double>(replicas);
      CHECK(std::fabs(mean - loss) <= 1e-5 * std::fabs(loss));
      const HostTensor& got = session.output("logits");
      REQUIRE(got.data.size() == logits.size());
      double worst = 0;
      for (std::size_t k = 0; k < logits.size(); ++k)
        worst = std::max(worst, std::fabs(got.data[k] - logits[k]) /
                                    std::max(1.0, std::fabs(static_cast<double>(logits[k]))));
      CHECK(worst <= 1e-5);
    }
  }
}

}  // namespace
}  // namespace tessera
