// The gradient rule of every OpKind (private to lib/).
#pragma once

#include <span>
#include <vector>

#include "tessera/graph.hpp"

namespace tessera {

// False for the kinds without a gradient rule (ArgMax, the gradient helpers
// ReluGrad, GeluGrad and SoftmaxCrossEntropyGrad, RemoteLoad, RemoteStore).
bool hasGradient(OpKind kind) noexcept;

// Appends the ops computing the gradient of each input of op `op`, given the
// gradients of its outputs (kNoTensor: none, treated as zero). Returns one
// entry per input: the gradient tensor, or kNoTensor when the input gets no
// gradient (int32 operands, the overwritten operand of CopyInplace). Throws
// AutodiffError(NoGradient) for kinds without a gradient rule. `wanted`
// (one entry per input; empty: all) lets a rule skip the ops of gradients
// nobody reads, which MatMul does; skipped entries are kNoTensor.
std::vector<TensorId> gradientOf(Graph& graph, OpId op, std::span<const TensorId> outputGradients,
                                 std::span<const char> wanted = {});

}  // namespace tessera
