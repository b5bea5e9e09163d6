#!/usr/bin/env python3
"""Writes the ONNX fixtures of tests/onnx: a small MLP classifier and a LeNet
CNN exported by PyTorch with their losses inside the graph and a symbolic
batch axis, and PyTorch's outputs for fixed inputs at several batch sizes; a
GPT-style decoder block (gpt_block.onnx, gpt_block_reference.json) with its
next-token loss inside the graph; and the bad models
of the bad-input corpus (tests/data/bad/onnx, expected ids in
tests/data/bad/expected.json); and, for training the MLP export from its
initializers, a tensors dataset (mlp_train.safetensors, mlp_test.safetensors)
with PyTorch's per-step losses under tessera's SGD, SGD-with-momentum and Adam
updates (mlp_training_reference.json), plus the copy the sample config
samples/configs/mlp_onnx.json trains; the same for the LeNet and GPT-block
exports (lenet_/gpt_train.safetensors, lenet_/gpt_test.safetensors,
lenet_/gpt_training_reference.json); and the models and token set of the
sample configs samples/configs/lenet.json and gpt_tiny.json; and a model
with three inputs that an IDX dataset cannot feed (three_inputs.onnx); and
float16 models (half_mlp.onnx with its float twin half_mlp_float.onnx and
PyTorch's outputs half_mlp_reference.json, half_mixed.onnx with its float
twin half_mixed_float.onnx).

Run from the checkout with Debian's python3-torch and python3-onnx:
    /usr/bin/python3 tests/data/onnx/generate.py
The files are committed; the tests only read them.
"""
import json
import os
import shutil
import struct

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
    write_lenet()


class LeNet(torch.nn.Module):
    """LeNet-5 for 28x28 images: two convolutions with max pools, three
    linear layers, the cross-entropy loss inside the graph."""

    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(1, 6, 5, padding=2)
        self.conv2 = torch.nn.Conv2d(6, 16, 5)
        self.fc1 = torch.nn.Linear(400, 120)
        self.fc2 = torch.nn.Linear(120, 84)
        self.fc3 = torch.nn.Linear(84, 10)

    def forward(self, image, labels):
        h = F.max_pool2d(F.relu(self.conv1(image)), 2)
        h = F.max_pool2d(F.relu(self.conv2(h)), 2)
        h = torch.flatten(h, 1)
        h = F.relu(self.fc1(h))
        h = F.relu(self.fc2(h))
        logits = self.fc3(h)
        return F.cross_entropy(logits, labels), logits


def write_lenet():
    """lenet.onnx and PyTorch's loss and logits for fixed images at several
    batch sizes (lenet_reference.json; the weights are in the model)."""
    torch.manual_seed(17)
    model = LeNet()
    image = torch.randn(2, 1, 28, 28)
    labels = torch.tensor([0, 9], dtype=torch.int64)
    path = os.path.join(HERE, "lenet.onnx")
    torch.onnx.export(model, (image, labels), path, input_names=["image", "labels"],
                      output_names=["loss", "logits"], opset_version=14,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"image": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(path))

    cases = []
    generator = torch.Generator().manual_seed(19)
    for batch in BATCHES:
        # 8-bit pixels as in MNIST: the image is pixels / 255 in float32.
        pixels = torch.randint(0, 256, (batch, 1, 28, 28), generator=generator)
        lb = torch.randint(0, 10, (batch,), generator=generator)
        with torch.no_grad():
            loss, logits = model(pixels.to(torch.float32) / 255.0, lb)
        cases.append({"batch": batch, "pixels": pixels.flatten().tolist(), "labels": lb.tolist(),
                      "loss": float(loss), "logits": logits.flatten().tolist()})
    # One SGD step (learning rate 0.1) on the last case: the parameters it
    # changes first and last in the network (every gradient op lies between).
    last = cases[-1]
    images = torch.tensor(last["pixels"], dtype=torch.float32).reshape(-1, 1, 28, 28) / 255.0
    loss, _ = model(images, torch.tensor(last["labels"]))
    loss.backward()
    with torch.no_grad():
        step = {name: (p - 0.1 * p.grad).flatten().tolist() for name, p in model.named_parameters()
                if name in ("conv1.weight", "conv1.bias", "conv2.bias", "fc3.bias")}
    with open(os.path.join(HERE, "lenet_reference.json"), "w") as out:
        json.dump({"imageShape": [1, 28, 28], "classes": 10, "cases": cases, "sgdStep": step}, out)
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


