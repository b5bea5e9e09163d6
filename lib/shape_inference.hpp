// Operand checks and output shapes of every OpKind (private to lib/).
#pragma once

#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "tessera/graph.hpp"

namespace tessera {

struct OutputSpec {
  Shape shape;
  DType dtype = DType::Float32;
  Shape metaShape;
};

// Checks the operands and attributes of an op of `kind` named `opName` and
// returns its outputs. Normalises `attributes` in place (negative axes made
// positive, a -1 in a Reshape resolved, the default collective grouping made
// explicit) so that later passes read plain values. Throws GraphError naming
// the op, the tensors and their shapes, and what is allowed.
std::vector<OutputSpec> inferOutputs(const Graph& graph, OpKind kind, std::span<const TensorId> inputs,
                                     OpAttributes& attributes, std::string_view opName);

// numpy broadcasting of two shapes; nullopt when they do not broadcast.
std::optional<Shape> broadcastShapes(const Shape& a, const Shape& b);

// "\"x\" [2, 3] float32", for error messages.
std::string describeTensor(const Graph& graph, TensorId t);

}  // namespace tessera
