"""PopART's Builder (tessera.Builder): models built node by node are checked
against ONNX's schemas as they are built, and train to the numbers a float64
reference computes for them."""
import math
import os

import numpy as np
import pytest
import tessera

pytestmark = pytest.mark.skipif(not os.environ.get("TESSERA_PYTHON_REFERENCE"), reason="a build without ONNX support")


def error_of(call):
    with pytest.raises(tessera.Error) as raised:
        call()
    return raised.value


def test_names_are_popart_style_and_unique():
    builder = tessera.Builder()
    assert builder.addInputTensor(tessera.TensorInfo("FLOAT", [2, 3])) == "input"
    assert builder.addInputTensor("FLOAT", [2, 3]) == "input/1"
    x = builder.addInputTensor(tessera.TensorInfo("FLOAT", [2, 3]), "x")
    w = builder.addInitializedInputTensor(np.ones((3, 4), np.float32), "w")
    assert (x, w) == ("x", "w")
    assert builder.addInitializedInputTensor(np.ones(4, np.float32)) == "init_input"
    y = builder.aiOnnx.matmul([x, w])
    assert y == "MatMul:0"
    assert builder.aiOnnx.MatMul([x, w]) == "MatMul:0/1"  # any case of the op type
    assert builder.aiOnnx.relu([y], "act") == "act:0"
    assert builder.getTensorShape(y) == [2, 4]
    assert builder.getTensorDtypeString(y) == "float"
    assert builder.getTensorShape(w) == [3, 4]


def test_several_outputs_are_a_list():
    builder = tessera.Builder()
    x = builder.addInputTensor("FLOAT", [4, 6])
    halves = builder.aiOnnx.split([x], 2, axis=1)
    assert isinstance(halves, list) and len(halves) == 2
    assert [builder.getTensorShape(h) for h in halves] == [[4, 3], [4, 3]]
    # Outputs are renamed together when any of their names is taken.
    assert builder.aiOnnx.split([x], num_outputs=3, axis=1) == ["Split:0/1", "Split:1/1", "Split:2/1"]
    assert builder.aiOnnx.split([x], num_outputs=1, axis=1) == ["Split:0/2"]


def test_unknown_op_attribute_and_tensor():
    builder = tessera.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3], "x")
    error = error_of(lambda: builder.aiOnnx.matmull([x, x]))
    assert error.id == "tessera.onnx.735" and "MatMul" in str(error)
    error = error_of(lambda: builder.aiOnnx.softmax([x], axes=1))
    assert error.id == "tessera.onnx.735" and '"axis"' in str(error)
    error = error_of(lambda: builder.aiOnnx.relu(["y"]))
    assert error.id == "tessera.onnx.735" and '"y"' in str(error)


def test_invalid_values_are_refused():
    builder = tessera.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3], "x")
    assert error_of(lambda: builder.aiOnnx.softmax([x], axis="one")).id == "tessera.onnx.736"
    assert error_of(lambda: builder.aiOnnx.matmul([x])).id == "tessera.onnx.736"
    assert error_of(lambda: builder.aiOnnx.relu([x], 3)).id == "tessera.onnx.736"
    assert error_of(lambda: builder.addInputTensor("COMPLEX64", [2])).id == "tessera.onnx.736"
    assert error_of(lambda: builder.addInputTensor("FLOAT", [-1, 2])).id == "tessera.onnx.736"
    assert error_of(lambda: builder.addInitializedInputTensor(np.ones(2, np.uint16))).id == "tessera.onnx.736"
    assert error_of(lambda: tessera.Builder(opsetVersion=9)).id == "tessera.onnx.736"
    assert error_of(lambda: builder.aiGraphcore.l1loss([x], 0.1, reduction="Max")).id == "tessera.onnx.736"
    # A graph input has no node to annotate.
    assert error_of(lambda: builder.virtualGraph(x, 1)).id == "tessera.onnx.736"


