"""tessera.SessionOptions and tessera.Error: every C++ field under its name,
nested settings written in place, the C++ validation's ids."""
import json
import os
import pathlib

import pytest
import tessera

SOURCE = pathlib.Path(os.environ.get("TESSERA_SOURCE_ROOT", pathlib.Path(__file__).parents[2]))


def leaves(document, prefix=()):
    """(path, value) of every leaf of a JSON document."""
    if isinstance(document, dict):
        for key, value in document.items():
            yield from leaves(value, prefix + (key,))
    else:
        yield prefix, document


def test_every_field_of_the_default_dump_is_an_attribute_with_its_default():
    # The golden dump of SessionOptions{} lists every field of the C++ struct.
    default = json.loads((SOURCE / "samples/configs/session_options.default.json").read_text())
    opts = tessera.SessionOptions()
    count = 0
    for path, value in leaves(default):
        node = opts
        for key in path:
            node = getattr(node, key)
        if isinstance(value, str):
            assert node.name == value, path
        else:
            assert node == value, path
        count += 1
    assert count > 40
    assert json.loads(opts.toJson()) == default


def test_nested_settings_are_written_in_place():
    opts = tessera.SessionOptions()
    opts.enableReplicatedGraphs = True
    opts.replicatedGraphCount = 4
    opts.weightTensorLocationSettings.location.replicatedTensorSharding = tessera.ReplicatedTensorSharding.On
    opts.weightTensorLocationSettings.location.storage = tessera.TensorStorage.OffChip
    opts.weightTensorLocationSettings.minElementsForOffChip = 0
    opts.weightTensorLocationSettings.location.shardingDomain = tessera.CommGroup(
        tessera.CommGroupType.Consecutive, 2)
    opts.optimizerStateTensorLocationSettings.location.shardingDomain.type = tessera.CommGroupType.Orthogonal
    opts.optimizerStateTensorLocationSettings.location.shardingDomain.replicaGroupSize = 2
    opts.accumulationAndReplicationReductionType = tessera.ReductionType.Mean
    opts.meanAccumulationAndReplicationReductionStrategy = tessera.MeanReductionStrategy.Running
    opts.automaticLossScalingSettings.enabled = True
    opts.tensorLocationSettingsOverride["fc1.weight"] = tessera.TensorLocation(tessera.TensorStorage.OffChip)

    dump = json.loads(opts.toJson())
    weight = dump["weightTensorLocationSettings"]
    assert weight["location"]["replicatedTensorSharding"] == "On"
    assert weight["location"]["storage"] == "OffChip"
    assert weight["minElementsForOffChip"] == 0
    assert weight["location"]["shardingDomain"] == {"type": "Consecutive", "replicaGroupSize": 2}
    assert dump["optimizerStateTensorLocationSettings"]["location"]["shardingDomain"] == {
        "type": "Orthogonal", "replicaGroupSize": 2}
    assert dump["accumulationAndReplicationReductionType"] == "Mean"
    assert dump["meanAccumulationAndReplicationReductionStrategy"] == "Running"
    assert dump["automaticLossScalingSettings"]["enabled"] is True
    assert dump["tensorLocationSettingsOverride"]["fc1.weight"]["storage"] == "OffChip"
    assert opts.getLocalReplicationFactor() == 4
    opts.validate()
    # The same options from their JSON compare equal.
    assert tessera.SessionOptions.fromJson(opts.toJson()) == opts


def test_enums_have_popart_names():
    assert [name for name in tessera.TensorStorage.__members__] == ["OnChip", "OffChip"]
    assert set(tessera.CommGroupType.__members__) == {"All", "Consecutive", "Orthogonal", "None", "Ungrouped"}
    assert tessera.CommGroupType.Ungrouped == getattr(tessera.CommGroupType, "None")
    assert set(tessera.ReductionType.__members__) == {"Sum", "Mean"}
    assert set(tessera.TileSet.__members__) == {"Compute", "IO"}
    assert set(tessera.RecomputationType.__members__) == {
        "None", "NoRecompute", "Standard", "NormOnly", "Pipeline", "RecomputeAll"}
    assert tessera.RecomputationType.NoRecompute == getattr(tessera.RecomputationType, "None")
    opts = tessera.SessionOptions()
    assert opts.autoRecomputation == tessera.RecomputationType.NoRecompute
    opts.autoRecomputation = tessera.RecomputationType.Standard
    assert json.loads(opts.toJson())["autoRecomputation"] == "Standard"
    assert list(tessera.VirtualGraphMode.__members__) == ["Off", "Manual", "Auto", "ExecutionPhases"]
    assert list(tessera.ExecutionPhaseIOSchedule.__members__) == ["Preload", "OnDemand"]
    assert list(tessera.ExecutionPhaseSchedule.__members__) == ["Interleaving", "Batch", "BatchClusteredIO"]
    assert opts.virtualGraphMode == tessera.VirtualGraphMode.Off
    opts.virtualGraphMode = tessera.VirtualGraphMode.Auto
    assert json.loads(opts.toJson())["virtualGraphMode"] == "Auto"
    assert opts.enablePipelining is False
    opts.enablePipelining = True
    assert json.loads(opts.toJson())["enablePipelining"] is True


