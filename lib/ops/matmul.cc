// The matmul family: MatMul, [.., M, K] x [K, N] -> [.., M, N] (a batched
// left operand is one tall matrix).
#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {

void addMatMulOps(OpTable& table) {
  table.add({.kind = OpKind::MatMul,
             .family = OpFamily::MatMul,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(2);
               c.dtype(0, DType::Float32);
               c.dtype(1, DType::Float32);
               c.minRank(0, 2);
               if (c.rank(1) != 2 || c.shape(0).back() != c.shape(1)[0]) {
                 c.fail(ErrorCode::ShapeMismatch,
                        fmt::format("{} x {}: the right operand must be [K, N] with K equal to the left operand's "
                                    "last dimension",
                                    c.desc(0), c.desc(1)));
               }
               Shape out = c.shape(0);
               out.back() = c.shape(1)[1];
               return {{out, DType::Float32, {}}};
             },
             // Each gradient is a GEMM as large as the forward product: build only the wanted ones.
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               const Tensor a = g.in(0);
               const Tensor b = g.in(1);
               const int64_t k = b.shape()[0];
               const int64_t n = b.shape()[1];
               std::vector<Tensor> out{Tensor{}, Tensor{}};
               if (g.isWanted(0)) out[0] = ops::matmul(g.dy, ops::transpose(b));
               if (g.isWanted(1)) {
                 const Tensor a2 = a.shape().size() == 2 ? a : ops::reshape(a, {-1, k});
                 const Tensor dy2 = g.dy.shape().size() == 2 ? g.dy : ops::reshape(g.dy, {-1, n});
                 out[1] = ops::matmul(ops::transpose(a2), dy2);
               }
               return out;
             },
             // Every leading index of the left operand is a separate matrix.
             .reference = [](ReferenceOp& r, int64_t replica) {
               const std::vector<double>& a = r.in(0, replica);
               const std::vector<double>& b = r.in(1, replica);
               std::vector<double>& out = r.out(replica);
               const auto k = static_cast<std::size_t>(r.inShape(1)[0]);
               const auto n = static_cast<std::size_t>(r.inShape(1)[1]);
               const std::size_t rows = k == 0 ? out.size() / std::max<std::size_t>(n, 1) : a.size() / k;
               for (std::size_t row = 0; row < rows; ++row) {
                 for (std::size_t j = 0; j < n; ++j) {
                   double sum = 0.0;
                   for (std::size_t q = 0; q < k; ++q) sum += a[row * k + q] * b[q * n + j];
                   out[row * n + j] = sum;
                 }
               }
             },
             .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
               const Shape& a = graph.tensor(op.inputs[0]).shape;
               return {.flops = 2.0 * elementsOf(graph, op.outputs[0]) *
                                (a.empty() ? 1.0 : static_cast<double>(a.back()))};
             }});
}

}  // namespace tessera