def write_old_opset_model():
    """An opset-6 model in the style of PyTorch's early exports (Add with the
    `broadcast` attribute, Softmax on 2-D input), which import upgrades with
    ONNX's version converter: y = softmax(relu(x + b) * 2)."""
    x = tensor("x", ["batch", 4])
    y = tensor("y", ["batch", 4])
    b = helper.make_tensor("b", TensorProto.FLOAT, [4], [0.5, -1.0, 0.25, 2.0])
    two = helper.make_tensor("two", TensorProto.FLOAT, [1], [2.0])
    nodes = [helper.make_node("Add", ["x", "b"], ["sum"], name="bias", broadcast=1),
             helper.make_node("Relu", ["sum"], ["hidden"], name="relu"),
             helper.make_node("Mul", ["hidden", "two"], ["scaled"], name="scale", broadcast=1),
             helper.make_node("Softmax", ["scaled"], ["y"], name="softmax", axis=1)]
    graph = helper.make_graph(nodes, "old_opset", [x, tensor("b", [4]), tensor("two", [1])], [y],
                              initializer=[b, two])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 6)], producer_name="tessera-tests")
    m.ir_version = 3
    onnx.checker.check_model(m)
    with open(os.path.join(HERE, "old_opset.onnx"), "wb") as out:
        out.write(m.SerializeToString())


def write_double_model():
    """A model of double tensors (tests/onnx/import_test.cpp): y = relu(x) + shift in double, z = y cast
    to float; shift holds values beyond float32's range and below its precision."""
    shift = helper.make_tensor("shift", TensorProto.DOUBLE, [4], [1e200, 1.0 + 2.0 ** -40, -0.5, 1e-300])
    nodes = [helper.make_node("Relu", ["x"], ["r"], name="relu"),
             helper.make_node("Add", ["r", "shift"], ["y"], name="shift"),
             helper.make_node("Cast", ["y"], ["z"], name="narrow", to=TensorProto.FLOAT)]
    graph = helper.make_graph(nodes, "double_relu", [tensor("x", ["batch", 4], TensorProto.DOUBLE)],
                              [tensor("y", ["batch", 4], TensorProto.DOUBLE), tensor("z", ["batch", 4])],
                              initializer=[shift])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="tessera-tests")
    onnx.checker.check_model(m)
    with open(os.path.join(HERE, "double_relu.onnx"), "wb") as out:
        out.write(m.SerializeToString())


def write_casts_model():
    """Casts to float of integers, masks and doubles (tests/onnx/float16_import_test.cpp): y = float(n) * x +
    float(x > 0) + float(d), with n int64, x float and d double."""
    nodes = [helper.make_node("Cast", ["n"], ["nf"], name="from_int", to=TensorProto.FLOAT),
             helper.make_node("Greater", ["x", "zero"], ["positive"], name="positive"),
             helper.make_node("Cast", ["positive"], ["mask"], name="from_bool", to=TensorProto.FLOAT),
             helper.make_node("Cast", ["d"], ["df"], name="from_double", to=TensorProto.FLOAT),
             helper.make_node("Mul", ["nf", "x"], ["scaled"], name="scale"),
             helper.make_node("Add", ["scaled", "mask"], ["shifted"], name="shift"),
             helper.make_node("Add", ["shifted", "df"], ["y"], name="y")]
    graph = helper.make_graph(nodes, "casts", [tensor("x", [2, 3]), tensor("n", [2, 3], TensorProto.INT64),
                                               tensor("d", [2, 3], TensorProto.DOUBLE)],
                              [tensor("y", [2, 3])], initializer=[helper.make_tensor("zero", TensorProto.FLOAT, [], [0.0])])
    m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 14)], producer_name="tessera-tests")
    onnx.checker.check_model(m)
    with open(os.path.join(HERE, "casts.onnx"), "wb") as out:
        out.write(m.SerializeToString())


class HalfMlp(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = torch.nn.Linear(6, 8)
        self.fc2 = torch.nn.Linear(8, 4)

    def forward(self, x, labels):
        logits = self.fc2(F.relu(self.fc1(x)))
        return F.cross_entropy(logits, labels), logits


def to_float16(m):
    """The model with its float tensors made float16, as deployment converters do: initializers, Constant
    values, Cast targets and the declared types of inputs, outputs and values (the values are halves
    already, so the conversion is exact)."""
    m = onnx.ModelProto.FromString(m.SerializeToString())
    g = m.graph
    for init in g.initializer:
        if init.data_type == TensorProto.FLOAT:
            init.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(init).astype("float16"), init.name))
    for info in list(g.input) + list(g.output) + list(g.value_info):
        if info.type.tensor_type.elem_type == TensorProto.FLOAT:
            info.type.tensor_type.elem_type = TensorProto.FLOAT16
    for node in g.node:
        for a in node.attribute:
            if a.name == "to" and node.op_type == "Cast" and a.i == TensorProto.FLOAT:
                a.i = TensorProto.FLOAT16
            if a.HasField("t") and a.t.data_type == TensorProto.FLOAT:
                a.t.CopyFrom(onnx.numpy_helper.from_array(onnx.numpy_helper.to_array(a.t).astype("float16"), a.t.name))
    return m


