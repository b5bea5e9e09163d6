#!/usr/bin/env python3
"""Writes the ONNX fixtures of tests/onnx: a small MLP classifier exported by
PyTorch with its loss inside the graph and a symbolic batch axis, and
PyTorch's outputs for fixed inputs at several batch sizes; a GPT-style decoder
block (gpt_block.onnx, gpt_block_reference.json) with its next-token loss
inside the graph; and the bad models
of the bad-input corpus (tests/data/bad/onnx, expected ids in
tests/data/bad/expected.json).

Run from the checkout with Debian's python3-torch and python3-onnx:
    /usr/bin/python3 tests/data/onnx/generate.py
The files are committed; the tests only read them.
"""
import json
import os

import onnx
import onnx.numpy_helper
from onnx import TensorProto, helper
import torch
import torch.nn.functional as F

HERE = os.path.dirname(os.path.abspath(__file__))
BAD = os.path.join(HERE, "..", "bad", "onnx")
BATCHES = [2, 4, 8]


class Mlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 4)

    def forward(self, x, labels):
        # Flattening through x.shape makes the export compute the shape
        # (Shape/Gather/Unsqueeze/Concat/Reshape), which import must fold.
        h = F.relu(self.fc1(x.reshape(x.shape[0], -1)))
        logits = self.fc2(h)
        return F.cross_entropy(logits, labels), logits


def main():
    torch.manual_seed(13)
    model = Mlp()
    x = torch.randn(2, 2, 3)
    labels = torch.tensor([0, 3], dtype=torch.int64)
    path = os.path.join(HERE, "mlp.onnx")
    torch.onnx.export(model, (x, labels), path, input_names=["x", "labels"], output_names=["loss", "logits"],
                      opset_version=14, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(path))

    cases = []
    generator = torch.Generator().manual_seed(7)
    for batch in BATCHES:
        xb = torch.randn(batch, 2, 3, generator=generator)
        lb = torch.randint(0, 4, (batch,), generator=generator)
        with torch.no_grad():
            loss, logits = model(xb, lb)
        cases.append({"batch": batch, "x": xb.flatten().tolist(), "labels": lb.tolist(),
                      "loss": float(loss), "logits": logits.flatten().tolist()})
    weights = {name: p.detach().flatten().tolist() for name, p in model.named_parameters()}
    with open(os.path.join(HERE, "mlp_reference.json"), "w") as out:
        json.dump({"inputShape": [2, 3], "classes": 4, "weights": weights, "cases": cases}, out, indent=1)
        out.write("\n")


