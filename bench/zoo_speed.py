#!/usr/bin/env python3
"""Training-step speed of the zoo's models: tessera against PyTorch on the same threads.

    /usr/bin/python3 bench/zoo_speed.py --cpp BUILD/bench/tessera_bench_onnx_train \\
        [--models resnet18,mobilenet_v2,efficientnet_b0] [--batch 8] [--threads 2] [--rounds 5] [--seconds 3]

Needs Debian's python3-torch and python3-torchvision (run with /usr/bin/python3)
and a build with tessera_bench_onnx_train (bench/meson.build; a release build,
meson --buildtype=release, is what bench/RESULTS.md records). bench/zoo_speed.sh
makes that build and runs this script.

Each model (bench/zoo_models.py: torchvision 0.14 and PyTorch
layers, 10 classes, dropout 0, the input shape given there) is wrapped
so that forward(x, labels) returns F.cross_entropy and exported with
torch.onnx.export in training mode at opset 14 (dynamic batch), as
bench/zoo_accuracy.py exports them, into a temporary folder. Then, per round
and model, back to back:
  tessera: tessera_bench_onnx_train MODEL.onnx BATCH STEPS THREADS (plain SGD,
           one fixed batch, 10 warm-up steps, then STEPS timed steps);
  PyTorch: this script with --peer in a fresh process: the same wrapped module
           in training mode, torch.set_num_threads(THREADS), SGD, one fixed
           batch, zero_grad / forward / backward / step, 10 warm-up steps, then
           STEPS timed steps.
STEPS is chosen once per model so that a run lasts about --seconds on PyTorch.
The table gives the median samples/s of each side over the rounds and the
median of the per-round ratios (tessera / PyTorch). The rounds interleave the
two sides so that a change in the machine's load hits both; the load average
(os.getloadavg) before and after is printed. PyTorch's threads suffer most on a
busy machine: measure on a quiet one.
"""
import argparse
import os
import pathlib
import re
import statistics
import subprocess
import sys
import tempfile
import time
import warnings

warnings.filterwarnings("ignore")

import torch  # noqa: E402


from zoo_models import MODELS, WithLoss  # noqa: E402


def make(name):
    torch.manual_seed(0)
    return WithLoss(MODELS[name][0]())


def batch_of(name, batch):
    generator = torch.Generator().manual_seed(1)
    return (torch.rand((batch,) + MODELS[name][1], generator=generator),
            torch.randint(0, 10, (batch,), generator=generator))


def export(name, batch, path):
    x, labels = batch_of(name, batch)
    torch.onnx.export(make(name), (x, labels), str(path), input_names=["x", "labels"], output_names=["loss"],
                      opset_version=14, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}})


def peer(name, batch, steps, threads, warmup):
    """PyTorch's side, in its own process: prints the same line as tessera_bench_onnx_train."""
    torch.set_num_threads(threads)
    module = make(name)
    module.train()
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    x, labels = batch_of(name, batch)

    def step():
        optimizer.zero_grad()
        loss = module(x, labels)
        loss.backward()
        optimizer.step()
        return loss

    for _ in range(warmup):
        step()
    start = time.perf_counter()
    for _ in range(steps):
        loss = step()
    seconds = time.perf_counter() - start
    print(f"pytorch model={name} batch={batch} threads={threads} steps={steps} loss={loss.item():.4f} "
          f"step_us={1e6 * seconds / steps:.1f} samples_per_s={batch * steps / seconds:.0f}")


def rate(line):
    return float(re.search(r"samples_per_s=([0-9.]+)", line).group(1))


def run_peer(name, batch, steps, threads):
    result = subprocess.run([sys.executable, __file__, "--peer", name, "--batch", str(batch), "--steps",
                             str(steps), "--threads", str(threads)], capture_output=True, text=True, check=True)
    return rate(result.stdout)


def run_tessera(binary, path, batch, steps, threads):
    result = subprocess.run([binary, str(path), str(batch), str(steps), str(threads)], capture_output=True,
                            text=True, check=True)
    return rate(result.stdout)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cpp", help="the tessera_bench_onnx_train executable")
    parser.add_argument("--models", default="resnet18,mobilenet_v2,efficientnet_b0",
                        help="comma-separated, of: " + ", ".join(MODELS))
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--seconds", type=float, default=3.0, help="about how long one PyTorch run lasts")
    parser.add_argument("--steps", type=int, default=0, help="timed steps per run (default: from --seconds)")
    parser.add_argument("--warmup", type=int, default=10, help=argparse.SUPPRESS)
    parser.add_argument("--peer", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.peer:
        peer(args.peer, args.batch, args.steps, args.threads, args.warmup)
        return 0
    if not args.cpp:
        parser.error("--cpp is required")
    names = args.models.split(",")
    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory() as folder:
        paths = {}
        steps = {}
        for name in names:
            paths[name] = pathlib.Path(folder) / f"{name}.onnx"
            export(name, args.batch, paths[name])
            if args.steps:
                steps[name] = args.steps
            else:
                probe = run_peer(name, args.batch, 5, args.threads)
                steps[name] = max(5, int(args.seconds * probe / args.batch))
        ours = {name: [] for name in names}
        theirs = {name: [] for name in names}
        for _ in range(args.rounds):
            for name in names:
                ours[name].append(run_tessera(args.cpp, paths[name], args.batch, steps[name], args.threads))
                theirs[name].append(run_peer(name, args.batch, steps[name], args.threads))
    load_after = os.getloadavg()
    print(f"batch={args.batch} threads={args.threads} rounds={args.rounds} "
          f"load average before {load_before[0]:.2f} {load_before[1]:.2f}, after {load_after[0]:.2f} "
          f"{load_after[1]:.2f}")
    print("| model | steps per run | tessera samples/s | PyTorch samples/s | tessera / PyTorch |")
    print("|---|---:|---:|---:|---:|")
    for name in names:
        ratios = [a / b for a, b in zip(ours[name], theirs[name])]
        print(f"| {name} | {steps[name]} | {statistics.median(ours[name]):.1f} | "
              f"{statistics.median(theirs[name]):.1f} | {statistics.median(ratios):.2f} |")
        print(f"<!-- {name}: tessera {', '.join(f'{v:.1f}' for v in ours[name])}; "
              f"PyTorch {', '.join(f'{v:.1f}' for v in theirs[name])} -->")
    return 0


if __name__ == "__main__":
    sys.exit(main())
