#!/usr/bin/env python3
"""Training an ONNX model exported from PyTorch, PopART-style, through the
tessera Python module: the Python twin of samples/onnx_training.

    onnx_training.py FOLDER [--replicas R] [--epochs E]

FOLDER holds mlp.onnx (inputs x [batch, 2, 3] and int64 labels [batch], its
loss inside the graph), train.safetensors and test.safetensors
(samples/configs/mlp_onnx). The run trains with a global batch of 8 over R
replicas (Mean reduction), then again on one replica, and checks that both
computed the same per-step losses and that the loss went down; it exits
non-zero when a check fails.
"""
import argparse
import json
import pathlib
import struct
import sys

import numpy as np
import tessera

GLOBAL_BATCH = 8
DTYPES = {"F32": np.float32, "I64": np.int64, "I32": np.int32}


def read_safetensors(path):
    """The tensors of a .safetensors file by name."""
    data = pathlib.Path(path).read_bytes()
    (length,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + length])
    tensors = {}
    for name, info in header.items():
        if name == "__metadata__":
            continue
        begin, end = info["data_offsets"]
        raw = data[8 + length + begin:8 + length + end]
        tensors[name] = np.frombuffer(raw, dtype=np.dtype(DTYPES[info["dtype"]]).newbyteorder("<")).reshape(
            info["shape"])
    return tensors


def batches(tensors, replicas):
    """Each step's inputs, [replicas, batch, ...] (the replica axis only when replicas > 1)."""
    count = len(tensors["labels"]) // GLOBAL_BATCH
    for step in range(count):
        window = slice(step * GLOBAL_BATCH, (step + 1) * GLOBAL_BATCH)
        feed = {}
        for name, values in tensors.items():
            part = np.ascontiguousarray(values[window])
            if replicas > 1:
                part = part.reshape((replicas, GLOBAL_BATCH // replicas) + part.shape[1:])
            feed[name] = part
        yield feed


def train(folder, replicas, epochs):
    """Per-step mean losses and the test loss of one run."""
    batch = GLOBAL_BATCH // replicas
    opts = tessera.SessionOptions()
    opts.enableReplicatedGraphs = replicas > 1
    opts.replicatedGraphCount = replicas
    opts.accumulationAndReplicationReductionType = tessera.ReductionType.Mean

    shapes = tessera.InputShapeInfo()
    shapes.add("x", tessera.TensorInfo("FLOAT", [batch, 2, 3]))
    shapes.add("labels", tessera.TensorInfo("INT64", [batch]))
    model = str(pathlib.Path(folder) / "mlp.onnx")
    device = tessera.DeviceManager().createSimDevice({"numIPUs": replicas})
    session = tessera.TrainingSession(
        fnModel=model, loss="loss",
        optimizer=tessera.SGD({"defaultLearningRate": (0.05, True), "defaultMomentum": (0.9, True)}),
        dataFlow=tessera.DataFlow(1, {"loss": tessera.AnchorReturnType("All")}),
        userOptions=opts, deviceInfo=device, inputShapeInfo=shapes)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()

    train_set = read_safetensors(pathlib.Path(folder) / "train.safetensors")
    losses = []
    for _ in range(epochs):
        for feed in batches(train_set, replicas):
            session.run(tessera.PyStepIO(feed, anchors))
            losses.append(float(np.mean(anchors["loss"])))

    # The test loss with the trained weights, from an inference session.
    session.weightsToHost()
    weights = {name: np.zeros(shape, np.float32) for name, shape in
               [("fc1.weight", (8, 6)), ("fc1.bias", (8,)), ("fc2.weight", (4, 8)), ("fc2.bias", (4,))]}
    session.readWeights(tessera.PyWeightsIO(weights))
    inference = tessera.InferenceSession(
        fnModel=model, dataFlow=tessera.DataFlow(1, {"loss": tessera.AnchorReturnType("All")}),
        userOptions=opts, deviceInfo=device, inputShapeInfo=shapes)
    inference.prepareDevice()
    inference.writeWeights(tessera.PyWeightsIO(weights))
    inference.weightsFromHost()
    outputs = inference.initAnchorArrays()
    test_losses = []
    for feed in batches(read_safetensors(pathlib.Path(folder) / "test.safetensors"), replicas):
        inference.run(tessera.PyStepIO(feed, outputs))
        test_losses.append(float(np.mean(outputs["loss"])))
    return losses, float(np.mean(test_losses))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder")
    parser.add_argument("--replicas", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=3)
    args = parser.parse_args()
    if args.replicas < 1 or GLOBAL_BATCH % args.replicas or args.epochs < 1:
        parser.error(f"--replicas must divide {GLOBAL_BATCH} and --epochs be >= 1")
    try:
        losses, test_loss = train(args.folder, args.replicas, args.epochs)
        single, single_test = train(args.folder, 1, args.epochs)
    except tessera.Error as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    per_epoch = len(losses) // args.epochs
    first, last = np.mean(losses[:per_epoch]), np.mean(losses[-per_epoch:])
    worst = max(abs(a - b) / abs(b) for a, b in zip(losses, single))
    print(f"{len(losses)} steps over {args.replicas} replicas (global batch {GLOBAL_BATCH})")
    print(f"mean loss: first epoch {first:.4f}, last epoch {last:.4f}")
    print(f"test loss: {test_loss:.4f}")
    print(f"largest relative difference from one replica: {worst:.2e}")
    failures = 0
    if not last < first:
        print("FAIL the loss did not go down")
        failures += 1
    if not worst <= 1e-5:
        print(f"FAIL {args.replicas} replicas and one replica computed different losses")
        failures += 1
    if not abs(test_loss - single_test) <= 1e-5 * abs(single_test):
        print(f"FAIL the test losses differ: {test_loss} and {single_test}")
        failures += 1
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
