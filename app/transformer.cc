#include "tessera/app/transformer.hpp"

#include <cmath>
#include <limits>
#include <numbers>
#include <string>

#include <fmt/format.h>

#include "tessera/lib/error.hpp"
#include "tessera/app/mlp.hpp"
#include "tessera/lib/ops.hpp"

namespace tessera {
namespace {

constexpr double kLayerNormEpsilon = 1e-5;
constexpr double kInitStddev = 0.02;

// Makes the parameters in order, each with a seed of its own, so that a
// parameter's initial values do not depend on the widths of the others.
class Parameters {
 public:
  Parameters(Graph& graph, int64_t seed, DType dtype, std::vector<TensorId>& ids)
      : graph_(graph), seed_(static_cast<uint64_t>(seed)), dtype_(dtype), ids_(ids) {}

  Tensor normal(const std::string& name, Shape shape, double stddev) {
    const int64_t count = numElements(shape);
    return add(name, normalValues(count, seed_ * 1000003ull + ids_.size(), stddev), std::move(shape));
  }
  Tensor filled(const std::string& name, Shape shape, float value) {
    const int64_t count = numElements(shape);
    return add(name, InitialValues::filled(count, value), std::move(shape));
  }

 private:
  Tensor add(const std::string& name, InitialValues values, Shape shape) {
    const Tensor t = ops::variable(graph_, name, std::move(values), std::move(shape), std::nullopt,
                                   RetrievalMode::OnePerGroup, TensorCategory::Weight, dtype_);
    ids_.push_back(t.id());
    return t;
  }