class GptBlock(torch.nn.Module):
    """Token and learned position embeddings, one pre-LayerNorm decoder block
    (causal self-attention of 2 heads written out with matmuls and a
    registered causal mask filled with -inf; a GELU MLP of 4x), a final
    LayerNorm and a linear head; the next-token cross-entropy is computed
    inside the graph."""

    VOCAB, DIM, SEQUENCE, HEADS = 32, 16, 8, 2

    def __init__(self):
        super().__init__()
        d = self.DIM
        self.tokens = torch.nn.Embedding(self.VOCAB, d)
        self.positions = torch.nn.Embedding(self.SEQUENCE, d)
        self.ln1 = torch.nn.LayerNorm(d)
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.proj = torch.nn.Linear(d, d)
        self.ln2 = torch.nn.LayerNorm(d)
        self.fc1 = torch.nn.Linear(d, 4 * d)
        self.fc2 = torch.nn.Linear(4 * d, d)
        self.lnf = torch.nn.LayerNorm(d)
        self.head = torch.nn.Linear(d, self.VOCAB)
        self.dropout = torch.nn.Dropout(0.0)
        self.register_buffer("causal", torch.tril(torch.ones(self.SEQUENCE, self.SEQUENCE))
                             .view(1, 1, self.SEQUENCE, self.SEQUENCE))
        self.register_buffer("index", torch.arange(self.SEQUENCE))

    def forward(self, tokens, targets):
        n, t = tokens.shape
        d, h = self.DIM, self.HEADS
        x = self.tokens(tokens) + self.positions(self.index[:t])
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q = q.view(n, t, h, d // h).transpose(1, 2)
        k = k.view(n, t, h, d // h).transpose(1, 2)
        v = v.view(n, t, h, d // h).transpose(1, 2)
        scores = (q @ k.transpose(-2, -1)) * (1.0 / (d // h) ** 0.5)
        scores = scores.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf"))
        attention = self.dropout(F.softmax(scores, dim=-1))
        y = (attention @ v).transpose(1, 2).reshape(n, t, d)
        x = x + self.proj(y)
        x = x + self.fc2(F.gelu(self.fc1(self.ln2(x))))
        logits = self.head(self.lnf(x))
        loss = F.cross_entropy(logits.reshape(-1, self.VOCAB), targets.reshape(-1))
        return loss, logits


def gpt_block():
    torch.manual_seed(17)
    model = GptBlock()
    model.train()
    s = GptBlock.SEQUENCE
    tokens = torch.randint(0, GptBlock.VOCAB, (2, s))
    path = os.path.join(HERE, "gpt_block.onnx")
    torch.onnx.export(model, (tokens, tokens), path, input_names=["tokens", "targets"],
                      output_names=["loss", "logits"], opset_version=14,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"tokens": {0: "batch"}, "targets": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(path))

    cases = []
    generator = torch.Generator().manual_seed(5)
    for batch in [1, 2, 4]:
        # Next-token targets: the sequence shifted by one.
        sequence = torch.randint(0, GptBlock.VOCAB, (batch, s + 1), generator=generator)
        tokens, targets = sequence[:, :-1], sequence[:, 1:]
        with torch.no_grad():
            loss, logits = model(tokens, targets)
        cases.append({"batch": batch, "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist(),
                      "loss": float(loss), "logits": logits.flatten().tolist()})
    with open(os.path.join(HERE, "gpt_block_reference.json"), "w") as out:
        json.dump({"sequence": s, "vocabulary": GptBlock.VOCAB, "cases": cases}, out, indent=1)
        out.write("\n")


class BatchNormTrain(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.bn = torch.nn.BatchNorm1d(3, momentum=0.2)
        with torch.no_grad():
            self.bn.weight.copy_(torch.tensor([1.0, 0.5, 2.0]))
            self.bn.bias.copy_(torch.tensor([0.0, 0.1, -0.3]))

    def forward(self, x):
        return self.bn(x)


def batchnorm_train():
    """BatchNorm1d exported in training mode: its running statistics are
    initializers that a training step updates in place (PyTorch's running
    variance is the unbiased one); PyTorch's outputs and running statistics
    after each of two steps."""
    torch.manual_seed(3)
    model = BatchNormTrain()
    model.train()
    path = os.path.join(HERE, "batchnorm_train.onnx")
    torch.onnx.export(model, (torch.randn(2, 3, 4),), path, input_names=["x"], output_names=["y"], opset_version=14,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "y": {0: "batch"}})
    exported = onnx.load(path)
    onnx.checker.check_model(exported)
    # Tracing ran the module once in training mode: start the reference from
    # the running statistics the file holds.
    model = BatchNormTrain()
    model.train()
    with torch.no_grad():
        for init in exported.graph.initializer:
            if init.name in ("bn.running_mean", "bn.running_var"):
                getattr(model.bn, init.name.split(".")[1]).copy_(torch.tensor(onnx.numpy_helper.to_array(init)))
    generator = torch.Generator().manual_seed(11)
    steps = []
    for _ in range(2):
        x = torch.randn(4, 3, 4, generator=generator) * 2 + 1
        with torch.no_grad():
            y = model(x)
        steps.append({"x": x.flatten().tolist(), "y": y.flatten().tolist(),
                      "runningMean": model.bn.running_mean.tolist(), "runningVar": model.bn.running_var.tolist()})
    with open(os.path.join(HERE, "batchnorm_train_reference.json"), "w") as out:
        json.dump({"batch": 4, "steps": steps}, out, indent=1)
        out.write("\n")


def dropout_train():
    """Dropout in training mode with ratio 0.5 (as inputs) and a seed, with its mask output."""
    nodes = [helper.make_node("Dropout", ["x", "ratio", "training"], ["y", "mask"], name="dropout", seed=5)]
    inits = [helper.make_tensor("ratio", TensorProto.FLOAT, [], [0.5]),
             helper.make_tensor("training", TensorProto.BOOL, [], [True])]
    m = model(nodes, [tensor("x", ["batch", 6])], [tensor("y", ["batch", 6]), tensor("mask", ["batch", 6], TensorProto.BOOL)],
              inits)
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(HERE, "dropout_train.onnx"))


def model(nodes, inputs, outputs, initializers=(), opset=14, domain=""):
    graph = helper.make_graph(nodes, "bad", inputs, outputs, initializer=list(initializers))
    return helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, opset)], producer_name="tessera-tests")


def tensor(name, shape, elem=TensorProto.FLOAT):
    return helper.make_tensor_value_info(name, elem, shape)


def short_initializer():
    # A shape of 4000 elements with data for 4: make_tensor checks sizes, so
    # the shape is changed afterwards.
    w = helper.make_tensor("w", TensorProto.FLOAT, [1, 4], [1.0] * 4)
    w.dims[0] = 1000
    return w


def write_bad_models():
    os.makedirs(BAD, exist_ok=True)
    x = tensor("x", ["batch", 4])
    y = tensor("y", ["batch", 4])
    good = model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y])
    raw = good.SerializeToString()
    models = {
        "truncated.onnx": raw[: len(raw) // 2],
        "not-onnx.onnx": b"<html>this is not a model</html>\n",
        "empty.onnx": b"",
        "opset-9.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y], opset=9),
        "other-domain.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu", domain="com.example")],
                                   [x], [y]),
        "unsupported-op.onnx": model([helper.make_node("Conv", ["x", "w"], ["y"], name="conv1")], [x], [y],
                                     [helper.make_tensor("w", TensorProto.FLOAT, [1, 1], [1.0])]),
        "cycle.onnx": model([helper.make_node("Relu", ["b"], ["a"], name="first"),
                             helper.make_node("Neg", ["a"], ["b"], name="second"),
                             helper.make_node("Add", ["x", "b"], ["y"], name="sum")], [x], [y]),
        "no-producer.onnx": model([helper.make_node("Add", ["x", "hidden"], ["y"], name="fc2")], [x], [y]),
        "shape-mismatch.onnx": model([helper.make_node("MatMul", ["x", "w"], ["y"], name="matmul")], [x], [y],
                                     [helper.make_tensor("w", TensorProto.FLOAT, [3, 4], [0.5] * 12)]),
        "unbound-dim.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                  [tensor("x", ["sequence", 4])], [tensor("y", ["sequence", 4])]),
        "huge-constant-of-shape.onnx": model(
            [helper.make_node("ConstantOfShape", ["shape"], ["big"], name="fill"),
             helper.make_node("Add", ["x", "big"], ["y"], name="add")], [x], [y],
            [helper.make_tensor("shape", TensorProto.INT64, [2], [1000000, 1000000])]),
        "initializer-data-short.onnx": model([helper.make_node("Add", ["x", "w"], ["y"], name="add")], [x], [y],
                                             [short_initializer()]),
        "vector-times-batched-matmul.onnx": model(
            [helper.make_node("MatMul", ["v", "w"], ["y"], name="matmul")],
            [tensor("v", [4])], [tensor("y", [2, 5])],
            [helper.make_tensor("w", TensorProto.FLOAT, [2, 4, 5], [0.0] * 40)]),
        "reshape-computed-shape.onnx": model([helper.make_node("Reshape", ["x", "s"], ["y"], name="reshape")],
                                             [x, tensor("s", [2], TensorProto.INT64)], [y]),
        "node-without-input.onnx": model([helper.make_node("Relu", [], ["y"], name="relu")], [x], [y]),
        "dropout-empty-ratio.onnx": model([helper.make_node("Dropout", ["x", "ratio"], ["y"], name="dropout")],
                                          [x], [y], [helper.make_tensor("ratio", TensorProto.FLOAT, [0], [])]),
        "where-float-condition.onnx": model([helper.make_node("Where", ["x", "x", "x"], ["y"], name="where")],
                                            [x], [y]),
        "double-input.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                   [tensor("x", [2, 4], TensorProto.DOUBLE)], [tensor("y", [2, 4], TensorProto.DOUBLE)]),
    }
    for name, value in models.items():
        data = value if isinstance(value, bytes) else value.SerializeToString()
        with open(os.path.join(BAD, name), "wb") as out:
            out.write(data)


if __name__ == "__main__":
    main()
    gpt_block()
    batchnorm_train()
    dropout_train()
    write_bad_models()
