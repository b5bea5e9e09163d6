#!/usr/bin/env python3
"""MNIST with replication and replicated tensor sharding, PopART-style: the
Python twin of samples/mnist_rts, written the way a PopART user writes it.

    mnist_rts.py [--replication-factor R] [--batch-size B] [--rts] [--epochs E]
                 [--test-batch-size T] [--dataset FashionMnist|Mnist|Synthetic]
                 [--data-path DIR] [--limit-train N] [--limit-test N]
                 [--lr LR] [--seed S]

The model is built with tessera.Builder (PopART's Builder):

    x [B, 28, 28] -> Reshape [B, 784] -> MatMul W0 [784, 32] -> Add b0 -> GELU
      -> MatMul W1 [32, 10] -> Add b1 -> Softmax -> nllloss(labels), Mean

Every step trains on a global batch of B x R samples, split over the R
replicas (inputs [R, B, ...]); the replicas' gradients are averaged
(ReductionType.Mean), so the same global batch trains the same model whatever
R is: `--replication-factor 2 --batch-size 4` matches `--replication-factor 1
--batch-size 8` up to the order of the sums. With --rts (and R > 1) the
weights and the optimizer state are replica-sharded, as PopART does it: each
replica holds 1/R of every weight (SessionOptions
weightTensorLocationSettings and optimizerStateTensorLocationSettings,
replicatedTensorSharding On); the numbers do not change.

Fashion-MNIST is read from Debian's dataset-fashion-mnist package (or
--data-path); when it is not installed, a synthetic stand-in of the same shape
is used and a note says so. Prints the mean loss of every epoch, then the test
accuracy.
"""
import argparse
import sys

import numpy as np
import tessera

PIXELS = 28 * 28
HIDDEN = 32
CLASSES = 10


