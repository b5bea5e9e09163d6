"""Real models against PyTorch (bench/zoo_accuracy.py): a BatchNorm CNN of
torchvision's zoo within 3x of PyTorch float32's error against float64 (the
largest of the equally accurate runs bench/zoo_accuracy.py describes), and
PyTorch's transformer encoder equal to PyTorch float32 for 24 steps and over
R = 2 x 4 with RTS and OffChip. The models are exported at test time, so the
test runs only where Debian's python3-torch, python3-torchvision and
python3-onnx are installed."""
import importlib
import os
import pathlib
import sys

import pytest

pytest.importorskip("torch")
pytest.importorskip("torchvision")
pytest.importorskip("onnx")

SOURCE = pathlib.Path(os.environ.get("TESSERA_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))

pytestmark = pytest.mark.skipif(not os.environ.get("TESSERA_PYTHON_REFERENCE"), reason="a build without ONNX support")


def zoo():
    """bench/zoo_accuracy.py, which imports bench/zoo_models.py beside it."""
    if str(SOURCE / "bench") not in sys.path:
        sys.path.insert(0, str(SOURCE / "bench"))
    return importlib.import_module("zoo_accuracy")


@pytest.mark.parametrize("name", ["mobilenet_v2", "transformer_encoder"])
def test_model_trains_as_pytorch(name):
    rows, failures = zoo().compare(name)
    assert rows
    assert failures == []
