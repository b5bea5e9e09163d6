// Building an ONNX model in code, node by node: PopART's Builder. A program
// (or the Python module's tessera.Builder) declares inputs and initializers,
// adds nodes of the default ONNX domain by op type, marks outputs, and takes
// the serialized ModelProto to import (importOnnx) or to hand to a session:
//
//   tessera::OnnxBuilder builder;  // opset 14
//   const std::string x = builder.addInputTensor("FLOAT", {8, 784}, "x");
//   const std::string w = builder.addInitializedInputTensor(weights, "W0");
//   const std::string y = builder.addNode("MatMul", std::vector{x, w})[0];
//   const std::string probs = builder.addNode("Softmax", std::vector{y}, {{"axis", int64_t{1}}})[0];
//   const std::string loss = builder.nllLoss(probs, labels, "Mean");
//   builder.addOutputTensor(loss);
//   std::string model = builder.modelProto();
//
// Every node is checked as it is added, against ONNX's schema of its op at the
// builder's opset: the op type (matched ignoring case, so "matmul" is MatMul),
// the number of inputs and outputs, the input names (each must be a tensor
// the builder made), and the attributes' names and types. The finished model
// passes ONNX's checker. What the builder accepts is a valid ONNX model;
// whether tessera's importer maps every op of it is the importer's question
// (tessera.onnx.704 names the node).
//
// Names: an input is `debugName` or "input", an initializer `debugName` or
// "init_input", the outputs of a node "NAME:0", "NAME:1", ... where NAME is
// the node's `debugName` or its op type; a name already taken gets "/1",
// "/2", ... appended, as PopART's builder does (a node's outputs together:
// "NAME:0/1", "NAME:1/1").
//
// Errors: OnnxError(OnnxBuilderUnknown) for an op type, attribute or tensor
// the builder does not know (with the nearest name when one is close),
// OnnxError(OnnxBuilderInvalid) for anything else it refuses (an element
// type, a count of inputs or outputs, an attribute of the wrong type, a model
// the checker refuses). A build without ONNX throws OnnxError(OnnxUnavailable)
// from the constructor.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <variant>
#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/onnx/onnx.hpp"

namespace tessera {

// The value of a node attribute, as ONNX's AttributeProto types: INT, FLOAT,
// STRING, INTS, FLOATS, STRINGS. An integer given where the schema wants a
// float (or integers where it wants floats) is taken as that float; an empty
// list means "not set" (the op's default), as PopART's builder treats it.
using OnnxAttribute = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<double>,
                                   std::vector<std::string>>;
using OnnxAttributes = std::map<std::string, OnnxAttribute, std::less<>>;

class OnnxBuilder {
 public:
  // `opset`: the version of the default ONNX domain the model is written for
  // (tessera imports 11 to 17); OnnxBuilderInvalid outside that range.
  explicit OnnxBuilder(int64_t opset = 14);
  ~OnnxBuilder();
  OnnxBuilder(OnnxBuilder&&) noexcept;
  OnnxBuilder& operator=(OnnxBuilder&&) noexcept;

  int64_t opset() const noexcept;

  // A graph input (a host stream once imported) of element type `dtype`,
  // PopART's TensorInfo name in any case: "FLOAT", "FLOAT16", "DOUBLE",
  // "INT32", "INT64", "BOOL" (also "float32", "int64", ...); every axis >= 0.
  std::string addInputTensor(std::string_view dtype, const Shape& shape, std::string_view debugName = {});

  // An initializer holding `value` (a weight once imported, when a gradient
  // reaches it): value.dtype is ONNX's lower-case element type ("float",
  // "float16", "double", "int32", "int64", "bool") and value.values the
  // elements in row-major order. Float values are stored as the element type
  // holds them (float16 rounded to nearest even); integers must fit it.
  std::string addInitializedInputTensor(const OnnxTensor& value, std::string_view debugName = {});

  // A node of the default ONNX domain. `numOutputs` 0 takes the op's least
  // number of outputs. Returns the output names.
  std::vector<std::string> addNode(std::string_view opType, std::span<const std::string> inputs,
                                   const OnnxAttributes& attributes = {}, int64_t numOutputs = 0,
                                   std::string_view debugName = {});

  // ONNX's spelling of op type `name` (matched ignoring case) in the default
  // domain at this opset; nullopt when there is none.
  std::optional<std::string> opType(std::string_view name) const;
  // True when the op has a variable number of outputs or more than one
  // (PopART's builder methods then take num_outputs and return a list).
  bool hasSeveralOutputs(std::string_view opType) const;

  // ----- PopART's losses (aiGraphcore), written as standard ONNX nodes -----
  // `reduction` is "Sum", "Mean" or "NoReduction", per replica.

  // Negative log likelihood of `labels` (int32 or int64 class indices,
  // [N, ...]) under `probabilities` ([N, C, ...], softmax outputs; or log
  // probabilities when inputIsLogProbability). Mean divides by the number of
  // labels not equal to ignoreIndex. Log, then NegativeLogLikelihoodLoss.
  std::string nllLoss(const std::string& probabilities, const std::string& labels, std::string_view reduction,
                      std::optional<int64_t> ignoreIndex = std::nullopt, bool inputIsLogProbability = false,
                      std::string_view debugName = {});
  // lambda x |x| summed (Sum), averaged over every element (Mean), or
  // elementwise (NoReduction).
  std::string l1Loss(const std::string& input, double lambda, std::string_view reduction,
                     std::string_view debugName = {});
  // The input itself as the loss: summed, averaged over every element, or as
  // it is.
  std::string identityLoss(const std::string& input, std::string_view reduction, std::string_view debugName = {});

  // PopART's aiGraphcore.gelu: x * (1 + erf(x / sqrt 2)) / 2, as ONNX nodes
  // (Div, Erf, Add, Mul, Mul) the way PyTorch exports nn.GELU.
  std::string gelu(const std::string& input, std::string_view debugName = {});

  // Marks `tensor` as a graph output.
  void addOutputTensor(std::string_view tensor);

  // Sets an attribute of the node that made `tensor` (PopART's annotations:
  // virtualGraph writes "__ipu_number", recomputeOutputInBackwardPass
  // "__recompute_output_in_backward_pass"). Attributes whose names begin with
  // "__" are not in any schema and are not checked against one.
  void setNodeAttribute(std::string_view tensor, std::string_view name, const OnnxAttribute& value);

  // Attributes every node added from now on carries until cleared (PopART's
  // builder scopes: `with builder.virtualGraph(1):` sets "__ipu_number" on
  // each node made inside). Only "__" annotations, which no schema checks.
  // An attribute given to addNode itself wins over the scope's.
  void setScopeAttribute(std::string_view name, const OnnxAttribute& value);
  // Ends the scope of `name`, restoring the value it had before the last
  // setScopeAttribute of that name (scopes nest).
  void clearScopeAttribute(std::string_view name);

  // The element type ("float", "int64", ...) and shape of `tensor`, by ONNX's
  // shape inference over the model so far; OnnxBuilderInvalid when it cannot
  // infer them.
  // The inference runs once per change of the model: queries between two
  // changes share its result.
  Shape tensorShape(std::string_view tensor) const;
  std::string tensorDtype(std::string_view tensor) const;
  // How many times ONNX's shape inference has run for the queries so far.
  int64_t shapeInferenceRuns() const noexcept;

  // The model as a serialized ModelProto, accepted by ONNX's checker.
  std::string modelProto() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace tessera
