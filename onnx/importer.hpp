// The importer's state while it walks one model.
#pragma once

#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "onnx_internal.hpp"
#include "tessera/onnx/onnx.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera::onnx_import {

// An ONNX value during import: known (folded, a constant initializer) or a
// tensor of the graph, or both once a known value has been materialised.
struct Value {
  std::optional<Known> known;
  TensorId id = kNoTensor;
  int32_t type = onnx::TensorProto::FLOAT;  // the ONNX element type
};

// The inputs of `node` through which a gradient flows to its outputs (data
// operands; not shapes, indices, labels or conditions).
std::vector<int> differentiableInputs(const onnx::NodeProto& node, int64_t opset);

// OnnxInvalidGraph for a node of a known op type without its required
// inputs or its output.
void checkArity(const onnx::NodeProto& node, int64_t opset, const std::string& subject);

class Importer {
 public:
  Importer(const onnx::ModelProto& model, const OnnxImportOptions& options, std::string source);
  OnnxModel run();

  // The mapping functions of the table (op_mapping.hpp), one or more per
  // family file onnx/ops/<family>.cc: each emits the ops of one node.
  // ops/sources.cc
  void mapConstant(const onnx::NodeProto& node, const std::string& subject);
  // ops/elementwise.cc
  void mapArithmetic(const onnx::NodeProto& node, const std::string& subject);
  void mapPow(const onnx::NodeProto& node, const std::string& subject);
  void mapUnary(const onnx::NodeProto& node, const std::string& subject);
  void mapFloatUnary(const onnx::NodeProto& node, const std::string& subject);
  void mapClip(const onnx::NodeProto& node, const std::string& subject);
  void mapPRelu(const onnx::NodeProto& node, const std::string& subject);
  void mapVariadic(const onnx::NodeProto& node, const std::string& subject);
  // ops/matmul.cc
  void mapMatMul(const onnx::NodeProto& node, const std::string& subject);
  void mapGemm(const onnx::NodeProto& node, const std::string& subject);
  // ops/reductions.cc
  void mapReduce(const onnx::NodeProto& node, const std::string& subject);
  // ops/shape_ops.cc
  void mapIdentity(const onnx::NodeProto& node, const std::string& subject);
  void mapReshape(const onnx::NodeProto& node, const std::string& subject);
  void mapTranspose(const onnx::NodeProto& node, const std::string& subject);
  void mapSlice(const onnx::NodeProto& node, const std::string& subject);
  void mapConcat(const onnx::NodeProto& node, const std::string& subject);
  void mapExpand(const onnx::NodeProto& node, const std::string& subject);
  void mapSplit(const onnx::NodeProto& node, const std::string& subject);
  void mapTile(const onnx::NodeProto& node, const std::string& subject);
  void mapPad(const onnx::NodeProto& node, const std::string& subject);
  // ops/softmax.cc
  void mapSoftmax(const onnx::NodeProto& node, const std::string& subject);
  void mapLoss(const onnx::NodeProto& node, const std::string& subject);
  // ops/gather.cc
  void mapGather(const onnx::NodeProto& node, const std::string& subject);
  void mapElements(const onnx::NodeProto& node, const std::string& subject);
  // Gather's and the element ops' data (input 0, float) and int32 indices
  // (input 1), with the node's `axis` normalised against the data's rank.
  struct IndexedData {
    Tensor data;
    Tensor indices;
    int64_t axis = 0;
  };
  IndexedData indexedData(const onnx::NodeProto& node, const std::string& subject);
  // ops/conv.cc (Conv, ConvTranspose) and ops/pooling.cc (MaxPool, AveragePool): mapWindowOp's result.
  void mapWindow(const onnx::NodeProto& node, const std::string& subject);
  // ops/pooling.cc
  void mapGlobalPool(const onnx::NodeProto& node, const std::string& subject);
  // ops/recurrence.cc: RNN, GRU, LSTM as ops::recurrence, with Y, Y_h and Y_c.
  void mapRecurrence(const onnx::NodeProto& node, const std::string& subject);
  // ops/masks.cc
  void mapCompare(const onnx::NodeProto& node, const std::string& subject);
  void mapLogical(const onnx::NodeProto& node, const std::string& subject);
  void mapWhere(const onnx::NodeProto& node, const std::string& subject);
  void mapCast(const onnx::NodeProto& node, const std::string& subject);
  void mapDropout(const onnx::NodeProto& node, const std::string& subject);
  // ops/normalization.cc
  void mapBatchNormalization(const onnx::NodeProto& node, const std::string& subject);
  void mapLayerNormalization(const onnx::NodeProto& node, const std::string& subject);

