// The decoder-only transformer of a run config's "model" section (type
// "transformer"), built as a plain training graph from the same ops as any
// other model: no replication, sharding or offloading in it — the session's
// transforms add those from SessionOptions.
//
// The layout is GPT-2's, with its parameter names and its weight layout
// ([in, out], x W + b):
//   x = wte[tokens] + wpe                            tokens [batch, sequence] int32
//   for i in 0 .. layers-1, with h = "h.{i}.":
//     a = LayerNorm_{h ln_1}(x)
//     q, k, v = split(a c_attn.weight + c_attn.bias)   each [batch, heads, sequence, hidden/heads]
//     s = q k^T / sqrt(hidden/heads), -inf above the diagonal (causal), softmax over the keys
//     x = x + (s v, heads merged) attn.c_proj.weight + attn.c_proj.bias
//     x = x + GELU(LayerNorm_{h ln_2}(x) mlp.c_fc.weight + mlp.c_fc.bias) mlp.c_proj.weight + mlp.c_proj.bias
//   logits = LayerNorm_{ln_f}(x) wte^T      (tied head; untied: lm_head.weight [hidden, vocab])
//   loss = mean over batch x sequence of cross-entropy(logits, targets)
// LayerNorm has epsilon 1e-5 and a weight and bias per feature; GELU is the
// exact 0.5 x (1 + erf(x / sqrt 2)) (PyTorch's default). The targets are the
// next tokens: a dataset stores each sample's tokens and targets shifted by
// one.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/app/run_config.hpp"

namespace tessera {

struct TransformerGraph {
  Graph graph;
  // Per replica, per micro-batch: int32 [batch, sequence] each.
  TensorId tokens = kNoTensor;
  TensorId targets = kNoTensor;
  TensorId logits = kNoTensor;  // [batch, sequence, vocab] float32 (cast from float16 in a float16 model)
  TensorId loss = kNoTensor;    // [] mean next-token cross-entropy of the micro-batch
  // Every parameter in creation order: wte.weight, wpe.weight, h.0.ln_1.weight, ...
  std::vector<TensorId> weights;
};

// Builds the graph of `model` for a per-replica micro-batch of `batchSize`
// sequences. Initial values are made only when a session loads them, GPT-2's
// way from `seed`: matrices and embeddings normal with stddev 0.02 (the two
// projections into the residual stream 0.02 / sqrt(2 layers)), biases 0,
// LayerNorm weights 1. Building costs O(layers) host memory and time
// whatever the widths. `dtype` (float32 or float16) is the dtype of the
// weights and activations; a float16 model's logits are cast to float32
// before the loss (mixed-precision training). Throws ConfigError(InvalidModel)
// at the JSON path of a setting it cannot build (heads not dividing hidden, a
// size below 1, an integer dtype).
TransformerGraph buildTransformer(const TransformerConfig& model, int64_t batchSize,
                                  int64_t replicationFactor, int64_t seed, DType dtype = DType::Float32);

// The number of parameters: layers (12 hidden^2 + 13 hidden) + (vocab +
// sequence + 2) hidden, plus hidden x vocab for an untied head; nullopt when
// it does not fit in 63 bits.
std::optional<int64_t> transformerParameterCount(const TransformerConfig& model);

}  // namespace tessera
