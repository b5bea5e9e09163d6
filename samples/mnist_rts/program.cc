#include "program.hpp"

#include <cmath>
#include <optional>
#include <string>
#include <utility>

#include "tessera/lib/autodiff.hpp"
#include "tessera/app/mlp.hpp"

namespace mnist_rts {
namespace {

// A trainable weight: the variable the host reads, the shard the program
// updates (when sharded), the full tensor the model uses, and the remote
// buffer it lives in (when it has one).
struct Trainable {
  Tensor var;
  std::optional<Tensor> shards;
  Tensor full;
  std::optional<RemoteBuffer> remoteBuffer;
};

Tensor forward(Tensor x, const Trainable& w0, const Trainable& b0, const Trainable& w1, const Trainable& b1) {
  const int64_t batch = x.shape().front();
  Tensor h = ops::reshape(x, {batch, kPixels});
  h = ops::gelu(ops::add(ops::matmul(h, w0.full), b0.full));
  return ops::add(ops::matmul(h, w1.full), b1.full);
}

Trainable plain(Graph& g, const std::string& name, std::vector<float> data, Shape shape) {
  Tensor v = ops::variable(g, name, std::move(data), std::move(shape));
  return {v, std::nullopt, v, std::nullopt};
}

}  // namespace

InitialWeights initialWeights(int64_t seed) {
  return {normalSamples(kPixels * kHidden, static_cast<uint64_t>(seed) * 2 + 1, std::sqrt(2.0 / kPixels)),
          std::vector<float>(kHidden, 0.0f),
          normalSamples(kHidden * kClasses, static_cast<uint64_t>(seed) * 2 + 2, std::sqrt(2.0 / kHidden)),
          std::vector<float>(kClasses, 0.0f)};
}

TrainProgram buildTrainProgram(const Options& opts, const InitialWeights& init) {
  TrainProgram program{Graph(opts.replicationFactor), {}};
  Graph& g = program.graph;
  const bool rts = opts.rts && opts.replicationFactor > 1;
  InSequence sequence(g);

  Tensor x = ops::input(g, "x", {opts.batchSize, 28, 28});
  Tensor labels = ops::input(g, "labels", {opts.batchSize}, DType::Int32);

  Trainable w0;
  if (rts) {
    const ShardedVariable sharded = ops::replicaShardedVariable(g, "W0", init.w0, {kPixels, kHidden});
    w0 = {sharded.variable, sharded.shard, ops::replicatedAllGather(sharded.shard), std::nullopt};
  } else {
    w0 = plain(g, "W0", init.w0, {kPixels, kHidden});
  }
  Trainable b0 = plain(g, "b0", init.b0, {kHidden});

  Trainable w1;
  if (rts) {
    const int64_t shardElements = (kHidden * kClasses + opts.replicationFactor - 1) / opts.replicationFactor;
    const RemoteBuffer buffer = ops::remoteBuffer(g, {shardElements}, DType::Float32, 1);
    Tensor remote = ops::remoteReplicaShardedVariable(g, "W1", init.w1, {kHidden, kClasses}, buffer, 0);
    Tensor shards = ops::remoteLoad(g, buffer, 0);
    w1 = {remote, shards, ops::replicatedAllGather(shards), buffer};
  } else {
    w1 = plain(g, "W1", init.w1, {kHidden, kClasses});
  }
  Trainable b1 = plain(g, "b1", init.b1, {kClasses});

  Tensor logits = forward(x, w0, b0, w1, b1);
  program.loss = ops::softmaxCrossEntropy(logits, labels, ReductionType::Mean);

  // Gradients of the full tensors, averaged over the replicas so that every
  // replication factor trains on the same global batch.
  const std::vector<Trainable*> params{&w0, &b0, &w1, &b1};
  std::vector<Tensor> wrt;
  for (const Trainable* p : params) wrt.push_back(p->full);
  std::vector<Tensor> grads = autodiff(g, program.loss, wrt);
  for (size_t i = 0; i < params.size(); ++i) {
    if (opts.replicationFactor > 1) grads[i] = ops::replicatedAllReduce(grads[i], ReductionType::Mean);
    if (params[i]->shards) grads[i] = ops::replicaShardedSlice(grads[i]);
  }

  // W += -lr * grad, on the shard when sharded; a remote shard goes back to
  // its buffer after the update.
  for (size_t i = 0; i < params.size(); ++i) {
    Trainable& p = *params[i];
    if (p.shards) {
      ops::scaledAddInplace(*p.shards, grads[i], 1.0, -opts.lr);
      if (p.remoteBuffer) ops::remoteStore(g, *p.remoteBuffer, 0, *p.shards);
    } else {
      ops::scaledAddInplace(p.var, grads[i], 1.0, -opts.lr);
    }
  }
  return program;
}


TestProgram buildTestProgram(const Options& opts, const InitialWeights& init) {
  TestProgram program{Graph(opts.replicationFactor), {}};
  Graph& g = program.graph;
  Tensor x = ops::input(g, "x", {opts.testBatchSize, 28, 28});
  const Trainable w0 = plain(g, "W0", init.w0, {kPixels, kHidden});
  const Trainable b0 = plain(g, "b0", init.b0, {kHidden});
  const Trainable w1 = plain(g, "W1", init.w1, {kHidden, kClasses});
  const Trainable b1 = plain(g, "b1", init.b1, {kClasses});
  program.predictions = ops::argmax(forward(x, w0, b0, w1, b1));
  return program;
}

SessionOptions sessionOptions(const Options& opts) {
  SessionOptions options;
  options.enableReplicatedGraphs = opts.replicationFactor > 1;
  options.replicatedGraphCount = opts.replicationFactor;
  return options;
}

}  // namespace mnist_rts
