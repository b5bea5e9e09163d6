"""BatchNormalization trained as PyTorch trains it: a small convolutional
network with two BatchNorm2d layers exported in training mode, three SGD steps
in tessera and in PyTorch float64. The running statistics tessera writes into
the model (modelToHost) are PyTorch's (momentum 0.1, the unbiased variance),
and the same network exported for inference, given the trained weights and
running statistics, gives PyTorch's eval-mode outputs."""
import copy
import io
import os

import numpy as np
import pytest
import tessera

torch = pytest.importorskip("torch")
onnx = pytest.importorskip("onnx")
from onnx import numpy_helper  # noqa: E402

pytestmark = [pytest.mark.skipif(not os.environ.get("TESSERA_PYTHON_REFERENCE"), reason="a build without ONNX support"),
              pytest.mark.filterwarnings("ignore")]  # the exporter's tracer warnings

BATCH = 8
STEPS = 3


class Net(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.conv1 = torch.nn.Conv2d(3, 4, 3, padding=1, bias=False)
        self.bn1 = torch.nn.BatchNorm2d(4)
        self.conv2 = torch.nn.Conv2d(4, 6, 3, stride=2, bias=False)
        self.bn2 = torch.nn.BatchNorm2d(6, eps=1e-3, momentum=0.3)
        self.fc = torch.nn.Linear(6, 5)

    def forward(self, x):
        x = torch.relu(self.bn1(self.conv1(x)))
        x = torch.relu(self.bn2(self.conv2(x)))
        return self.fc(x.mean(dim=(2, 3)))


class WithLoss(torch.nn.Module):
    def __init__(self, net):
        super().__init__()
        self.net = net

    def forward(self, x, labels):
        return torch.nn.functional.cross_entropy(self.net(x), labels)


def export(module, args, names, training):
    out = io.BytesIO()
    mode = torch.onnx.TrainingMode.TRAINING if training else torch.onnx.TrainingMode.EVAL
    torch.onnx.export(module, args, out, input_names=names, opset_version=14, training=mode,
                      do_constant_folding=False)
    return out.getvalue()


def test_running_statistics_and_inference_with_them_are_pytorchs(tmp_path):
    torch.manual_seed(5)
    net = Net()
    generator = torch.Generator().manual_seed(6)
    xs = [torch.rand((BATCH, 3, 8, 8), generator=generator) * 2 + 0.5 for _ in range(STEPS)]
    ys = [torch.randint(0, 5, (BATCH,), generator=generator) for _ in range(STEPS)]
    # Exporting in training mode runs the net once: start both from the
    # statistics the file holds.
    proto = export(WithLoss(copy.deepcopy(net)), (xs[0], ys[0]), ["x", "labels"], True)
    initial = {t.name: numpy_helper.to_array(t) for t in onnx.load_from_string(proto).graph.initializer}

    reference = WithLoss(copy.deepcopy(net).double())
    with torch.no_grad():
        for name, buffer in reference.named_buffers():
            if name in initial:
                buffer.copy_(torch.from_numpy(initial[name].astype(np.float64)))
    reference.train()
    optimizer = torch.optim.SGD(reference.parameters(), lr=0.1)
    for x, y in zip(xs, ys):
        optimizer.zero_grad()
        reference(x.double(), y).backward()
        optimizer.step()

    shapes = tessera.InputShapeInfo()
    shapes.add("x", tessera.TensorInfo("FLOAT", [BATCH, 3, 8, 8]))
    shapes.add("labels", tessera.TensorInfo("INT64", [BATCH]))
    loss = onnx.load_from_string(proto).graph.output[0].name
    session = tessera.TrainingSession(
        fnModel=proto, loss=loss, optimizer=tessera.SGD({"defaultLearningRate": (0.1, True)}),
        dataFlow=tessera.DataFlow(1, {loss: tessera.AnchorReturnType("All")}),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1}), inputShapeInfo=shapes)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    for x, y in zip(xs, ys):
        session.run(tessera.PyStepIO({"x": x.numpy(), "labels": y.numpy()}, anchors))
    session.modelToHost(tmp_path / "trained.onnx")
    trained = {t.name: numpy_helper.to_array(t) for t in onnx.load(str(tmp_path / "trained.onnx")).graph.initializer}

    state = dict(reference.named_parameters())
    state.update(dict(reference.named_buffers()))
    for name in ("net.bn1.running_mean", "net.bn1.running_var", "net.bn2.running_mean", "net.bn2.running_var"):
        want = state[name].detach().numpy()
        assert not np.allclose(trained[name], initial[name])
        np.testing.assert_allclose(trained[name], want, rtol=2e-5, atol=1e-6, err_msg=name)

    # Inference (eval mode: the running statistics) with what tessera trained
    # (PyTorch's eval export folds each BatchNorm into its convolution).
    mine = copy.deepcopy(net)
    with torch.no_grad():
        for name, value in list(mine.named_parameters()) + list(mine.named_buffers()):
            if "net." + name in trained:  # not num_batches_tracked, which the export leaves out
                value.copy_(torch.from_numpy(np.array(trained["net." + name])))
    mine.eval()
    x = torch.rand((BATCH, 3, 8, 8), generator=generator) * 2 + 0.5
    inference_proto = export(mine, (x,), ["x"], False)
    output = onnx.load_from_string(inference_proto).graph.output[0].name
    inference = tessera.InferenceSession(
        fnModel=inference_proto, dataFlow=tessera.DataFlow(1, {output: tessera.AnchorReturnType("All")}),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1}))
    inference.prepareDevice()
    outputs = inference.initAnchorArrays()
    inference.run(tessera.PyStepIO({"x": x.numpy()}, outputs))
    with torch.no_grad():
        want = copy.deepcopy(reference.net).eval()(x.double()).numpy()
    np.testing.assert_allclose(outputs[output], want, rtol=1e-4, atol=1e-5)
