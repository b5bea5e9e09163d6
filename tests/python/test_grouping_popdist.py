"""tessera.replica_grouping (PopXL's fields) and tessera.popdist."""
import pytest
import tessera


@pytest.mark.parametrize("replicas, stride, group_size, assignment, groups", [
    (8, 1, 2, [0, 0, 1, 1, 2, 2, 3, 3], [[0, 1], [2, 3], [4, 5], [6, 7]]),
    (8, 2, 4, [0, 1, 0, 1, 0, 1, 0, 1], [[0, 2, 4, 6], [1, 3, 5, 7]]),
    (8, 4, 2, [0, 1, 2, 3, 0, 1, 2, 3], [[0, 4], [1, 5], [2, 6], [3, 7]]),
    (4, 1, None, [0, 0, 0, 0], [[0, 1, 2, 3]]),
    (4, 1, 1, [0, 1, 2, 3], [[0], [1], [2], [3]]),
])
def test_replica_grouping_has_popxl_fields(replicas, stride, group_size, assignment, groups):
    grouping = tessera.replica_grouping(replicas, stride=stride, group_size=group_size)
    assert grouping.num_replicas == replicas
    assert grouping.stride == stride
    assert grouping.group_size == (group_size or replicas)
    assert grouping.num_groups == len(groups)
    assert grouping.assignment == assignment
    assert grouping.groups == groups


@pytest.mark.parametrize("args, error_id", [
    ((8, 3, 2), "tessera.config.141"),
    ((8, 1, 0), "tessera.config.140"),
    ((0, 1, 1), "tessera.config.140"),
    ((8, 2, None), "tessera.config.140"),
])
def test_replica_grouping_errors_carry_ids(args, error_id):
    with pytest.raises(tessera.Error) as raised:
        tessera.replica_grouping(*args)
    assert raised.value.id == error_id


POPDIST_VARIABLES = ["POPDIST_NUM_TOTAL_REPLICAS", "POPDIST_NUM_LOCAL_REPLICAS", "POPDIST_REPLICA_INDEX_OFFSET",
                     "POPDIST_NUM_IPUS_PER_REPLICA", "POPDIST_LOCAL_INSTANCE_INDEX", "OMPI_COMM_WORLD_SIZE",
                     "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_LOCAL_RANK"]


@pytest.fixture
def clean_env(monkeypatch):
    for name in POPDIST_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    return monkeypatch


def test_popdist_without_launcher(clean_env):
    assert tessera.popdist.isPopdistEnvSet() is False
    assert tessera.popdist.getNumInstances() == 1
    assert tessera.popdist.getInstanceIndex() == 0
    assert tessera.popdist.getNumTotalReplicas() == 1
    assert tessera.popdist.getNumLocalReplicas() == 1
    assert tessera.popdist.getReplicaIndexOffset() == 0


def test_popdist_reads_what_the_launcher_sets(clean_env):
    # Instance 2 of 4, two replicas each, as `tessera launch` describes it.
    clean_env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "8")
    clean_env.setenv("POPDIST_NUM_LOCAL_REPLICAS", "2")
    clean_env.setenv("POPDIST_REPLICA_INDEX_OFFSET", "4")
    clean_env.setenv("OMPI_COMM_WORLD_SIZE", "4")
    clean_env.setenv("OMPI_COMM_WORLD_RANK", "2")
    assert tessera.popdist.isPopdistEnvSet() is True
    assert tessera.popdist.getNumInstances() == 4
    assert tessera.popdist.getInstanceIndex() == 2
    assert tessera.popdist.getNumTotalReplicas() == 8
    assert tessera.popdist.getNumLocalReplicas() == 2
    assert tessera.popdist.getReplicaIndexOffset() == 4


def test_popdist_inconsistent_environment_is_an_error(clean_env):
    clean_env.setenv("POPDIST_NUM_TOTAL_REPLICAS", "6")
    clean_env.setenv("POPDIST_NUM_LOCAL_REPLICAS", "4")
    with pytest.raises(tessera.Error) as raised:
        tessera.popdist.getNumInstances()
    assert raised.value.id == "tessera.dist.501"
    assert raised.value.kind == "dist"
