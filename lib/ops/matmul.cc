// The matmul family: MatMul, [.., M, K] x [K, N] -> [.., M, N] (a batched
// left operand is one tall matrix), and BatchMatMul, [B.., M, K] x
// [B.., K, N] -> [B.., M, N] (one product per batch index).
#include <algorithm>

#include <fmt/format.h>

#include "op_def.hpp"

namespace tessera {
namespace {

// The operand with its last two axes swapped.
Tensor swapLast(Tensor t) {
  const auto rank = static_cast<int64_t>(t.shape().size());
  std::vector<int64_t> perm(static_cast<std::size_t>(rank));
  for (int64_t i = 0; i < rank; ++i) perm[static_cast<std::size_t>(i)] = i;
  std::swap(perm[static_cast<std::size_t>(rank - 1)], perm[static_cast<std::size_t>(rank - 2)]);
  return ops::transpose(t, perm);
}

}  // namespace

void addMatMulOps(OpTable& table) {
  table.add(
      {.kind = OpKind::MatMul,
       .family = OpFamily::MatMul,
       .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
         c.arity(2);
         const DType dtype = c.floating({0, 1});
         c.minRank(0, 2);
         if (c.rank(1) != 2 || c.shape(0).back() != c.shape(1)[0]) {
           c.fail(ErrorCode::ShapeMismatch,
                  fmt::format("{} x {}: the right operand must be [K, N] with K equal to the left operand's "
                              "last dimension",
                              c.desc(0), c.desc(1)));
         }
         Shape out = c.shape(0);
         out.back() = c.shape(1)[1];
         return {{out, dtype, {}}};
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
       .reference =
           [](ReferenceOp& r, int64_t replica) {
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

  table.add({.kind = OpKind::BatchMatMul,
             .family = OpFamily::MatMul,
             .shape = [](const OpChecker& c, OpAttributes& /*attributes*/) -> std::vector<OutputSpec> {
               c.arity(2);
               const DType dtype = c.floating({0, 1});
               c.minRank(0, 3);
               const Shape& a = c.shape(0);
               const Shape& b = c.shape(1);
               if (b.size() != a.size() || !std::equal(a.begin(), a.end() - 2, b.begin()) ||
                   a.back() != b[b.size() - 2]) {
                 c.fail(ErrorCode::ShapeMismatch,
                        fmt::format("{} x {}: the operands must be [B.., M, K] and [B.., K, N] with the same "
                                    "batch dimensions B..",
                                    c.desc(0), c.desc(1)));
               }
               Shape out = a;
               out.back() = b.back();
               return {{out, dtype, {}}};
             },
             // dA = dY B^T, dB = A^T dY, batch by batch.
             .gradient = [](const GradientContext& g) -> std::vector<Tensor> {
               std::vector<Tensor> out{Tensor{}, Tensor{}};
               if (g.isWanted(0)) out[0] = ops::batchMatmul(g.dy, swapLast(g.in(1)));
               if (g.isWanted(1)) out[1] = ops::batchMatmul(swapLast(g.in(0)), g.dy);
               return out;
             },
             .reference =
                 [](ReferenceOp& r, int64_t replica) {
                   const std::vector<double>& a = r.in(0, replica);
                   const std::vector<double>& b = r.in(1, replica);
                   std::vector<double>& out = r.out(replica);
                   const Shape& as = r.inShape(0);
                   const auto m = static_cast<std::size_t>(as[as.size() - 2]);
                   const auto k = static_cast<std::size_t>(as.back());
                   const auto n = static_cast<std::size_t>(r.inShape(1).back());
                   const std::size_t batches = m * n == 0 ? 0 : out.size() / (m * n);
                   for (std::size_t t = 0; t < batches; ++t) {
                     for (std::size_t i = 0; i < m; ++i) {
                       for (std::size_t j = 0; j < n; ++j) {
                         double sum = 0.0;
                         for (std::size_t q = 0; q < k; ++q)
                           sum += a[(t * m + i) * k + q] * b[(t * k + q) * n + j];
                         out[(t * m + i) * n + j] = sum;
                       }
                     }
                   }
                 },
             .cost = [](const Graph& graph, const OpNode& op) -> OpCost {
               return {.flops = 2.0 * elementsOf(graph, op.outputs[0]) *
                                static_cast<double>(graph.tensor(op.inputs[0]).shape.back())};
             }});
}

}  // namespace tessera