def test_annotations_reach_the_nodes():
    onnx = pytest.importorskip("onnx")
    builder = tessera.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3], "x")
    with builder.virtualGraph(1):
        a = builder.aiOnnx.relu([x], "a")
        with builder.pipelineStage(2):
            b = builder.aiOnnx.sigmoid([a], "b")
    c = builder.aiOnnx.tanh([b], "c")
    builder.virtualGraph(c, 0)
    with builder.executionPhase(3):
        d = builder.aiOnnx.relu([c], "d")
    builder.executionPhase(c, 1)
    builder.recomputeOutputInBackwardPass([a], tessera.RecomputeType.Recompute)
    builder.addOutputTensor(d)
    model = onnx.load_model_from_string(builder.getModelProto())
    onnx.checker.check_model(model)
    attributes = {node.name: {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
                  for node in model.graph.node}
    assert attributes["a"] == {"__ipu_number": 1, "__recompute_output_in_backward_pass": 2}
    assert attributes["b"] == {"__ipu_number": 1, "__pipeline_stage": 2}
    assert attributes["c"] == {"__ipu_number": 0, "__execution_phase": 1}
    assert attributes["d"] == {"__execution_phase": 3}


def erf(values):
    return np.vectorize(math.erf)(values)


def reference_step(x, labels, weights, lr):
    """Loss and SGD update of the MLP below, in float64."""
    w0, b0, w1, b1 = (weights[k].astype(np.float64) for k in ("W0", "b0", "W1", "b1"))
    x = x.astype(np.float64).reshape(len(x), -1)
    pre = x @ w0 + b0
    hidden = 0.5 * pre * (1 + erf(pre / math.sqrt(2)))
    logits = hidden @ w1 + b1
    shifted = logits - logits.max(axis=1, keepdims=True)
    probs = np.exp(shifted) / np.exp(shifted).sum(axis=1, keepdims=True)
    n = len(labels)
    loss = -np.log(probs[np.arange(n), labels]).mean()
    d_logits = probs.copy()
    d_logits[np.arange(n), labels] -= 1
    d_logits /= n
    d_hidden = d_logits @ w1.T
    d_pre = d_hidden * (0.5 * (1 + erf(pre / math.sqrt(2))) + pre * np.exp(-pre * pre / 2) / math.sqrt(2 * math.pi))
    grads = {"W0": x.T @ d_pre, "b0": d_pre.sum(axis=0), "W1": hidden.T @ d_logits, "b1": d_logits.sum(axis=0)}
    updated = {k: (weights[k].astype(np.float64) - lr * grads[k]) for k in grads}
    return loss, updated


def build_mlp(weights, batch):
    builder = tessera.Builder()
    x = builder.addInputTensor(tessera.TensorInfo("FLOAT", [batch, 6]), "x")
    labels = builder.addInputTensor(tessera.TensorInfo("INT32", [batch]), "labels")
    w = {k: builder.addInitializedInputTensor(v, k) for k, v in weights.items()}
    pre = builder.aiOnnx.add([builder.aiOnnx.matmul([x, w["W0"]]), w["b0"]])
    hidden = builder.aiGraphcore.gelu([pre])
    logits = builder.aiOnnx.gemm([hidden, w["W1"], w["b1"]])
    probs = builder.aiOnnx.softmax([logits], axis=1)
    loss = builder.aiGraphcore.nllloss([probs, labels], tessera.ReductionType.Mean)
    builder.addOutputTensor(loss)
    return builder.getModelProto(), loss


def train(weights, xs, labels, replicas, lr, rts=False):
    batch = xs.shape[1] // replicas
    proto, loss = build_mlp(weights, batch)
    opts = tessera.SessionOptions()
    opts.enableReplicatedGraphs = replicas > 1
    opts.replicatedGraphCount = replicas
    opts.accumulationAndReplicationReductionType = tessera.ReductionType.Mean
    if rts:
        opts.weightTensorLocationSettings.location.replicatedTensorSharding = tessera.ReplicatedTensorSharding.On
        opts.weightTensorLocationSettings.minElementsForReplicatedTensorSharding = 0
    session = tessera.TrainingSession(
        fnModel=proto, loss=loss, optimizer=tessera.ConstSGD(lr),
        dataFlow=tessera.DataFlow(1, {loss: tessera.AnchorReturnType("All")}),
        userOptions=opts, deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": replicas}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    losses = []
    for step in range(len(xs)):
        shape = (replicas, batch) if replicas > 1 else (batch,)
        inputs = {"x": xs[step].reshape(shape + (6,)), "labels": labels[step].reshape(shape)}
        session.run(tessera.PyStepIO(inputs, anchors))
        losses.append(float(np.mean(anchors[loss])))
    session.weightsToHost()
    trained = {k: np.zeros_like(v) for k, v in weights.items()}
    session.readWeights(tessera.PyWeightsIO(trained))
    return losses, trained


def test_built_model_trains_as_the_float64_reference():
    rng = np.random.default_rng(3)
    weights = {"W0": rng.standard_normal((6, 5)).astype(np.float32) * 0.5,
               "b0": rng.standard_normal(5).astype(np.float32) * 0.1,
               "W1": rng.standard_normal((5, 4)).astype(np.float32) * 0.5,
               "b1": rng.standard_normal(4).astype(np.float32) * 0.1}
    steps, batch, lr = 4, 8, 0.1
    xs = rng.standard_normal((steps, batch, 6)).astype(np.float32)
    labels = rng.integers(0, 4, size=(steps, batch)).astype(np.int32)
    losses, trained = train(weights, xs, labels, 1, lr)
    reference = {k: v.astype(np.float64) for k, v in weights.items()}
    for step in range(steps):
        expected, reference = reference_step(xs[step], labels[step], reference, lr)
        assert losses[step] == pytest.approx(expected, rel=1e-5)
    for name, value in trained.items():
        np.testing.assert_allclose(value, reference[name], rtol=1e-4, atol=1e-6)

    # The same global batch over two replicas, weights sharded: the same training.
    sharded, trained2 = train(weights, xs, labels, 2, lr, rts=True)
    np.testing.assert_allclose(sharded, losses, rtol=1e-6)
    for name, value in trained2.items():
        np.testing.assert_allclose(value, trained[name], rtol=1e-5, atol=1e-7)


def test_l1_and_identity_losses():
    builder = tessera.Builder()
    x = builder.addInputTensor("FLOAT", [2, 3], "x")
    w = builder.addInitializedInputTensor(np.array([[1.0, -2.0, 3.0]], np.float32), "w")
    y = builder.aiOnnx.mul([x, w])
    l1 = builder.aiGraphcore.l1loss([y], 0.5, reduction=tessera.ReductionType.Mean)
    assert builder.getTensorShape(l1) == []
    assert builder.getTensorShape(builder.aiGraphcore.l1loss([y], 0.5, "NoReduction")) == [2, 3]
    assert builder.getTensorShape(builder.aiGraphcore.identityloss([y], tessera.ReductionType.Sum)) == []
    builder.addOutputTensor(l1)
    session = tessera.TrainingSession(
        fnModel=builder.getModelProto(), loss=l1, optimizer=tessera.ConstSGD(0.1),
        dataFlow=tessera.DataFlow(1, {l1: tessera.AnchorReturnType("All")}),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1}))
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    xs = np.array([[1.0, 2.0, -1.0], [0.5, -0.5, 2.0]], np.float32)
    session.run(tessera.PyStepIO({"x": xs}, anchors))
    expected = 0.5 * np.abs(xs * np.array([1.0, -2.0, 3.0])).mean()
    assert float(anchors[l1]) == pytest.approx(expected, rel=1e-6)
