#!/usr/bin/env python3
"""Writes the element-indexing fixture of tests/onnx/elements_test.cpp: a small classifier exported by
PyTorch (opset 16) with its cross-entropy loss inside the graph and a symbolic batch axis, whose hidden
values go through torch.gather (ONNX GatherElements), Tensor.scatter_add (ScatterElements, reduction
add, repeated indices), Tensor.scatter (ScatterElements, reduction none) and torch.clamp with bounds
computed from a weight (Clip with computed min and max):
  elements_classifier.onnx
a tensors dataset (elements_train.safetensors) and PyTorch's per-step losses under SGD in float32 and,
from a float64 copy of the module, in float64 (elements_training_reference.json). And a classifier whose
clamps' bounds are its own parameters, on the same dataset:
  clamp_classifier.onnx  torch.clamp(h, min=lo, max=hi) with scalar parameters lo, hi (ONNX Clip with
                         computed bounds) and torch.clamp(h, min=floor) with a per-feature parameter
                         floor (ONNX Max)
  clamp_training_reference.json  its per-step losses in float32 and float64, the bounds after the last
                         step (float32) and the dataset's batches the steps read

Run from the checkout with Debian's python3-torch and python3-onnx:
    /usr/bin/python3 tests/data/onnx/generate_elements.py
The files are committed; the tests only read them.
"""
import copy
import json
import os

import onnx
import torch
import torch.nn.functional as F

from generate import module_from_onnx, tessera_update, write_safetensors

HERE = os.path.dirname(os.path.abspath(__file__))
FEATURES, HIDDEN, CLASSES = 5, 8, 3
TRAIN_SAMPLES = 32  # 4 steps of 8 a pass
TRAIN_STEPS = 8
GLOBAL_BATCH = 8
OPTIMIZER = {"type": "SGD", "learningRate": 0.5}


class Classifier(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)
        # Repeated indices for the gather and the scatter-add; distinct ones for the plain scatter.
        self.register_buffer("pick", torch.tensor([[3, 0, 7, 7, 1, 5, 2, 2]]))
        self.register_buffer("place", torch.tensor([[1, 4, 6]]))

    def forward(self, x, labels):
        h = self.fc1(x)
        batch = x.shape[0]
        pick = self.pick.expand(batch, -1)
        g = torch.gather(h, 1, pick)
        s = h.scatter_add(1, pick, torch.tanh(g))
        w = s.scatter(1, self.place.expand(batch, -1), h[:, :3] * 0.5)
        centre = self.fc1.bias.mean()  # computed from a weight, the same on every replica
        c = torch.clamp(w, min=centre - 0.3, max=centre + 0.4)
        logits = self.fc2(c)
        return F.cross_entropy(logits, labels), logits


class Clamped(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(FEATURES, HIDDEN)
        self.fc2 = torch.nn.Linear(HIDDEN, CLASSES)
        self.lo = torch.nn.Parameter(torch.tensor(-0.2))
        self.hi = torch.nn.Parameter(torch.tensor(0.3))
        self.floor = torch.nn.Parameter(torch.linspace(-0.6, 0.1, HIDDEN))

    def forward(self, x, labels):
        h = self.fc1(x)
        c = torch.clamp(h, min=self.lo, max=self.hi) + torch.clamp(h, min=self.floor)
        logits = self.fc2(c)
        return F.cross_entropy(logits, labels), logits


def export(seed, make=Classifier, name="elements_classifier"):
    torch.manual_seed(seed)
    model = make()
    path = os.path.join(HERE, name + ".onnx")
    torch.onnx.export(model, (torch.randn(2, FEATURES), torch.tensor([0, 2])), path,
                      input_names=["x", "labels"], output_names=["loss", "logits"], opset_version=16,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(path))
    return path


def losses_of(model, train, dtype):
    """PyTorch's SGD of `model` (in `dtype`) over TRAIN_STEPS batches of GLOBAL_BATCH in file order."""
    model = model.to(dtype)
    parameters = list(model.named_parameters())
    state, losses = {}, []
    for step in range(TRAIN_STEPS):
        first = step * GLOBAL_BATCH % TRAIN_SAMPLES
        batch = slice(first, first + GLOBAL_BATCH)
        loss, _ = model(train["x"][batch].to(dtype), train["labels"][batch])
        loss.backward()
        losses.append(float(loss))
        tessera_update(OPTIMIZER, parameters, state, step)
    return losses


def main():
    generator = torch.Generator().manual_seed(2027)
    x = torch.randn(TRAIN_SAMPLES, FEATURES, generator=generator)
    teacher = torch.randn(FEATURES, CLASSES, generator=generator)
    labels = (x @ teacher).argmax(dim=1).to(torch.int64)
    train = {"x": x, "labels": labels}
    write_safetensors(os.path.join(HERE, "elements_train.safetensors"), train)
    path = export(41)
    model = module_from_onnx(Classifier(), path)
    reference = {"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": TRAIN_SAMPLES,
                 "optimizer": OPTIMIZER,
                 "losses": losses_of(copy.deepcopy(model), train, torch.float32),
                 "lossesFloat64": losses_of(copy.deepcopy(model), train, torch.float64)}
    with open(os.path.join(HERE, "elements_training_reference.json"), "w") as out:
        json.dump(reference, out, indent=1)
        out.write("\n")

    path = export(43, Clamped, "clamp_classifier")
    model = module_from_onnx(Clamped(), path)
    trained = copy.deepcopy(model)
    reference = {"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": TRAIN_SAMPLES,
                 "optimizer": OPTIMIZER,
                 "losses": losses_of(trained, train, torch.float32),
                 "lossesFloat64": losses_of(copy.deepcopy(model), train, torch.float64),
                 "initialBounds": {"lo": [float(model.lo)], "hi": [float(model.hi)],
                                   "floor": model.floor.tolist()},
                 "trainedBounds": {"lo": [float(trained.lo)], "hi": [float(trained.hi)],
                                   "floor": trained.floor.tolist()},
                 "x": x.flatten().tolist(), "labels": labels.tolist()}
    with open(os.path.join(HERE, "clamp_training_reference.json"), "w") as out:
        json.dump(reference, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
