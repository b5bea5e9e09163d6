"""PopART's session names over an ONNX model: the Python module trains the
MLP export (tests/data/onnx/mlp.onnx) to the same losses, bit for bit, as
the C++ API (reference_training.cc), with PopART's array shapes."""
import _thread
import os
import pathlib
import subprocess
import sys
import threading

import numpy as np
import pytest
import tessera

SOURCE = pathlib.Path(os.environ.get("TESSERA_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
MODEL = SOURCE / "tests/data/onnx/mlp.onnx"
REFERENCE = os.environ.get("TESSERA_PYTHON_REFERENCE")

pytestmark = pytest.mark.skipif(not REFERENCE, reason="a build without ONNX support")

LEARNING_RATE = 0.05
MOMENTUM = 0.9


def step_data(steps, replicas, batch, seed=5):
    rng = np.random.default_rng(seed)
    leading = (replicas,) if replicas > 1 else ()
    x = rng.standard_normal((steps,) + leading + (batch, 2, 3)).astype(np.float32)
    labels = rng.integers(0, 4, size=(steps,) + leading + (batch,), dtype=np.int64)
    return x, labels


def reference_losses(tmp_path, x, labels, replicas, batch):
    inputs = tmp_path / "inputs.bin"
    with open(inputs, "wb") as out:
        for step in range(len(x)):
            out.write(x[step].astype("<f4").tobytes())
            out.write(labels[step].astype("<i4").tobytes())
    result = subprocess.run([REFERENCE, str(MODEL), str(inputs), str(len(x)), str(replicas), str(batch),
                             repr(LEARNING_RATE), repr(MOMENTUM)], capture_output=True, text=True, check=True)
    return [[float.fromhex(value) for value in line.split()] for line in result.stdout.splitlines()]


def options(replicas, accumulation=1):
    opts = tessera.SessionOptions()
    opts.enableReplicatedGraphs = replicas > 1
    opts.replicatedGraphCount = replicas
    opts.enableGradientAccumulation = accumulation > 1
    opts.accumulationFactor = accumulation
    opts.accumulationAndReplicationReductionType = tessera.ReductionType.Mean
    return opts


def shape_info(batch):
    info = tessera.InputShapeInfo()
    info.add("x", tessera.TensorInfo("FLOAT", [batch, 2, 3]))
    info.add("labels", tessera.TensorInfo("INT64", [batch]))
    return info


def training_session(replicas, batch, model=MODEL, accumulation=1, anchors=("loss",), batches_per_step=1,
                     return_type=("All",), **kwargs):
    return tessera.TrainingSession(
        fnModel=model, loss="loss",
        optimizer=tessera.SGD({"defaultLearningRate": (LEARNING_RATE, True), "defaultMomentum": (MOMENTUM, True)}),
        dataFlow=tessera.DataFlow(batches_per_step,
                                  {name: tessera.AnchorReturnType(*return_type) for name in anchors}),
        userOptions=options(replicas, accumulation),
        deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": replicas}),
        inputShapeInfo=shape_info(batch), **kwargs)


@pytest.mark.parametrize("replicas, batch", [(1, 4), (2, 2)])
@pytest.mark.parametrize("as_bytes", [False, True])
def test_losses_equal_the_cpp_apis_bit_for_bit(tmp_path, replicas, batch, as_bytes):
    steps = 6
    x, labels = step_data(steps, replicas, batch)
    model = MODEL.read_bytes() if as_bytes else str(MODEL)
    session = training_session(replicas, batch, model=model)
    session.prepareDevice()
    session.weightsFromHost()
    anchors = session.initAnchorArrays()
    assert anchors["loss"].shape == ((replicas,) if replicas > 1 else ())
    losses = []
    for step in range(steps):
        session.run(tessera.PyStepIO({"x": x[step], "labels": labels[step]}, anchors))
        losses.append([float(v) for v in np.atleast_1d(anchors["loss"])])
    assert losses == reference_losses(tmp_path, x, labels, replicas, batch)
    assert np.mean(losses[-2:]) != np.mean(losses[:2])


def test_anchor_and_input_shapes_follow_popart():
    # [accumulationFactor, replicationFactor, ...shape], dimensions of 1 omitted.
    session = training_session(2, 3, accumulation=4)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    assert anchors["loss"].shape == (4, 2)
    rng = np.random.default_rng(1)
    x = rng.standard_normal((4, 2, 3, 2, 3)).astype(np.float32)
    labels = rng.integers(0, 4, size=(4, 2, 3)).astype(np.int32)  # int32 labels work too
    session.run(tessera.PyStepIO({"x": x, "labels": labels}, anchors))
    assert np.all(anchors["loss"] > 0) and len(np.unique(anchors["loss"])) == 8

    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({"x": x[0], "labels": labels}, anchors))
    assert raised.value.id == "tessera.graph.206"
    assert raised.value.path == "x"
    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({"x": x.astype(np.float64), "labels": labels}, anchors))
    assert raised.value.id == "tessera.graph.212"
    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({"x": x, "labels": labels.astype(np.int64) + 2**40}, anchors))
    assert raised.value.id == "tessera.config.106"
    assert raised.value.path == "labels"
    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({"x": x, "labels": labels}, {"loss": np.zeros((2, 4), np.float32)}))
    assert raised.value.id == "tessera.graph.206"
    assert raised.value.path == "loss"


