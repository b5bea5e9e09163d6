"""The Python samples: mnist_rts.py trains the same over R = 2 x 4 with RTS as
over R = 1 x 8, and replica_grouping.py prints PopXL's tables."""
import importlib.util
import io
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

SOURCE = pathlib.Path(os.environ.get("TESSERA_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))
SAMPLES = SOURCE / "samples/python"


def load(name):
    spec = importlib.util.spec_from_file_location(name, SAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.skipif(not os.environ.get("TESSERA_PYTHON_REFERENCE"), reason="a build without ONNX support")
def test_mnist_rts_replication_and_rts_train_alike():
    mnist_rts = load("mnist_rts")
    common = ["--dataset", "Synthetic", "--limit-train", "480", "--limit-test", "100", "--epochs", "2", "--seed", "3"]
    out = io.StringIO()
    one, accuracy_one = mnist_rts.train(mnist_rts.parse_args(common + ["--replication-factor", "1", "--batch-size", "8"]),
                                        out)
    two, accuracy_two = mnist_rts.train(
        mnist_rts.parse_args(common + ["--replication-factor", "2", "--batch-size", "4", "--rts"]), out)
    assert len(one) == len(two) == 2 * 60
    np.testing.assert_allclose(two, one, rtol=1e-5)
    assert abs(accuracy_two - accuracy_one) <= 0.01
    assert np.mean(one[-20:]) < np.mean(one[:20])  # it learns
    text = out.getvalue()
    assert "test accuracy" in text and "(100 samples, 2 replicas, rts on)" in text


@pytest.mark.skipif(not os.environ.get("TESSERA_PYTHON_REFERENCE"), reason="a build without ONNX support")
def test_mnist_rts_one_replica_rts_is_a_note_and_tests_every_sample():
    mnist_rts = load("mnist_rts")
    out = io.StringIO()
    args = mnist_rts.parse_args(["--dataset", "Synthetic", "--limit-train", "64", "--limit-test", "30",
                                 "--replication-factor", "1", "--rts", "--test-batch-size", "80"])
    _, accuracy = mnist_rts.train(args, out)
    text = out.getvalue()
    assert "shards nothing" in text
    assert "(30 samples, 1 replica, rts off)" in text
    assert 0.0 <= accuracy <= 1.0


def test_replica_grouping_tables():
    result = subprocess.run([sys.executable, str(SAMPLES / "replica_grouping.py")], capture_output=True, text=True,
                            check=True)
    lines = result.stdout.splitlines()
    assert "| 0 | 0, 1, 2, 3 |" in lines and "| 3 | 12, 13, 14, 15 |" in lines  # group_size 4
    assert "| 0 | 0, 4, 8, 12 |" in lines and "| 3 | 3, 7, 11, 15 |" in lines  # stride 4
    assert "| 15 | 15 |" in lines  # group_size 1
    assert lines[-1] == "stride=2, group_size=2 over 16 replicas: tessera.config.149"