@pytest.mark.parametrize("change, json_change, error_id, path", [
    (lambda o: setattr(o, "replicatedGraphCount", 2), {"replicatedGraphCount": 2},
     "tessera.config.110", "/sessionOptions/replicatedGraphCount"),
    (lambda o: setattr(o, "accumulationFactor", 4), {"accumulationFactor": 4},
     "tessera.config.111", "/sessionOptions/accumulationFactor"),
    (lambda o: setattr(o, "numIOTiles", 7), {"numIOTiles": 7},
     "tessera.config.119", "/sessionOptions/numIOTiles"),
    (lambda o: setattr(o, "autoRecomputation", tessera.RecomputationType.Pipeline),
     {"autoRecomputation": "Pipeline"}, "tessera.config.160", "/sessionOptions/autoRecomputation"),
    (lambda o: setattr(o, "virtualGraphMode", tessera.VirtualGraphMode.ExecutionPhases),
     {"virtualGraphMode": "ExecutionPhases"}, "tessera.config.191", "/sessionOptions/executionPhaseSettings/phases"),
    (lambda o: setattr(o.executionPhaseSettings, "phases", 2),
     {"executionPhaseSettings": {"phases": 2}}, "tessera.config.192", "/sessionOptions/executionPhaseSettings/phases"),
])
def test_validation_raises_the_json_paths_error(change, json_change, error_id, path):
    opts = tessera.SessionOptions()
    change(opts)
    with pytest.raises(tessera.Error) as raised:
        opts.validate()
    error = raised.value
    assert error.id == error_id
    assert error.path == path
    assert error.kind == "config"
    assert error.code == int(error_id.rsplit(".", 1)[1])
    assert str(error).startswith(f"[{error_id}] {path}: ")
    assert error.detail and error.detail in str(error)
    # The JSON path: the same document read and validated gives the same error.
    with pytest.raises(tessera.Error) as from_json:
        tessera.SessionOptions.fromJson(json.dumps(json_change)).validate()
    assert (from_json.value.id, from_json.value.path, str(from_json.value)) == (error.id, error.path, str(error))


def test_json_reading_errors_carry_ids():
    with pytest.raises(tessera.Error) as raised:
        tessera.SessionOptions.fromJson('{"replicatedGraphCont": 2}')
    assert raised.value.id == "tessera.config.104"
    assert raised.value.path == "/replicatedGraphCont"
    assert isinstance(raised.value, Exception)


def test_every_field_has_the_schemas_description_as_docstring():
    default = json.loads((SOURCE / "samples/configs/session_options.default.json").read_text())
    classes = {"": tessera.SessionOptions, "TensorLocationSettings": tessera.TensorLocationSettings,
               "location": tessera.TensorLocation, "shardingDomain": tessera.CommGroup,
               "automaticLossScalingSettings": tessera.AutomaticLossScalingSettings,
               "executionPhaseSettings": tessera.ExecutionPhaseSettings}
    count = 0
    for path, _ in leaves(default):
        for depth, key in enumerate(path):
            parent = path[depth - 1] if depth else ""
            parent = "TensorLocationSettings" if parent.endswith("TensorLocationSettings") else parent
            doc = getattr(classes[parent], key).__doc__
            assert doc and len(doc) > 20 and "(self" not in doc, (path, doc)
            count += 1
    assert count > 100
    assert "replicas" in tessera.SessionOptions.replicatedGraphCount.__doc__
    assert tessera.SessionOptions.__doc__ and tessera.TrainingSession.run.__doc__