def test_extra_anchors_have_the_tensor_shape_after_the_replicas():
    session = training_session(2, 3, anchors=("loss", "logits"))
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    assert anchors["loss"].shape == (2,)
    assert anchors["logits"].shape == (2, 3, 4)
    x, labels = step_data(1, 2, 3)
    session.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors))
    assert np.all(np.isfinite(anchors["logits"])) and np.all(anchors["logits"] != 0)
    # The C++ session returns extra outputs without accumulation only.
    with pytest.raises(tessera.Error) as raised:
        training_session(2, 3, accumulation=4, anchors=("loss", "logits")).prepareDevice()
    assert raised.value.id == "tessera.config.125"


@pytest.mark.parametrize("replicas, accumulation", [(1, 1), (2, 1), (1, 3), (2, 2)])
def test_batches_per_step_train_as_separate_runs_bit_for_bit(replicas, accumulation):
    batches, batch = 3, 2
    rng = np.random.default_rng(11)
    leading = tuple(d for d in (batches, accumulation, replicas) if d > 1)
    x = rng.standard_normal(leading + (batch, 2, 3)).astype(np.float32)
    labels = rng.integers(0, 4, size=leading + (batch,), dtype=np.int64)

    stepped = training_session(replicas, batch, accumulation=accumulation, batches_per_step=batches)
    stepped.prepareDevice()
    anchors = stepped.initAnchorArrays()
    assert anchors["loss"].shape == leading
    stepped.run(tessera.PyStepIO({"x": x, "labels": labels}, anchors))

    separate = training_session(replicas, batch, accumulation=accumulation)
    separate.prepareDevice()
    one = separate.initAnchorArrays()
    losses = []
    for b in range(batches):
        separate.run(tessera.PyStepIO({"x": x[b], "labels": labels[b]}, one))
        losses.append(one["loss"].copy())
    assert np.array_equal(anchors["loss"], np.stack(losses))
    weights = []
    for trained in (stepped, separate):
        trained.weightsToHost()
        arrays = {"fc1.weight": np.zeros((8, 6), np.float32), "fc2.bias": np.zeros((4,), np.float32)}
        trained.readWeights(tessera.PyWeightsIO(arrays))
        weights.append(arrays)
    assert all(np.array_equal(weights[0][k], weights[1][k]) for k in weights[0])


