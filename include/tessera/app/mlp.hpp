// The multi-layer perceptron of a run config's "model" section, built as a
// plain training graph: no replication, sharding or offloading in it — the
// session's transforms add those from SessionOptions.
#pragma once

#include <cstdint>
#include <vector>

#include "tessera/lib/graph.hpp"
#include "tessera/lib/ops.hpp"
#include "tessera/app/run_config.hpp"
#include "tessera/lib/session_options.hpp"

namespace tessera {

struct MlpGraph {
  Graph graph;
  // Per replica, per micro-batch: images [batch, inputs] of the model's
  // dtype (float32 or float16), labels [batch] int32.
  TensorId input = kNoTensor;
  TensorId labels = kNoTensor;
  TensorId logits = kNoTensor;       // [batch, classes] float32 (cast from float16 in a float16 model)
  TensorId predictions = kNoTensor;  // [batch] int32 (argmax)
  TensorId loss = kNoTensor;         // [] mean softmax cross-entropy of the micro-batch
  // "W0", "b0", "W1", ... in layer order.
  std::vector<TensorId> weights;
};

// Layer i computes act(x Wi + bi) (no activation after the last layer).
// The input, weights and activations have the dtype of `model` (float32 or
// float16); a float16 model's logits are cast to float32 before the loss and
// the argmax, as mixed-precision training does.
// Wi [layers[i], layers[i+1]] is He-normal initialised from `seed` with a
// generator whose results do not depend on the standard library; bi is zero.
// The weights are plain variables: where they live (sharded, off chip) is
// decided by the session's location transforms from its options.
//
// Throws ConfigError(InvalidModel) for a model it cannot build and
// GraphError for shapes that do not fit.
MlpGraph buildMlp(const ModelConfig& model, int64_t batchSize, int64_t replicationFactor, int64_t seed);

// Deterministic standard normal samples (Box-Muller over a 64-bit
// splitmix/xorshift stream): the same numbers on every platform.
std::vector<float> normalSamples(int64_t count, uint64_t seed, double stddev);
// The same values, made on demand (when a session loads the variable), so
// that planning a model never makes them.
InitialValues normalValues(int64_t count, uint64_t seed, double stddev);

}  // namespace tessera
