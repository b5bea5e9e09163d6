#!/usr/bin/env python3
"""The per-step cost of the Python module against the C++ API, on one model.

    PYTHONPATH=BUILD/python /usr/bin/python3 bench/python_step.py \\
        --cpp BUILD/bench/tessera_bench_onnx_train [--batch 64] [--steps 200] \\
        [--threads 1] [--rounds 5]

The model is the 784-256-128-10 MLP (ReLU, softmax, nllloss) built with
tessera.Builder and written to a temporary file. The C++ side is
tessera_bench_onnx_train on that file (tessera::TrainingSession::run on fixed
inputs); the Python side is tessera.TrainingSession.run(PyStepIO(...)) with
the same model, optimizer (SGD, learning rate 0.01), threads and inputs of the
same shapes, its loss anchor filled every step, as a PopART script runs. Both
warm up with 10 steps, then time --steps steps; the rounds alternate the two
sides, and the medians and their ratio (Python / C++) are printed. Measure on
a quiet machine.
"""
import argparse
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time

import numpy as np
import tessera

SIZES = (784, 256, 128, 10)


def build_mlp(batch):
    rng = np.random.default_rng(0)
    builder = tessera.Builder()
    x = builder.addInputTensor(tessera.TensorInfo("FLOAT", [batch, SIZES[0]]), "x")
    labels = builder.addInputTensor(tessera.TensorInfo("INT32", [batch]), "labels")
    h = x
    for layer, (fan_in, fan_out) in enumerate(zip(SIZES, SIZES[1:])):
        w = builder.addInitializedInputTensor(
            (rng.standard_normal((fan_in, fan_out)) * np.sqrt(2.0 / fan_in)).astype(np.float32), f"W{layer}")
        b = builder.addInitializedInputTensor(np.zeros(fan_out, np.float32), f"b{layer}")
        h = builder.aiOnnx.add([builder.aiOnnx.matmul([h, w]), b])
        if layer + 2 < len(SIZES):
            h = builder.aiOnnx.relu([h])
    probs = builder.aiOnnx.softmax([h], axis=1)
    loss = builder.aiGraphcore.nllloss([probs, labels], tessera.ReductionType.Mean, debugContext="loss")
    builder.addOutputTensor(loss)
    return builder.getModelProto(), loss


def python_step_us(model, loss, batch, steps, threads):
    session = tessera.TrainingSession(
        fnModel=model, loss=loss, optimizer=tessera.SGD({"defaultLearningRate": (0.01, True)}),
        dataFlow=tessera.DataFlow(1, {loss: tessera.AnchorReturnType("All")}),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1, "numThreads": threads}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    rng = np.random.default_rng(1)
    inputs = {"x": rng.random((batch, SIZES[0]), dtype=np.float32),
              "labels": rng.integers(0, SIZES[-1], size=batch).astype(np.int32)}
    stepio = tessera.PyStepIO(inputs, anchors)
    for _ in range(10):
        session.run(stepio)
    start = time.perf_counter()
    for _ in range(steps):
        session.run(stepio)
    return 1e6 * (time.perf_counter() - start) / steps


def cpp_step_us(binary, path, loss, batch, steps, threads):
    result = subprocess.run([binary, str(path), str(batch), str(steps), str(threads), "--loss", loss],
                            capture_output=True, text=True, check=True)
    return float(re.search(r"step_us=([0-9.]+)", result.stdout).group(1))


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpp", required=True, help="the tessera_bench_onnx_train executable")
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    model, loss = build_mlp(args.batch)
    with tempfile.TemporaryDirectory() as folder:
        path = pathlib.Path(folder) / "mlp.onnx"
        path.write_bytes(model)
        python, cpp = [], []
        for _ in range(args.rounds):
            cpp.append(cpp_step_us(args.cpp, path, loss, args.batch, args.steps, args.threads))
            python.append(python_step_us(model, loss, args.batch, args.steps, args.threads))
    py_median, cpp_median = statistics.median(python), statistics.median(cpp)
    print(f"mlp {'-'.join(map(str, SIZES))} batch={args.batch} threads={args.threads} steps={args.steps} "
          f"rounds={args.rounds}")
    print(f"  C++     step_us median {cpp_median:.1f}  ({', '.join(f'{v:.1f}' for v in cpp)})")
    print(f"  Python  step_us median {py_median:.1f}  ({', '.join(f'{v:.1f}' for v in python)})")
    print(f"  Python / C++ = {py_median / cpp_median:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