def test_anchor_return_types_have_popart_shapes_and_values():
    batches, accumulation, replicas, batch = 4, 2, 2, 3
    rng = np.random.default_rng(3)
    x = rng.standard_normal((batches, accumulation, replicas, batch, 2, 3)).astype(np.float32)
    labels = rng.integers(0, 4, size=(batches, accumulation, replicas, batch), dtype=np.int64)
    returned = {}
    for kind, shape in [(("All",), (4, 2, 2)), (("EveryN", 2), (2, 2, 2)), (("EveryN", 4), (2, 2)),
                        (("Final",), (2,)), (("Sum",), (2,))]:
        session = training_session(replicas, batch, accumulation=accumulation, batches_per_step=batches,
                                   return_type=kind)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        assert anchors["loss"].shape == shape, kind
        session.run(tessera.PyStepIO({"x": x, "labels": labels}, anchors))
        returned[kind] = anchors["loss"]
    every = returned[("All",)]
    assert np.array_equal(returned[("EveryN", 2)], every[[1, 3]])
    assert np.array_equal(returned[("EveryN", 4)], every[3])
    assert np.array_equal(returned[("Final",)], every[3, 1])
    total = every[0, 0].copy()
    for b in range(batches):
        for m in range(accumulation):
            if b or m:
                total += every[b, m]
    assert np.array_equal(returned[("Sum",)], total)
    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors))
    assert raised.value.id == "tessera.graph.206"


def test_input_settings_and_anchor_exchange_change_no_number():
    x, labels = step_data(1, 1, 4)
    losses = []
    for tile_set, strategy in [(tessera.TileSet.Compute, tessera.ExchangeStrategy.JustInTime),
                               (tessera.TileSet.IO, tessera.ExchangeStrategy.OverlapInnerLoop)]:
        settings = tessera.InputSettings(tile_set, strategy)
        assert settings.tileSet() == tile_set and settings.exchangeStrategy() == strategy
        info = tessera.InputShapeInfo()
        info.add("x", tessera.TensorInfo("FLOAT", [4, 2, 3]), settings)
        info.add("labels", tessera.TensorInfo("INT64", [4]), settings)
        anchor = tessera.AnchorReturnType("All", tile_set, strategy)
        assert anchor.id() == "All" and anchor.tileSet() == tile_set and anchor.exchangeStrategy() == strategy
        opts = options(1)
        opts.numIOTiles = 32
        session = tessera.TrainingSession(
            fnModel=MODEL, loss="loss",
            optimizer=tessera.SGD({"defaultLearningRate": (LEARNING_RATE, True),
                                   "defaultMomentum": (MOMENTUM, True)}),
            dataFlow=tessera.DataFlow(1, {"loss": anchor}), userOptions=opts,
            deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1}), inputShapeInfo=info)
        session.prepareDevice()
        anchors = session.initAnchorArrays()
        session.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors))
        losses.append(float(anchors["loss"]))
    assert losses[0] == losses[1]


def test_weights_move_between_host_and_device():
    session = training_session(1, 4)
    session.prepareDevice()
    initial = {"fc1.weight": np.zeros((8, 6), np.float32), "fc2.bias": np.zeros((4,), np.float32)}
    session.readWeights(tessera.PyWeightsIO(initial))
    assert np.any(initial["fc1.weight"] != 0)

    # writeWeights fills the host copy; weightsFromHost writes it to the device.
    changed = {"fc2.bias": np.array([1, 2, 3, 4], np.float32)}
    session.writeWeights(tessera.PyWeightsIO(changed))
    session.weightsFromHost()
    x, labels = step_data(1, 1, 4)
    session.weightsToHost()
    back = {"fc2.bias": np.zeros((4,), np.float32)}
    session.readWeights(tessera.PyWeightsIO(back))
    np.testing.assert_array_equal(back["fc2.bias"], changed["fc2.bias"])

    anchors = session.initAnchorArrays()
    session.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors))
    session.weightsToHost()
    session.readWeights(tessera.PyWeightsIO(back))
    assert np.all(back["fc2.bias"] != changed["fc2.bias"])

    with pytest.raises(tessera.Error) as raised:
        session.readWeights(tessera.PyWeightsIO({"fc3.weight": np.zeros(3, np.float32)}))
    assert raised.value.id == "tessera.graph.203"
    with pytest.raises(tessera.Error) as raised:
        session.writeWeights(tessera.PyWeightsIO({"fc2.bias": np.zeros(5, np.float32)}))
    assert raised.value.id == "tessera.graph.206"