 private:
  std::string nodeSubject(const onnx::NodeProto& node) const;
  // Node indices in an order where producers come first.
  std::vector<int> topologicalOrder(const std::unordered_set<std::string>& initializers);
  std::unordered_set<std::string> gradientReached(const std::unordered_set<std::string>& initializers) const;
  TensorId addSource(OpKind kind, const std::string& name, DType dtype, const Shape& shape,
                     const std::vector<float>& data, const std::string& subject);
  // False when the input is one of constantInputs (no host stream).
  bool addInput(const onnx::ValueInfoProto& input);
  void addConstantInput(const onnx::ValueInfoProto& input, const OnnxTensor& tensor,
                        const std::string& subject);
  // The graph tensor of a value, creating a Constant for a known one.
  TensorId materialize(const std::string& name, const std::string& subject);
  void bindOutput(const std::string& name);
  void importNode(const onnx::NodeProto& node);
  // node_mapping.cc: emits the tessera ops of one node through the mapping
  // table (op_mapping.hpp).
  void mapNode(const onnx::NodeProto& node, const std::string& subject);
  // Conv, ConvTranspose, MaxPool, AveragePool (ops/conv.cc): the op with its window and bias.
  Tensor mapWindowOp(const onnx::NodeProto& node, const std::string& subject);

  // Helpers of mapNode.
  Tensor operand(const onnx::NodeProto& node, int k, const std::string& subject);
  const Known* knownInput(const onnx::NodeProto& node, int k) const;
  const Known& requireKnown(const onnx::NodeProto& node, int k, const std::string& subject,
                            std::string_view what) const;
  void requireFloat(const Tensor& t, const onnx::NodeProto& node, int k, const std::string& subject) const;
  void setOutput(const onnx::NodeProto& node, int k, Tensor t, int32_t type = onnx::TensorProto::FLOAT);
  // A scalar of the float dtype `dtype` (the operand it combines with).
  Tensor scalar(double value, DType dtype);
  // The device dtype of a value of ONNX float type `type`: float follows
  // OnnxImportOptions::floatType, float16 is Float16, double Float64.
  DType deviceFloat(int32_t type) const;
  // `t` (a float32 mask, int32, float32, float16 or float64) in `dtype`
  // (Float32 or Float16): float16 is made from float32 only.
  Tensor toFloat(Tensor t, DType dtype);
  // OnnxInvalidGraph for a node whose float operands disagree in ONNX type
  // where a float16 one is involved (ONNX's type constraints give them one
  // type); sets nodeFloatType_.
  void checkFloatOperands(const onnx::NodeProto& node, const std::string& subject);
  // Marks the ops created for `node` from op `first` on: normalisations and
  // PopART's __recompute_output_in_backward_pass (OnnxInvalidRecompute for a
  // value that is not 0, 1 or 2).
  void markRecompute(const onnx::NodeProto& node, OpId first, const std::string& subject);
  // Places the ops created for `node` from op `first` on PopART's
  // __ipu_number (OnnxInvalidIpuNumber for a value that is not a
  // non-negative int); remembers it for the copies of graph outputs.
  void markVirtualGraph(const onnx::NodeProto& node, OpId first, const std::string& subject);
  // __pipeline_stage: a non-negative int (else GraphError(InvalidPipelineStage)).
  void markPipelineStage(const onnx::NodeProto& node, OpId first, const std::string& subject);
  // __execution_phase: a non-negative int (else GraphError(InvalidExecutionPhase)).
  void markExecutionPhase(const onnx::NodeProto& node, OpId first, const std::string& subject);
  // Input k, an initializer, made a Variable of category OptimizerState that
  // the node updates in place (OnnxModel::state).
  Tensor stateVariable(const onnx::NodeProto& node, int k, const std::string& subject);

  const onnx::ModelProto& model_;
  const OnnxImportOptions& options_;
  // The __ipu_number of the last node that had one (kNoVirtualGraph: none).
  int64_t lastIpuNumber_ = kNoVirtualGraph;
  // The __pipeline_stage of the last node that had one (kNoPipelineStage: none).
  int64_t lastPipelineStage_ = kNoPipelineStage;
  // The __execution_phase of the last node that had one (kNoExecutionPhase: none).
  int64_t lastExecutionPhase_ = kNoExecutionPhase;
  std::string source_;
  Graph graph_;
  int64_t opset_ = 0;
  int64_t nodeIndex_ = 0;
  // The ONNX type of the float operands of the node being mapped (float when
  // it has none): a float16 result of the node is tagged with it.
  int32_t nodeFloatType_ = onnx::TensorProto::FLOAT;
  TensorId firstNewTensor_ = 0;  // the first tensor the node being mapped created
  std::unordered_map<std::string, Value> values_;
  std::vector<std::string> state_;  // initializers made state Variables (OnnxModel::state)
  Tensor dropoutStep_;              // this step's value of the dropout counter, once a node needs it
  int64_t dropoutNodes_ = 0;
};

}  // namespace tessera::onnx_import
