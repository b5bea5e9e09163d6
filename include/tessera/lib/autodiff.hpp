// Reverse-mode automatic differentiation over the graph IR.
//
// autodiff appends the gradient ops to the same graph, PopXL style, so the
// forward and backward passes form one SPMD program. The loss of the program
// is the global loss L = sum over replicas of each replica's `loss`; the
// gradient of a collective follows that definition (the gradient of an
// AllReduce-Sum is an AllReduce-Sum of the incoming gradient, of an AllGather
// a ReduceScatter-Sum, and so on: see lib/gradients.cc).
#pragma once

#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera {

// Returns d(loss)/d(w) for every w in `wrt`, in order, named "<w>.grad".
// `loss` must be a float32 scalar (shape []): AutodiffError(LossNotScalar).
// A w that does not influence the loss gets a zero gradient (a constant). An
// op on the path from a w to the loss that has no gradient rule (ArgMax,
// remote loads and stores, the gradient helper ops) throws
// AutodiffError(NoGradient) naming the op and the tensor. An int32 w throws
// AutodiffError(NoGradient).
//
// `seed` is the gradient of the loss itself: 1 when not given, else a
// float32 or float16 scalar tensor of the graph (shape [];
// GraphError(InvalidOperand) otherwise), cast to the loss's dtype, e.g. a
// loss scale, which then multiplies every gradient.
std::vector<Tensor> autodiff(Graph& graph, Tensor loss, const std::vector<Tensor>& wrt, Tensor seed = {});

}  // namespace tessera