def test_inference_session_computes_the_training_forward():
    x, labels = step_data(1, 1, 4)
    training = training_session(1, 4)
    training.prepareDevice()
    anchors = training.initAnchorArrays()
    training.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors))

    inference = tessera.InferenceSession(fnModel=str(MODEL),
                                         dataFlow=tessera.DataFlow(1, {"loss": tessera.AnchorReturnType("All")}),
                                         inputShapeInfo=shape_info(4))
    inference.prepareDevice()
    outputs = inference.initAnchorArrays()
    inference.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, outputs))
    assert float(outputs["loss"]) == float(anchors["loss"])


def test_learning_rate_changes_between_steps():
    session = training_session(1, 4)
    session.prepareDevice()
    session.updateOptimizerFromHost(
        tessera.SGD({"defaultLearningRate": (0.5, False), "defaultMomentum": (MOMENTUM, True)}))
    with pytest.raises(tessera.Error) as raised:
        session.updateOptimizerFromHost(tessera.SGD({"defaultLearningRate": (0.5, False)}))
    assert raised.value.id == "tessera.config.125"


@pytest.mark.parametrize("make, error_id, path", [
    (lambda: tessera.DataFlow(0, {"loss": tessera.AnchorReturnType("All")}), "tessera.config.170",
     "/dataFlow/batchesPerStep"),
    (lambda: tessera.DataFlow(3, {"loss": tessera.AnchorReturnType("EveryN", 2)}), "tessera.config.171",
     "/dataFlow/anchors/loss"),
    (lambda: tessera.AnchorReturnType("EveryN"), "tessera.config.171", "/dataFlow/anchors"),
    (lambda: tessera.AnchorReturnType("Final", 2), "tessera.config.171", "/dataFlow/anchors"),
    (lambda: tessera.AnchorReturnType("Every"), "tessera.config.171", "/dataFlow/anchors"),
    (lambda: tessera.SGD({"defaultLearningRat": 0.1}), "tessera.config.104", "/defaultLearningRat"),
    (lambda: tessera.SGD({"defaultLearningRate": (-0.1, True)}), "tessera.config.106", "/learningRate"),
    (lambda: tessera.DeviceManager().createSimDevice({"tilesPerIpu": 0}), "tessera.config.106", "/tilesPerIpu"),
    (lambda: tessera.DeviceManager().createIpuModelDevice({"numIPUs": 0}), "tessera.config.153",
     "/deviceInfo/numIPUs"),
])
def test_configuration_errors_carry_ids(make, error_id, path):
    with pytest.raises(tessera.Error) as raised:
        make()
    assert raised.value.id == error_id
    assert raised.value.path == path


def test_session_errors_carry_ids():
    with pytest.raises(tessera.Error) as raised:
        tessera.TrainingSession(fnModel=str(MODEL), loss="loss", optimizer=tessera.ConstSGD(0.1),
                                dataFlow=tessera.DataFlow(1, {}), userOptions=options(2),
                                deviceInfo=tessera.DeviceManager().createSimDevice({"numIPUs": 1}),
                                inputShapeInfo=shape_info(2))
    assert raised.value.id == "tessera.config.153"
    with pytest.raises(tessera.Error) as raised:
        tessera.TrainingSession(fnModel=str(MODEL), loss="loss", optimizer=tessera.ConstSGD(0.1),
                                dataFlow=tessera.DataFlow(1, {}))
    assert raised.value.id == "tessera.onnx.706"
    with pytest.raises(tessera.Error) as raised:
        tessera.TrainingSession(fnModel=b"not a model", loss="loss", optimizer=tessera.ConstSGD(0.1),
                                dataFlow=tessera.DataFlow(1, {}))
    assert raised.value.id == "tessera.onnx.702"
    session = tessera.TrainingSession(fnModel=str(MODEL), loss="loss", optimizer=tessera.ConstSGD(0.1),
                                      dataFlow=tessera.DataFlow(1, {"loss": tessera.AnchorReturnType("All")}),
                                      inputShapeInfo=shape_info(2))
    with pytest.raises(tessera.Error) as raised:
        session.run(tessera.PyStepIO({}, {}))
    assert raised.value.id == "tessera.config.125"


