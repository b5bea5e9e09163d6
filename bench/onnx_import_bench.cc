// Import time of a large ONNX model: a chain of N nodes (Add of a shared
// initializer, then Relu, alternately) over a [batch, 64] input with a
// symbolic batch axis, serialized once and imported from bytes each
// iteration. The target: 10,000 nodes in under a second.
#include <benchmark/benchmark.h>

#include <cstddef>
#include <span>
#include <string>

#include <onnx/onnx_pb.h>

#include "tessera/onnx/onnx.hpp"

namespace {

std::string chainModel(int64_t nodes) {
  onnx::ModelProto model;
  model.set_ir_version(8);
  auto* opset = model.add_opset_import();
  opset->set_domain("");
  opset->set_version(14);
  onnx::GraphProto* graph = model.mutable_graph();
  graph->set_name("chain");
  auto addValue = [](onnx::ValueInfoProto* value, const std::string& name, bool symbolicBatch) {
    value->set_name(name);
    auto* tensor = value->mutable_type()->mutable_tensor_type();
    tensor->set_elem_type(onnx::TensorProto::FLOAT);
    auto* shape = tensor->mutable_shape();
    if (symbolicBatch) shape->add_dim()->set_dim_param("batch");
    shape->add_dim()->set_dim_value(64);
  };
  addValue(graph->add_input(), "x", true);
  onnx::TensorProto* bias = graph->add_initializer();
  bias->set_name("bias");
  bias->set_data_type(onnx::TensorProto::FLOAT);
  bias->add_dims(64);
  for (int i = 0; i < 64; ++i) bias->add_float_data(0.01f * static_cast<float>(i));
  std::string last = "x";
  for (int64_t i = 0; i < nodes; ++i) {
    onnx::NodeProto* node = graph->add_node();
    const std::string out = "t" + std::to_string(i);
    node->set_name("n" + std::to_string(i));
    if (i % 2 == 0) {
      node->set_op_type("Add");
      node->add_input(last);
      node->add_input("bias");
    } else {
      node->set_op_type("Relu");
      node->add_input(last);
    }
    node->add_output(out);
    last = out;
  }
  addValue(graph->add_output(), last, true);
  return model.SerializeAsString();
}

void importChain(benchmark::State& state) {
  const std::string bytes = chainModel(state.range(0));
  tessera::OnnxImportOptions options;
  options.dimensions["batch"] = 8;
  const std::span<const std::byte> view(reinterpret_cast<const std::byte*>(bytes.data()), bytes.size());
  for (auto _ : state) {
    tessera::OnnxModel model = tessera::importOnnx(view, options, "chain");
    benchmark::DoNotOptimize(model.graph.ops().size());
  }
  state.SetComplexityN(state.range(0));
}
BENCHMARK(importChain)->Arg(1000)->Arg(10000)->Unit(benchmark::kMillisecond)->Complexity();

}  // namespace

BENCHMARK_MAIN();