  Graph& graph_;
  uint64_t seed_;
  DType dtype_;
  std::vector<TensorId>& ids_;
};

// Over the last axis, as torch.nn.LayerNorm: (x - mean) / sqrt(var + eps) w + b.
Tensor layerNorm(Parameters& parameters, const std::string& prefix, Tensor x, int64_t hidden) {
  const Tensor weight = parameters.filled(prefix + ".weight", {hidden}, 1.0F);
  const Tensor bias = parameters.filled(prefix + ".bias", {hidden}, 0.0F);
  Graph& g = x.graph();
  const auto first = static_cast<OpId>(g.ops().size());
  const Tensor centred = ops::sub(x, ops::reduceMean(x, {-1}, true));
  const Tensor variance = ops::reduceMean(ops::mul(centred, centred), {-1}, true);
  const Tensor normalised =
      ops::div(centred, ops::sqrt(ops::add(variance, ops::scalar(g, kLayerNormEpsilon, x.dtype()))));
  const Tensor out = ops::add(ops::mul(normalised, weight), bias);
  // What RecomputationType::NormOnly recomputes.
  g.markNormalisation(first);
  return out;
}

// x W + b with W [in, out] (GPT-2's Conv1D).
Tensor linear(Parameters& parameters, const std::string& prefix, Tensor x, int64_t in, int64_t out,
              double stddev) {
  const Tensor weight = parameters.normal(prefix + ".weight", {in, out}, stddev);
  const Tensor bias = parameters.filled(prefix + ".bias", {out}, 0.0F);
  return ops::add(ops::matmul(x, weight), bias);
}

// The exact GELU, 0.5 x (1 + erf(x / sqrt 2)).
Tensor gelu(Tensor x) {
  Graph& g = x.graph();
  const DType dtype = x.dtype();
  const Tensor inner = ops::erf(ops::mul(x, ops::scalar(g, 1.0 / std::numbers::sqrt2, dtype)));
  return ops::mul(ops::mul(x, ops::scalar(g, 0.5, dtype)), ops::add(inner, ops::scalar(g, 1.0, dtype)));
}

void requireAtLeastOne(int64_t value, std::string_view key) {
  if (value >= 1) return;
  throw ConfigError(ErrorCode::InvalidModel, fmt::format("/model/{}", key),
                    fmt::format("{} is {}; it must be >= 1", key, value));
}

}  // namespace

std::optional<int64_t> transformerParameterCount(const TransformerConfig& model) {
  // layers (12 h^2 + 13 h) + (vocab + sequence + 2) h [+ h vocab], every step checked.
  const int64_t h = model.hidden;
  int64_t block = 0;
  int64_t rows = 0;
  int64_t count = 0;
  int64_t embeddings = 0;
  bool overflow =
      __builtin_mul_overflow(h, h, &block) || __builtin_mul_overflow(block, int64_t{12}, &block) ||
      __builtin_add_overflow(block, 13 * h, &block) || __builtin_mul_overflow(block, model.layers, &count) ||
      __builtin_add_overflow(model.vocab, model.sequence, &rows) ||
      __builtin_add_overflow(rows, int64_t{2}, &rows) || __builtin_mul_overflow(rows, h, &embeddings) ||
      __builtin_add_overflow(count, embeddings, &count);
  if (!overflow && !model.tiedHead) {
    int64_t head = 0;
    overflow = __builtin_mul_overflow(h, model.vocab, &head) || __builtin_add_overflow(count, head, &count);
  }
  if (overflow) return std::nullopt;
  return count;
}

TransformerGraph buildTransformer(const TransformerConfig& model, int64_t batchSize,
                                  int64_t replicationFactor, int64_t seed, DType dtype) {
  requireAtLeastOne(model.layers, "layers");
  requireAtLeastOne(model.hidden, "hidden");
  requireAtLeastOne(model.heads, "heads");
  requireAtLeastOne(model.vocab, "vocab");
  requireAtLeastOne(model.sequence, "sequence");
  if (model.hidden % model.heads != 0) {
    throw ConfigError(
        ErrorCode::InvalidModel, "/model/heads",
        fmt::format("heads {} does not divide hidden {}: every head attends over hidden / heads "
                    "dimensions; choose heads among the divisors of hidden",
                    model.heads, model.hidden));
  }
  if (batchSize < 1) {
    throw ConfigError(ErrorCode::InvalidData, "/data/batchSize",
                      fmt::format("batch size {} must be >= 1", batchSize));
  }
  if (!isFloating(dtype)) {
    throw ConfigError(ErrorCode::InvalidModel, "/model/dtype",
                      fmt::format("dtype \"{}\" is not a model dtype; expected \"float32\" or \"float16\"",
                                  toString(dtype)));
  }
  // The widest shapes the graph makes must be countable before any is made
  // (validate() bounds them by /limits/maxTensorBytes; a caller may not).
  int64_t tokens = 0;
  int64_t widest = 0;
  const bool overflow = !transformerParameterCount(model) ||
                        __builtin_mul_overflow(batchSize, model.sequence, &tokens) ||
                        __builtin_mul_overflow(tokens, model.vocab, &widest) ||
                        __builtin_mul_overflow(tokens, 4 * model.hidden, &widest) ||
                        __builtin_mul_overflow(tokens, model.sequence, &widest) ||
                        __builtin_mul_overflow(widest, model.heads, &widest);
  if (overflow) {
    throw ConfigError(ErrorCode::ShapeTooLarge, "/model",
                      fmt::format("a transformer of layers {}, hidden {}, heads {}, vocab {}, sequence {} at batch "
                                  "size {} has tensors whose sizes do not fit in 64 bits",
                                  model.layers, model.hidden, model.heads, model.vocab, model.sequence, batchSize));
  }
  const int64_t b = batchSize;
  const int64_t s = model.sequence;
  const int64_t d = model.hidden;
  const int64_t heads = model.heads;
  const int64_t dh = d / heads;

  TransformerGraph out;
  out.graph = Graph(replicationFactor);
  Graph& g = out.graph;
  const Tensor tokenIds = ops::input(g, "tokens", {b, s}, DType::Int32);
  const Tensor targets = ops::input(g, "targets", {b, s}, DType::Int32);
  out.tokens = tokenIds.id();
  out.targets = targets.id();
  Parameters parameters(g, seed, dtype, out.weights);

  const Tensor wte = parameters.normal("wte.weight", {model.vocab, d}, kInitStddev);
  const Tensor wpe = parameters.normal("wpe.weight", {s, d}, kInitStddev);
  // Every sample holds `sequence` tokens, so the position embedding of
  // positions 0 .. s-1 is the whole table.
  Tensor x = ops::add(ops::gather(wte, tokenIds), wpe);

  // The causal mask: key position j > query position i, from two index
  // vectors of `sequence` values (the [s, s] mask is computed on the device).
  std::vector<float> positions(static_cast<std::size_t>(s));
  for (int64_t i = 0; i < s; ++i) positions[static_cast<std::size_t>(i)] = static_cast<float>(i);
  const Tensor queries = ops::constant(g, "causal.queries", positions, {s, 1});
  const Tensor keys = ops::constant(g, "causal.keys", std::move(positions), {1, s});
  const Tensor future = ops::greater(keys, queries);
  const Tensor minusInfinity = ops::scalar(g, -std::numeric_limits<double>::infinity(), dtype);
  const Tensor scale = ops::scalar(g, 1.0 / std::sqrt(static_cast<double>(dh)), dtype);
  const double residualStddev = kInitStddev / std::sqrt(2.0 * static_cast<double>(model.layers));

  for (int64_t layer = 0; layer < model.layers; ++layer) {
    const std::string h = fmt::format("h.{}.", layer);
    const Tensor qkv =
        linear(parameters, h + "attn.c_attn", layerNorm(parameters, h + "ln_1", x, d), d, 3 * d, kInitStddev);
    const auto head = [&](int64_t part, std::vector<int64_t> perm) {
      const Tensor slice = ops::slice(qkv, {0, 0, part * d}, {b, s, (part + 1) * d});
      return ops::transpose(ops::reshape(slice, {b, s, heads, dh}), std::move(perm));
    };
    const Tensor q = head(0, {0, 2, 1, 3});   // [b, heads, s, dh]
    const Tensor kT = head(1, {0, 2, 3, 1});  // [b, heads, dh, s]
    const Tensor v = head(2, {0, 2, 1, 3});
    const Tensor scores = ops::mul(ops::batchMatmul(q, kT), scale);
    const Tensor attention = ops::softmax(ops::where(future, minusInfinity, scores));
    const Tensor merged =
        ops::reshape(ops::transpose(ops::batchMatmul(attention, v), {0, 2, 1, 3}), {b, s, d});
    x = ops::add(x, linear(parameters, h + "attn.c_proj", merged, d, d, residualStddev));
    const Tensor hidden = gelu(
        linear(parameters, h + "mlp.c_fc", layerNorm(parameters, h + "ln_2", x, d), d, 4 * d, kInitStddev));
    x = ops::add(x, linear(parameters, h + "mlp.c_proj", hidden, 4 * d, d, residualStddev));
  }
  x = layerNorm(parameters, "ln_f", x, d);
  const Tensor head = model.tiedHead ? ops::transpose(wte, {1, 0})
                                     : parameters.normal("lm_head.weight", {d, model.vocab}, kInitStddev);
  // Mixed precision: the loss of float32 logits.
  Tensor logits = ops::matmul(x, head);
  if (dtype != DType::Float32) logits = ops::cast(logits, DType::Float32);
  out.logits = logits.id();
  out.loss = ops::softmaxCrossEntropy(ops::reshape(logits, {b * s, model.vocab}),
                                      ops::reshape(targets, {b * s}), ReductionType::Mean)
                 .id();
  return out;
}

}  // namespace tessera