def parse_args(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replication-factor", type=int, default=1)
    parser.add_argument("--batch-size", type=int, default=8, help="samples per replica per step")
    parser.add_argument("--test-batch-size", type=int, default=80, help="test samples per replica per step")
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--rts", action="store_true", help="replica-shard the weights and optimizer state")
    parser.add_argument("--lr", type=float, default=0.05)
    parser.add_argument("--dataset", default="FashionMnist", choices=["FashionMnist", "Mnist", "Synthetic"])
    parser.add_argument("--data-path", default="")
    parser.add_argument("--limit-train", type=int, default=0, help="use the first N training samples (0: all)")
    parser.add_argument("--limit-test", type=int, default=0, help="use the first N test samples (0: all)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    for name in ("replication_factor", "batch_size", "test_batch_size", "epochs"):
        if getattr(args, name) < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1")
    return args


def initial_weights(seed):
    """He-normal weights and zero biases."""
    rng = np.random.default_rng(seed)
    return {
        "W0": (rng.standard_normal((PIXELS, HIDDEN)) * np.sqrt(2.0 / PIXELS)).astype(np.float32),
        "b0": np.zeros(HIDDEN, np.float32),
        "W1": (rng.standard_normal((HIDDEN, CLASSES)) * np.sqrt(2.0 / HIDDEN)).astype(np.float32),
        "b1": np.zeros(CLASSES, np.float32),
    }


def build_model(weights, batch, training):
    """The model as ONNX bytes, with its input, label, output and loss names."""
    builder = tessera.Builder()
    x = builder.addInputTensor(tessera.TensorInfo("FLOAT", [batch, 28, 28]), "x")
    w0 = builder.addInitializedInputTensor(weights["W0"], "W0")
    b0 = builder.addInitializedInputTensor(weights["b0"], "b0")
    w1 = builder.addInitializedInputTensor(weights["W1"], "W1")
    b1 = builder.addInitializedInputTensor(weights["b1"], "b1")
    flat = builder.aiOnnx.flatten([x], axis=1)
    hidden = builder.aiGraphcore.gelu([builder.aiOnnx.add([builder.aiOnnx.matmul([flat, w0]), b0])])
    logits = builder.aiOnnx.add([builder.aiOnnx.matmul([hidden, w1]), b1])
    probs = builder.aiOnnx.softmax([logits], axis=1, debugContext="probs")
    names = {"x": x, "probs": probs}
    if training:
        labels = builder.addInputTensor(tessera.TensorInfo("INT32", [batch]), "labels")
        loss = builder.aiGraphcore.nllloss([probs, labels], reduction=tessera.ReductionType.Mean)
        builder.addOutputTensor(loss)
        names.update(labels=labels, loss=loss)
    else:
        builder.addOutputTensor(probs)
    return builder.getModelProto(), names


def session_options(replicas, rts):
    opts = tessera.SessionOptions()
    opts.enableReplicatedGraphs = replicas > 1
    opts.replicatedGraphCount = replicas
    opts.accumulationAndReplicationReductionType = tessera.ReductionType.Mean
    if rts and replicas > 1:
        for settings in (opts.weightTensorLocationSettings, opts.optimizerStateTensorLocationSettings):
            settings.location.replicatedTensorSharding = tessera.ReplicatedTensorSharding.On
            settings.minElementsForReplicatedTensorSharding = 0
    return opts


def per_replica(array, replicas):
    """[R x B, ...] as PopART's input shape: [R, B, ...], or [B, ...] for one replica."""
    if replicas == 1:
        return np.ascontiguousarray(array)
    return np.ascontiguousarray(array.reshape((replicas, -1) + array.shape[1:]))


def train(args, out=sys.stdout):
    """Trains and tests; returns the per-step losses (mean over the replicas) and the test accuracy."""
    replicas, batch = args.replication_factor, args.batch_size
    data = tessera.loadDataset(args.dataset, args.data_path, args.limit_train, args.limit_test, args.seed)
    if data["notice"]:
        print(f"note: {data['notice']}", file=out)
    train_images, train_labels = data["train"]
    test_images, test_labels = data["test"]
    if args.rts and replicas == 1:
        print("note: --rts with one replica shards nothing; the weights stay whole", file=out)

    weights = initial_weights(args.seed)
    proto, names = build_model(weights, batch, training=True)
    session = tessera.TrainingSession(
        fnModel=proto, loss=names["loss"],
        optimizer=tessera.SGD({"defaultLearningRate": (args.lr, True)}),
        dataFlow=tessera.DataFlow(1, {names["loss"]: tessera.AnchorReturnType("All")}),
        userOptions=session_options(replicas, args.rts),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": replicas}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()

    global_batch = batch * replicas
    steps = len(train_labels) // global_batch
    if steps == 0:
        raise SystemExit(f"error: {len(train_labels)} training samples make no global batch of {global_batch} "
                         f"(--batch-size x --replication-factor)")
    rng = np.random.default_rng(args.seed)
    losses = []
    for epoch in range(args.epochs):
        order = rng.permutation(len(train_labels))
        epoch_losses = []
        for step in range(steps):
            window = order[step * global_batch:(step + 1) * global_batch]
            inputs = {names["x"]: per_replica(train_images[window], replicas),
                      names["labels"]: per_replica(train_labels[window], replicas)}
            session.run(tessera.PyStepIO(inputs, anchors))
            epoch_losses.append(float(np.mean(anchors[names["loss"]])))
        losses.extend(epoch_losses)
        print(f"epoch {epoch + 1}: mean loss {np.mean(epoch_losses):.6f} over {steps} steps", file=out)

    session.weightsToHost()
    trained = {name: np.zeros_like(value) for name, value in weights.items()}
    session.readWeights(tessera.PyWeightsIO(trained))
    accuracy, samples = test(args, trained, test_images, test_labels)
    sharding = "rts on" if args.rts and replicas > 1 else "rts off"
    print(f"test accuracy: {accuracy:.4f} ({samples} samples, {replicas} replica{'s' if replicas > 1 else ''}, {sharding})", file=out)
    return losses, accuracy


def test(args, weights, images, labels):
    """Accuracy of the weights on the test split; the last batch is padded, and only real samples count."""
    replicas, batch = args.replication_factor, args.test_batch_size
    if len(labels) == 0:
        raise SystemExit("error: the test split is empty (--limit-test?)")
    proto, names = build_model(weights, batch, training=False)
    session = tessera.InferenceSession(
        fnModel=proto,
        dataFlow=tessera.DataFlow(1, {names["probs"]: tessera.AnchorReturnType("All")}),
        userOptions=session_options(replicas, False),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": replicas}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    global_batch = batch * replicas
    correct = 0
    for first in range(0, len(labels), global_batch):
        chunk = images[first:first + global_batch]
        real = len(chunk)
        if real < global_batch:
            chunk = np.concatenate([chunk, np.zeros((global_batch - real,) + chunk.shape[1:], np.float32)])
        session.run(tessera.PyStepIO({names["x"]: per_replica(chunk, replicas)}, anchors))
        predictions = anchors[names["probs"]].reshape(global_batch, CLASSES).argmax(axis=1)[:real]
        correct += int(np.sum(predictions == labels[first:first + real]))
    return correct / len(labels), len(labels)


def main(argv=None):
    try:
        train(parse_args(argv))
    except tessera.Error as error:
        print(error, file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
