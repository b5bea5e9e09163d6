#!/usr/bin/env python3
"""Writes the recurrent fixtures of tests/onnx/recurrence_test.cpp: six small sequence classifiers exported
by PyTorch with their cross-entropy loss inside the graph and a symbolic batch axis (x [batch, 6, 5] ->
batch-first recurrence of hidden size 8 -> Linear -> 3 classes):
  gru_classifier.onnx    nn.GRU, the last state h_n (ONNX GRU, linear_before_reset 1)
  bilstm_classifier.onnx nn.LSTM(bidirectional=True), both directions' last states concatenated
  rnn_classifier.onnx    nn.RNN (tanh), the output of the last step
  gru2_classifier.onnx   nn.GRU(num_layers=2), the last layer's h_n
  bilstm2_classifier.onnx nn.LSTM(num_layers=2, bidirectional=True), the last layer's two directions
  birnn2_classifier.onnx nn.RNN(num_layers=2, bidirectional=True), the output of the last step
(torch.onnx.export writes a layered recurrence as one node per layer, chained through
Transpose/Reshape/Squeeze glue)
a tensors dataset (recurrent_train.safetensors) and PyTorch's per-step losses
under SGD in float32 and, from a float64 copy of each module, in float64 (recurrent_training_reference.json).

Run from the checkout with Debian's python3-torch and python3-onnx:
    /usr/bin/python3 tests/data/onnx/generate_recurrent.py
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
STEPS, FEATURES, HIDDEN, CLASSES = 6, 5, 8, 3
TRAIN_SAMPLES = 32  # 4 steps of 8 a pass
TRAIN_STEPS = 8
GLOBAL_BATCH = 8
OPTIMIZER = {"type": "SGD", "learningRate": 0.5}


class Classifier(torch.nn.Module):
    def __init__(self, kind, bidirectional=False, last_output=False, layers=1):
        super().__init__()
        self.rnn = getattr(torch.nn, kind)(FEATURES, HIDDEN, batch_first=True, bidirectional=bidirectional,
                                           num_layers=layers)
        self.directions = 2 if bidirectional else 1
        self.last_output = last_output
        self.fc = torch.nn.Linear(HIDDEN * (2 if bidirectional else 1), CLASSES)

    def forward(self, x, labels):
        out, state = self.rnn(x)
        if self.last_output:
            h = out[:, -1]
        else:
            h = state[0] if isinstance(state, tuple) else state
            if self.rnn.num_layers > 1:
                h = h[-self.directions:]  # the last layer's states
            h = torch.cat([h[0], h[1]], 1) if h.shape[0] == 2 else h[0]
        logits = self.fc(h)
        return F.cross_entropy(logits, labels), logits


MODELS = {
    "gru_classifier": lambda: Classifier("GRU"),
    "bilstm_classifier": lambda: Classifier("LSTM", bidirectional=True),
    "rnn_classifier": lambda: Classifier("RNN", last_output=True),
    "gru2_classifier": lambda: Classifier("GRU", layers=2),
    "bilstm2_classifier": lambda: Classifier("LSTM", bidirectional=True, layers=2),
    "birnn2_classifier": lambda: Classifier("RNN", bidirectional=True, last_output=True, layers=2),
}


def export(name, seed):
    torch.manual_seed(seed)
    model = MODELS[name]()
    path = os.path.join(HERE, name + ".onnx")
    torch.onnx.export(model, (torch.randn(2, STEPS, FEATURES), torch.tensor([0, 2])), path,
                      input_names=["x", "labels"], output_names=["loss", "logits"], opset_version=14,
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
    generator = torch.Generator().manual_seed(2026)
    x = torch.randn(TRAIN_SAMPLES, STEPS, FEATURES, generator=generator)
    # The class is the argmax of a fixed linear map of the sequence's mean and its last step.
    teacher = torch.randn(2 * FEATURES, CLASSES, generator=generator)
    labels = (torch.cat([x.mean(dim=1), x[:, -1]], 1) @ teacher).argmax(dim=1).to(torch.int64)
    train = {"x": x, "labels": labels}
    write_safetensors(os.path.join(HERE, "recurrent_train.safetensors"), train)
    reference = {"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": TRAIN_SAMPLES,
                 "optimizer": OPTIMIZER, "models": {}}
    for seed, name in enumerate(MODELS, start=31):
        path = export(name, seed)
        model = module_from_onnx(MODELS[name](), path)
        reference["models"][name] = {
            "losses": losses_of(copy.deepcopy(model), train, torch.float32),
            "lossesFloat64": losses_of(copy.deepcopy(model), train, torch.float64),
        }
    with open(os.path.join(HERE, "recurrent_training_reference.json"), "w") as out:
        json.dump(reference, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