def test_the_documented_example_runs(monkeypatch, capsys):
    # docs/python.md's complete example, as written there.
    text = (SOURCE / "docs/python.md").read_text()
    example = text.split("## A complete example", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(SOURCE)
    scope = {}
    exec(compile(example, "docs/python.md", "exec"), scope)
    losses = [float(line.split()[1]) for line in capsys.readouterr().out.splitlines()]
    assert len(losses) == 10 and all(np.isfinite(losses))
    assert np.any(scope["weights"]["fc1.weight"] != 0)


def test_the_readme_example_runs(monkeypatch):
    text = (SOURCE / "README.md").read_text()
    example = text.split("## From Python", 1)[1].split("```python\n", 1)[1].split("```", 1)[0]
    monkeypatch.chdir(SOURCE)
    scope = {}
    exec(compile(example, "README.md", "exec"), scope)
    assert scope["anchors"]["loss"].shape == (2,) and np.all(scope["anchors"]["loss"] > 0)


def test_a_checkpoint_continues_training_where_it_stopped(tmp_path):
    x, labels = step_data(4, 2, 2, seed=9)

    def steps(session, first, last):
        anchors = session.initAnchorArrays()
        losses = []
        for step in range(first, last):
            session.run(tessera.PyStepIO({"x": x[step], "labels": labels[step]}, anchors))
            losses.append(anchors["loss"].tolist())
        return losses

    saving = training_session(2, 2)
    saving.prepareDevice()
    steps(saving, 0, 2)
    saving.saveCheckpoint(str(tmp_path / "mlp.safetensors"))
    expected = steps(saving, 2, 4)

    # Another replica count: checkpoints hold logical tensors.
    loading = training_session(1, 4)
    loading.prepareDevice()
    report = loading.loadCheckpoint(str(tmp_path / "mlp.safetensors"))
    assert report["step"] == 2 and report["learningRate"] == LEARNING_RATE
    # Other session options: one warning, classified.
    assert report["warningKinds"] == ["SessionOptions"] and len(report["warnings"]) == 1
    resumed = training_session(2, 2)
    resumed.prepareDevice()
    resumed.loadCheckpoint(str(tmp_path / "mlp.safetensors"))
    assert steps(resumed, 2, 4) == expected

    with pytest.raises(tessera.Error) as raised:
        resumed.loadCheckpoint(str(tmp_path / "missing.safetensors"))
    assert raised.value.id == "tessera.io.601"


def test_model_to_host_writes_the_trained_weights_into_the_onnx_model(tmp_path):
    x, labels = step_data(3, 2, 2, seed=11)
    trained = training_session(2, 2)
    trained.prepareDevice()
    anchors = trained.initAnchorArrays()
    for step in range(2):
        trained.run(tessera.PyStepIO({"x": x[step], "labels": labels[step]}, anchors))
    trained.modelToHost(tmp_path / "trained.onnx")
    trained.weightsToHost()
    want = {"fc1.weight": np.zeros((8, 6), np.float32), "fc1.bias": np.zeros((8,), np.float32),
            "fc2.weight": np.zeros((4, 8), np.float32), "fc2.bias": np.zeros((4,), np.float32)}
    trained.readWeights(tessera.PyWeightsIO(want))

    # A session of the written model starts from the trained weights and
    # takes the trained session's next step, bit for bit.
    reloaded = training_session(2, 2, model=tmp_path / "trained.onnx")
    reloaded.prepareDevice()
    got = {name: np.zeros_like(value) for name, value in want.items()}
    reloaded.readWeights(tessera.PyWeightsIO(got))
    for name in want:
        np.testing.assert_array_equal(got[name], want[name])
    reloaded_anchors = reloaded.initAnchorArrays()
    trained.run(tessera.PyStepIO({"x": x[2], "labels": labels[2]}, anchors))
    reloaded.run(tessera.PyStepIO({"x": x[2], "labels": labels[2]}, reloaded_anchors))
    np.testing.assert_array_equal(reloaded_anchors["loss"], anchors["loss"])

    # From bytes too; a folder that does not exist is an io error.
    from_bytes = training_session(1, 4, model=MODEL.read_bytes())
    from_bytes.prepareDevice()
    from_bytes.modelToHost(str(tmp_path / "initial.onnx"))
    assert (tmp_path / "initial.onnx").read_bytes() != b""
    with pytest.raises(tessera.Error) as raised:
        from_bytes.modelToHost(tmp_path / "missing" / "model.onnx")
    assert raised.value.id == "tessera.io.602"


def test_inputs_in_any_equivalent_dtype_and_layout_are_read():
    # A little-endian view (as np.frombuffer of a file gives) and a
    # strided array are the same inputs as their plain float32 copies.
    x, labels = step_data(1, 1, 4)
    plain = training_session(1, 4)
    plain.prepareDevice()
    expected = plain.initAnchorArrays()
    plain.run(tessera.PyStepIO({"x": x[0], "labels": labels[0]}, expected))

    other = training_session(1, 4)
    other.prepareDevice()
    anchors = other.initAnchorArrays()
    little = np.dtype(np.float32).newbyteorder("<")  # equivalent to np.float32, not the same object
    assert little is not np.dtype(np.float32)
    view = np.frombuffer(x[0].tobytes(), dtype=little).reshape(x[0].shape)
    strided = np.repeat(labels[0], 2)[::2]
    assert not strided.flags.c_contiguous
    other.run(tessera.PyStepIO({"x": view, "labels": strided}, anchors))
    assert float(anchors["loss"]) == float(expected["loss"])


def test_the_gil_is_released_while_the_device_runs_and_ctrl_c_stops_at_the_step_boundary():
    # With a switch interval of 1000 s the main thread gives the GIL up only
    # where it waits, so the helper thread runs before run() returns only if
    # run() releases the GIL while the device runs (a step of a large batch,
    # some 100 ms). Its simulated Ctrl-C then ends that step with
    # KeyboardInterrupt, raised by run() once the step is done (the anchors
    # are written). A helper that only got the GIL after run() returned (a
    # machine too busy to wake it in time) does nothing; that attempt is
    # repeated.
    batch = 2**18
    session = training_session(1, batch)
    session.prepareDevice()
    anchors = session.initAnchorArrays()
    x, labels = step_data(1, 1, batch)
    io = tessera.PyStepIO({"x": x[0], "labels": labels[0]}, anchors)
    for _ in range(3):
        anchors["loss"][...] = 0
        order = []
        running = [False]
        gate = threading.Lock()
        gate.acquire()

        def helper():
            with gate:
                if running[0]:
                    order.append("helper ran during run")
                    _thread.interrupt_main()
                else:
                    order.append("helper ran after run")

        thread = threading.Thread(target=helper)
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1000)
        try:
            thread.start()
            try:
                running[0] = True
                gate.release()
                session.run(io)
                running[0] = False
                order.append("run returned")
            except KeyboardInterrupt:
                running[0] = False
                order.append("interrupted")
        finally:
            sys.setswitchinterval(interval)
        thread.join()
        if order[0] == "helper ran during run":
            break
    assert order == ["helper ran during run", "interrupted"]
    assert float(anchors["loss"]) > 0


def test_numpy_scalars_are_numbers_in_settings():
    sgd = tessera.SGD({"defaultLearningRate": (np.float32(0.25), True), "defaultMomentum": np.float64(0.5)})
    assert sgd.learningRate == 0.25
    device = tessera.DeviceManager().createSimDevice({"numIPUs": np.int64(2), "tilesPerIPU": np.int32(1216)})
    assert device.numIpus == 2 and '"tilesPerIpu":1216' in repr(device)
    with pytest.raises(tessera.Error) as raised:
        tessera.SGD({"defaultLearningRate": object()})
    assert raised.value.id == "tessera.config.103"
    assert raised.value.path == "/optimizer/defaultLearningRate"