def write_half_models():
    """A float16 MLP (tests/onnx/float16_native_test.cpp): PyTorch's CPU kernels have no half Linear, so
    the model is exported in float32 with weights that are halves (half_mlp_float.onnx, the twin) and
    converted to float16 (half_mlp.onnx); the reference is PyTorch's float32 forward of the same halves
    on half inputs. And a mixed model: float16 MatMuls around a float32 LayerNormalization with the Casts
    between them (half_mixed.onnx), with its float twin (half_mixed_float.onnx, the Casts to float)."""
    torch.manual_seed(29)
    net = HalfMlp()
    with torch.no_grad():
        for p in net.parameters():
            p.copy_(p.half().float())
    x = torch.randn(4, 6).half().float()
    labels = torch.tensor([1, 3, 0, 2], dtype=torch.int64)
    twin = os.path.join(HERE, "half_mlp_float.onnx")
    torch.onnx.export(net, (x, labels), twin, input_names=["x", "labels"], output_names=["loss", "logits"],
                      opset_version=14, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"x": {0: "batch"}, "labels": {0: "batch"}, "logits": {0: "batch"}})
    half = to_float16(onnx.load(twin))
    onnx.checker.check_model(half)
    onnx.save(half, os.path.join(HERE, "half_mlp.onnx"))
    loss, logits = net(x, labels)
    reference = {"x": x.flatten().tolist(), "labels": labels.tolist(), "loss": loss.item(),
                 "logits": logits.detach().flatten().tolist()}
    with open(os.path.join(HERE, "half_mlp_reference.json"), "w") as out:
        json.dump(reference, out, indent=1)
        out.write("\n")

    # y = half(LayerNorm(float(x @ w1))) @ w2 + shift: float16 MatMuls and a float16 Constant around a
    # float32 LayerNormalization.
    generator = torch.Generator().manual_seed(31)
    w1 = torch.randn(6, 8, generator=generator).half()
    w2 = torch.randn(8, 3, generator=generator).half()
    scale = torch.rand(8, generator=generator) + 0.5
    bias = torch.randn(8, generator=generator) * 0.1
    for dtype, name in ((TensorProto.FLOAT16, "half_mixed.onnx"), (TensorProto.FLOAT, "half_mixed_float.onnx")):
        numpy_type = "float16" if dtype == TensorProto.FLOAT16 else "float32"
        inits = [onnx.numpy_helper.from_array(w1.numpy().astype(numpy_type), "w1"),
                 onnx.numpy_helper.from_array(w2.numpy().astype(numpy_type), "w2"),
                 onnx.numpy_helper.from_array(scale.numpy(), "ln.scale"),
                 onnx.numpy_helper.from_array(bias.numpy(), "ln.bias")]
        nodes = [helper.make_node("MatMul", ["x", "w1"], ["h"], name="fc1"),
                 helper.make_node("Cast", ["h"], ["h32"], name="widen", to=TensorProto.FLOAT),
                 helper.make_node("LayerNormalization", ["h32", "ln.scale", "ln.bias"], ["n32"], name="ln", axis=-1),
                 helper.make_node("Cast", ["n32"], ["n"], name="narrow", to=dtype),
                 helper.make_node("MatMul", ["n", "w2"], ["z"], name="fc2"),
                 helper.make_node("Constant", [], ["shift"], name="shift",
                                  value=helper.make_tensor("shift", dtype, [3], [0.1, -0.2, 0.3])),
                 helper.make_node("Add", ["z", "shift"], ["y"], name="add")]
        graph = helper.make_graph(nodes, "half_mixed", [tensor("x", ["batch", 6], dtype)],
                                  [tensor("y", ["batch", 3], dtype)], initializer=inits)
        m = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)], producer_name="tessera-tests")
        onnx.checker.check_model(m)
        onnx.save(m, os.path.join(HERE, name))


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
        "opset-18.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")], [x], [y], opset=18),
        # Opsets before 11 are upgraded by ONNX's converter, after ONNX's
        # checker: Relu has one input.
        "opset-9-invalid.onnx": model([helper.make_node("Relu", ["x", "x"], ["y"], name="relu")], [x], [y],
                                      opset=9),
        "other-domain.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu", domain="com.example")],
                                   [x], [y]),
        "unsupported-op.onnx": model([helper.make_node("LRN", ["x"], ["y"], name="lrn1", size=3)], [x], [y]),
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
        "float16-type-mismatch.onnx": model(
            [helper.make_node("Add", ["x", "b"], ["y"], name="add")], [tensor("x", ["batch", 4], TensorProto.FLOAT16)],
            [tensor("y", ["batch", 4], TensorProto.FLOAT16)],
            [helper.make_tensor("b", TensorProto.FLOAT, [4], [0.5] * 4)]),
        "bfloat16-input.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                     [tensor("x", [2, 4], TensorProto.BFLOAT16)],
                                     [tensor("y", [2, 4], TensorProto.BFLOAT16)]),
        "uint8-input.onnx": model([helper.make_node("Relu", ["x"], ["y"], name="relu")],
                                  [tensor("x", [2, 4], TensorProto.UINT8)], [tensor("y", [2, 4], TensorProto.UINT8)]),
    }
    for name, value in models.items():
        data = value if isinstance(value, bytes) else value.SerializeToString()
        with open(os.path.join(BAD, name), "wb") as out:
            out.write(data)


# --- Training the MLP export (tests/sessions/onnx_training_test.cpp) ---------------------------------

TRAIN_SAMPLES = 192   # 24 steps of a global batch of 8, in file order
TEST_SAMPLES = 40
TRAIN_STEPS = 24
GLOBAL_BATCH = 8
SAMPLE_FOLDER = os.path.join(HERE, "..", "..", "..", "samples", "configs", "mlp_onnx")

# The optimizers of the reference, as tessera's run config writes them.
OPTIMIZERS = {
    "sgd": {"type": "SGD", "learningRate": 0.1},
    "sgd-momentum": {"type": "SGD", "learningRate": 0.05, "momentum": 0.9, "dampening": 0.1,
                     "weightDecay": 0.01},
    "adam": {"type": "Adam", "learningRate": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8},
}


def write_safetensors(path, tensors):
    """The safetensors format (8-byte header length, JSON header, little-endian data), written by hand
    so that the generator needs no safetensors package."""
    header, blobs, offset = {}, [], 0
    for name, tensor in tensors.items():
        dtype = {torch.float32: "F32", torch.float64: "F64", torch.int64: "I64", torch.int32: "I32"}[tensor.dtype]
        data = tensor.contiguous().numpy().astype(tensor.numpy().dtype.newbyteorder("<")).tobytes()
        header[name] = {"dtype": dtype, "shape": list(tensor.shape), "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header, separators=(",", ":"))
    text += " " * ((8 - len(text) % 8) % 8)
    with open(path, "wb") as out:
        out.write(struct.pack("<Q", len(text)))
        out.write(text.encode())
        for blob in blobs:
            out.write(blob)


def module_from_onnx(model, path):
    """`model` with the ONNX file's initializers: the weights tessera starts from."""
    from onnx import numpy_helper
    values = {t.name: torch.from_numpy(numpy_helper.to_array(t).copy()) for t in onnx.load(path).graph.initializer}
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            parameter.copy_(values[name])
    return model


def mlp_from_onnx(path):
    """The Mlp module with the ONNX file's initializers."""
    return module_from_onnx(Mlp(), path)


def tessera_update(options, parameters, state, step):
    """One update of tessera's optimizers (optimizers/sgd.cc, optimizers/adam.cc), in float32:
    SGD (PyTorch semantics): g' = g + weightDecay w; v = g' at the first step, else
    momentum v + (1 - dampening) g'; w -= learningRate v (g' without momentum).
    Adam: m = b1 m + (1 - b1) g; v = b2 v + (1 - b2) g^2; w -= learningRate m c1 / (sqrt(v) c2 + eps)
    with c1 = 1 / (1 - b1^t) and c2 = 1 / sqrt(1 - b2^t), t = step + 1."""
    lr = options["learningRate"]
    with torch.no_grad():
        for name, w in parameters:
            g = w.grad.clone()
            if options["type"] == "SGD":
                wd, momentum = options.get("weightDecay", 0.0), options.get("momentum", 0.0)
                if wd > 0:
                    g = g + w * wd
                if momentum > 0:
                    if step == 0:
                        state[name] = g.clone()
                    else:
                        state[name] = state[name] * momentum + g * (1.0 - options.get("dampening", 0.0))
                    g = state[name]
                w.sub_(g * lr)
            else:
                b1, b2, eps = options["beta1"], options["beta2"], options["eps"]
                m, v = state.get(name, (torch.zeros_like(w), torch.zeros_like(w)))
                m = m * b1 + g * (1.0 - b1)
                v = v * b2 + (g * g) * (1.0 - b2)
                state[name] = (m, v)
                t = step + 1
                c1 = 1.0 / (1.0 - b1 ** t)
                c2 = 1.0 / (1.0 - b2 ** t) ** 0.5
                w.sub_((m * c1 / (v.sqrt() * c2 + eps)) * lr)
            w.grad = None


def train_runs(make_model, train, test, inputs, steps, kept=None, accuracy=False):
    """PyTorch's training of a fresh make_model() under each optimizer: batches of GLOBAL_BATCH in file order,
    passing over the training set again when `steps` needs more; per-step losses, the test loss with the final
    weights (and with `accuracy` the fraction of test samples whose largest logit is at their label) and the
    final values of the parameters named in `kept` (all when None)."""
    samples = len(train[inputs[0]])
    runs = {}
    for key, options in OPTIMIZERS.items():
        model = make_model()
        parameters = list(model.named_parameters())
        state, losses = {}, []
        for step in range(steps):
            first = step * GLOBAL_BATCH % samples
            batch = slice(first, first + GLOBAL_BATCH)
            loss, _ = model(*(train[name][batch] for name in inputs))
            loss.backward()
            losses.append(float(loss))
            tessera_update(options, parameters, state, step)
        with torch.no_grad():
            test_loss, logits = model(*(test[name] for name in inputs))
        runs[key] = {"optimizer": options, "losses": losses, "testLoss": float(test_loss),
                     "weights": {name: p.detach().flatten().tolist() for name, p in parameters
                                 if kept is None or name in kept}}
        if accuracy:
            runs[key]["testAccuracy"] = float((logits.argmax(dim=1) == test[inputs[-1]]).to(torch.float64).mean())
    return runs


def write_training_reference():
    generator = torch.Generator().manual_seed(2024)
    # A learnable task: the class is the argmax of a fixed linear map of the sample.
    teacher = torch.randn(6, 4, generator=generator)
    x = torch.randn(TRAIN_SAMPLES + TEST_SAMPLES, 2, 3, generator=generator)
    labels = (x.reshape(-1, 6) @ teacher).argmax(dim=1).to(torch.int64)
    train = {"x": x[:TRAIN_SAMPLES], "labels": labels[:TRAIN_SAMPLES]}
    test = {"x": x[TRAIN_SAMPLES:], "labels": labels[TRAIN_SAMPLES:]}
    write_safetensors(os.path.join(HERE, "mlp_train.safetensors"), train)
    write_safetensors(os.path.join(HERE, "mlp_test.safetensors"), test)

    runs = train_runs(lambda: mlp_from_onnx(os.path.join(HERE, "mlp.onnx")), train, test, ["x", "labels"],
                      TRAIN_STEPS)
    with open(os.path.join(HERE, "mlp_training_reference.json"), "w") as out:
        json.dump({"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": TRAIN_SAMPLES,
                   "testSamples": TEST_SAMPLES, "runs": runs}, out, indent=1)
        out.write("\n")

    # The sample config's copy of the model and its data.
    os.makedirs(SAMPLE_FOLDER, exist_ok=True)
    shutil.copyfile(os.path.join(HERE, "mlp.onnx"), os.path.join(SAMPLE_FOLDER, "mlp.onnx"))
    write_safetensors(os.path.join(SAMPLE_FOLDER, "train.safetensors"), train)
    write_safetensors(os.path.join(SAMPLE_FOLDER, "test.safetensors"), test)


def write_bad_tensor_files():
    """Tensors datasets that do not fit the MLP export's inputs (x [batch, 2, 3] float, labels [batch] int64)
    or are not safetensors files: the bad-input corpus's tensors/ folder (expected ids in
    tests/data/bad/expected.json)."""
    folder = os.path.join(HERE, "..", "bad", "tensors")
    os.makedirs(folder, exist_ok=True)
    x = torch.zeros(4, 2, 3)
    labels = torch.tensor([0, 1, 2, 3], dtype=torch.int64)
    files = {
        "missing-labels.safetensors": {"x": x},
        "misspelled-input.safetensors": {"x": x, "label": labels},
        "x-float64.safetensors": {"x": x.to(torch.float64), "labels": labels},
        "labels-float.safetensors": {"x": x, "labels": labels.to(torch.float32)},
        "x-sample-shape.safetensors": {"x": torch.zeros(4, 3, 2), "labels": labels},
        "x-flattened.safetensors": {"x": torch.zeros(4, 6), "labels": labels},
        "labels-beyond-int32.safetensors": {"x": x, "labels": torch.tensor([0, 1, 2**31, 3], dtype=torch.int64)},
        "lengths-differ.safetensors": {"x": x, "labels": labels[:3]},
    }
    for name, tensors in files.items():
        write_safetensors(os.path.join(folder, name), tensors)
    good = os.path.join(folder, "missing-labels.safetensors")
    with open(good, "rb") as source:
        raw = source.read()
    raw_files = {
        "empty.safetensors": b"",
        "not-safetensors.safetensors": b"x,labels\n0.5,1\n",
        "truncated.safetensors": raw[: len(raw) - 5],
        "header-length-huge.safetensors": struct.pack("<Q", 1 << 40) + raw[8:],
    }
    for name, data in raw_files.items():
        with open(os.path.join(folder, name), "wb") as out:
            out.write(data)


# --- Training the LeNet and GPT-block exports (tests/sessions/onnx_training_test.cpp) ------------------

LENET_TRAIN_SAMPLES = 64   # 24 steps of 8 are three passes in file order; kept small, the images are 3 KB each
LENET_TEST_SAMPLES = 16
GPT_TRAIN_SAMPLES = 192    # 24 steps of 8, one pass
GPT_TEST_SAMPLES = 40


def write_lenet_training_reference():
    """lenet_train.safetensors / lenet_test.safetensors (image [N, 1, 28, 28] as 8-bit pixels / 255, labels
    [N] int64 from a fixed linear map of the 7x7 average-pooled image, centred) and PyTorch's training of the LeNet export
    under each optimizer (lenet_training_reference.json)."""
    generator = torch.Generator().manual_seed(2025)
    count = LENET_TRAIN_SAMPLES + LENET_TEST_SAMPLES
    image = torch.randint(0, 256, (count, 1, 28, 28), generator=generator).to(torch.float32) / 255.0
    teacher = torch.randn(49, 10, generator=generator)
    labels = ((F.avg_pool2d(image, 4).reshape(count, 49) - 0.5) @ teacher).argmax(dim=1).to(torch.int64)
    train = {"image": image[:LENET_TRAIN_SAMPLES], "labels": labels[:LENET_TRAIN_SAMPLES]}
    test = {"image": image[LENET_TRAIN_SAMPLES:], "labels": labels[LENET_TRAIN_SAMPLES:]}
    write_safetensors(os.path.join(HERE, "lenet_train.safetensors"), train)
    write_safetensors(os.path.join(HERE, "lenet_test.safetensors"), test)
    runs = train_runs(lambda: module_from_onnx(LeNet(), os.path.join(HERE, "lenet.onnx")), train, test,
                      ["image", "labels"], TRAIN_STEPS, kept=("conv1.bias", "conv2.bias", "fc3.bias"), accuracy=True)
    with open(os.path.join(HERE, "lenet_training_reference.json"), "w") as out:
        json.dump({"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": LENET_TRAIN_SAMPLES,
                   "testSamples": LENET_TEST_SAMPLES, "runs": runs}, out, indent=1)
        out.write("\n")


def token_sequences(count, generator):
    """`count` sequences of GptBlock.SEQUENCE + 1 tokens that follow t' = (5 t + 3) mod VOCAB, each step
    replaced by a random token with probability 1/8: a next-token task a small decoder learns."""
    vocabulary, length = GptBlock.VOCAB, GptBlock.SEQUENCE + 1
    sequences = torch.empty(count, length, dtype=torch.int64)
    sequences[:, 0] = torch.randint(0, vocabulary, (count,), generator=generator)
    for t in range(1, length):
        follow = (sequences[:, t - 1] * 5 + 3) % vocabulary
        noise = torch.randint(0, vocabulary, (count,), generator=generator)
        keep = torch.randint(0, 8, (count,), generator=generator) != 0
        sequences[:, t] = torch.where(keep, follow, noise)
    return sequences


def write_gpt_training_reference():
    """gpt_train.safetensors / gpt_test.safetensors (tokens and next-token targets [N, 8] int64) and PyTorch's
    training of the GPT-block export under each optimizer (gpt_training_reference.json)."""
    generator = torch.Generator().manual_seed(2026)
    sequences = token_sequences(GPT_TRAIN_SAMPLES + GPT_TEST_SAMPLES, generator)
    tokens, targets = sequences[:, :-1].contiguous(), sequences[:, 1:].contiguous()
    train = {"tokens": tokens[:GPT_TRAIN_SAMPLES], "targets": targets[:GPT_TRAIN_SAMPLES]}
    test = {"tokens": tokens[GPT_TRAIN_SAMPLES:], "targets": targets[GPT_TRAIN_SAMPLES:]}
    write_safetensors(os.path.join(HERE, "gpt_train.safetensors"), train)
    write_safetensors(os.path.join(HERE, "gpt_test.safetensors"), test)

    def block():
        model = module_from_onnx(GptBlock(), os.path.join(HERE, "gpt_block.onnx"))
        model.train()
        return model

    runs = train_runs(block, train, test, ["tokens", "targets"], TRAIN_STEPS,
                      kept=("ln1.weight", "lnf.bias", "head.bias"))
    with open(os.path.join(HERE, "gpt_training_reference.json"), "w") as out:
        json.dump({"globalBatch": GLOBAL_BATCH, "steps": TRAIN_STEPS, "trainSamples": GPT_TRAIN_SAMPLES,
                   "testSamples": GPT_TEST_SAMPLES, "runs": runs}, out, indent=1)
        out.write("\n")


# --- The sample configs lenet.json and gpt_tiny.json ---------------------------------------------------

SAMPLES = os.path.join(HERE, "..", "..", "..", "samples", "configs")


class GptTiny(GptBlock):
    """The decoder of GptBlock with a wider embedding, longer sequences and four heads."""

    VOCAB, DIM, SEQUENCE, HEADS = 32, 32, 16, 4


def skip_tokens(count, generator):
    """`count` sequences of GptTiny.SEQUENCE + 1 tokens: two random tokens, then t[i] = (t[i-2] + 1) mod VOCAB,
    each token replaced by a random one with probability 1/8 (the rule goes on from the replacement). A
    next-token predictor must look two tokens back, through attention. The lowest mean loss is
    (ln VOCAB + 15 H) / 16 = 0.952, H = 0.785 the entropy of a token after the first (the first target is random)."""
    vocabulary, length = GptTiny.VOCAB, GptTiny.SEQUENCE + 1
    sequences = torch.empty(count, length, dtype=torch.int64)
    sequences[:, :2] = torch.randint(0, vocabulary, (count, 2), generator=generator)
    for t in range(2, length):
        follow = (sequences[:, t - 2] + 1) % vocabulary
        noise = torch.randint(0, vocabulary, (count,), generator=generator)
        keep = torch.randint(0, 8, (count,), generator=generator) != 0
        sequences[:, t] = torch.where(keep, follow, noise)
    return sequences


def write_samples():
    """samples/configs/lenet/lenet.onnx (the LeNet export, for Fashion-MNIST through the IDX dataset) and
    samples/configs/gpt_tiny/: the GptTiny export and its token set (2048 training and 256 test sequences of
    skip_tokens as int32 tokens and next-token targets)."""
    os.makedirs(os.path.join(SAMPLES, "lenet"), exist_ok=True)
    shutil.copyfile(os.path.join(HERE, "lenet.onnx"), os.path.join(SAMPLES, "lenet", "lenet.onnx"))

    folder = os.path.join(SAMPLES, "gpt_tiny")
    os.makedirs(folder, exist_ok=True)
    torch.manual_seed(29)
    model = GptTiny()
    model.train()
    tokens = torch.zeros(2, GptTiny.SEQUENCE, dtype=torch.int64)
    path = os.path.join(folder, "gpt_tiny.onnx")
    torch.onnx.export(model, (tokens, tokens), path, input_names=["tokens", "targets"],
                      output_names=["loss", "logits"], opset_version=14,
                      training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                      dynamic_axes={"tokens": {0: "batch"}, "targets": {0: "batch"}, "logits": {0: "batch"}})
    onnx.checker.check_model(onnx.load(path))
    sequences = skip_tokens(2048 + 256, torch.Generator().manual_seed(31)).to(torch.int32)
    tokens, targets = sequences[:, :-1].contiguous(), sequences[:, 1:].contiguous()
    write_safetensors(os.path.join(folder, "train.safetensors"), {"tokens": tokens[:2048], "targets": targets[:2048]})
    write_safetensors(os.path.join(folder, "test.safetensors"), {"tokens": tokens[2048:], "targets": targets[2048:]})


def write_three_inputs_model():
    """three_inputs.onnx: a linear classifier of 28 x 28 images (image [batch, 784], labels [batch] int64) whose
    loss adds the mean of a third input (weight [batch], float): two float inputs, so an IDX dataset cannot bind
    its images by default, and an input it cannot feed."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [784, 10], [((i * 7) % 13 - 6) / 100.0 for i in range(7840)])
    nodes = [helper.make_node("MatMul", ["image", "w"], ["logits"], name="fc"),
             helper.make_node("SoftmaxCrossEntropyLoss", ["logits", "labels"], ["ce"], name="ce"),
             helper.make_node("ReduceMean", ["weight"], ["mean"], name="mean", keepdims=0),
             helper.make_node("Add", ["ce", "mean"], ["loss"], name="loss")]
    m = model(nodes, [tensor("image", ["batch", 784]), tensor("labels", ["batch"], TensorProto.INT64),
                      tensor("weight", ["batch"])],
              [tensor("loss", []), tensor("logits", ["batch", 10])], [w])
    onnx.checker.check_model(m)
    onnx.save(m, os.path.join(HERE, "three_inputs.onnx"))


def gpt2_layout():
    """A tiny GPT in the layout of tessera's transformer model (GPT-2's parameter names, weights [in, out] as
    GPT-2's Conv1D): token and position embeddings, 2 pre-LayerNorm blocks of causal self-attention (2 heads)
    and an exact-GELU MLP of 4x, a final LayerNorm, a head tied to the token embedding (gpt2_layout.onnx) or a
    lm_head.weight of its own (gpt2_layout_untied.onnx), and the next-token cross-entropy. The weights are drawn
    away from their usual initial values so that a parameter read under the wrong name shows in the loss.
    gpt2_layout_reference.json holds PyTorch's loss for fixed token sequences at batch 1, 2 and 4."""
    vocab, hidden, heads, layers, sequence = 24, 16, 2, 2, 8

    class Conv1D(torch.nn.Module):
        def __init__(self, n_in, n_out):
            super().__init__()
            self.weight = torch.nn.Parameter(torch.empty(n_in, n_out))
            self.bias = torch.nn.Parameter(torch.empty(n_out))

        def forward(self, x):
            return x @ self.weight + self.bias

    class Attention(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c_attn = Conv1D(hidden, 3 * hidden)
            self.c_proj = Conv1D(hidden, hidden)
            self.register_buffer("causal", torch.tril(torch.ones(sequence, sequence)).view(1, 1, sequence, sequence))

        def forward(self, x):
            n, t, d = x.shape
            q, k, v = self.c_attn(x).split(d, dim=2)
            q = q.view(n, t, heads, d // heads).transpose(1, 2)
            k = k.view(n, t, heads, d // heads).transpose(1, 2)
            v = v.view(n, t, heads, d // heads).transpose(1, 2)
            scores = (q @ k.transpose(-2, -1)) * (1.0 / (d // heads) ** 0.5)
            scores = scores.masked_fill(self.causal[:, :, :t, :t] == 0, float("-inf"))
            y = (F.softmax(scores, dim=-1) @ v).transpose(1, 2).reshape(n, t, d)
            return self.c_proj(y)

    class Mlp(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.c_fc = Conv1D(hidden, 4 * hidden)
            self.c_proj = Conv1D(4 * hidden, hidden)

        def forward(self, x):
            return self.c_proj(F.gelu(self.c_fc(x)))

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.ln_1 = torch.nn.LayerNorm(hidden)
            self.attn = Attention()
            self.ln_2 = torch.nn.LayerNorm(hidden)
            self.mlp = Mlp()

        def forward(self, x):
            x = x + self.attn(self.ln_1(x))
            return x + self.mlp(self.ln_2(x))

    class Gpt2Layout(torch.nn.Module):
        def __init__(self, tied):
            super().__init__()
            self.tied = tied
            self.wte = torch.nn.Embedding(vocab, hidden)
            self.wpe = torch.nn.Embedding(sequence, hidden)
            self.h = torch.nn.ModuleList([Block() for _ in range(layers)])
            self.ln_f = torch.nn.LayerNorm(hidden)
            if not tied:
                self.lm_head = Conv1D(hidden, vocab)
                del self.lm_head.bias
                self.lm_head.bias = None

        def forward(self, tokens, targets):
            x = self.wte(tokens) + self.wpe.weight
            for block in self.h:
                x = block(x)
            x = self.ln_f(x)
            logits = x @ (self.wte.weight.t() if self.tied else self.lm_head.weight)
            return F.cross_entropy(logits.reshape(-1, vocab), targets.reshape(-1))

    reference = {"vocab": vocab, "hidden": hidden, "heads": heads, "layers": layers, "sequence": sequence}
    generator = torch.Generator().manual_seed(29)
    cases = []
    for batch in [1, 2, 4]:
        samples = torch.randint(0, vocab, (batch, sequence + 1), generator=generator)
        cases.append((batch, samples[:, :-1], samples[:, 1:]))
    for tied, name in [(True, "gpt2_layout"), (False, "gpt2_layout_untied")]:
        torch.manual_seed(31)
        model = Gpt2Layout(tied)
        with torch.no_grad():
            for parameter_name, parameter in model.named_parameters():
                if parameter_name.endswith("ln_1.weight") or parameter_name.endswith("ln_2.weight") or \
                        parameter_name == "ln_f.weight":
                    parameter.copy_(1.0 + 0.1 * torch.randn(parameter.shape))
                else:
                    parameter.copy_(0.2 * torch.randn(parameter.shape))
        model.train()
        path = os.path.join(HERE, name + ".onnx")
        tokens = cases[1][1]
        torch.onnx.export(model, (tokens, tokens), path, input_names=["tokens", "targets"], output_names=["loss"],
                          opset_version=14, training=torch.onnx.TrainingMode.TRAINING, do_constant_folding=False,
                          dynamic_axes={"tokens": {0: "batch"}, "targets": {0: "batch"}})
        onnx.checker.check_model(onnx.load(path))
        losses = []
        for batch, tokens, targets in cases:
            with torch.no_grad():
                losses.append(float(model(tokens, targets)))
        reference[name] = {"parameters": [n for n, _ in model.named_parameters()], "losses": losses}
    reference["cases"] = [{"batch": batch, "tokens": tokens.flatten().tolist(), "targets": targets.flatten().tolist()}
                          for batch, tokens, targets in cases]
    with open(os.path.join(HERE, "gpt2_layout_reference.json"), "w") as out:
        json.dump(reference, out, indent=1)
        out.write("\n")


if __name__ == "__main__":
    main()
    write_old_opset_model()
    gpt_block()
    batchnorm_train()
    dropout_train()
    write_bad_models()
    write_double_model()
    write_casts_model()
    write_half_models()
    write_training_reference()
    write_bad_tensor_files()
    write_lenet_training_reference()
    write_gpt_training_reference()
    write_samples()
    write_three_inputs_model()
    gpt2_layout()
