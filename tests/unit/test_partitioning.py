"""Our partitioner must agree with Kafka's, byte for byte, or keyed jobs lose their order."""

from __future__ import annotations

import pytest
from aiokafka.partitioner import DefaultPartitioner
from aiokafka.partitioner import murmur2 as reference_murmur2
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.kafka.partitioning import murmur2, partition_for_key


@given(st.binary(max_size=200))
def test_murmur2_matches_the_reference_implementation(data: bytes) -> None:
    assert murmur2(data) == reference_murmur2(data)


@given(st.binary(min_size=1, max_size=80), st.integers(min_value=1, max_value=1000))
def test_partition_matches_the_default_partitioner(key: bytes, partitions: int) -> None:
    every = list(range(partitions))
    assert partition_for_key(key, partitions) == DefaultPartitioner()(key, every, every)


def test_known_values_from_the_java_client() -> None:
    # Kafka's UtilsTest: murmur2 of these strings, as signed Java ints.
    cases = {b"21": -973932308, b"foobar": -790332482, b"a-little-bit-long-string": -985981536,
             b"a-little-bit-longer-string": -1486304829,
             b"lkjh234lh9fiuh90y23oiuhsafujhadof229phr9h19h89h8": -58897971,
             b"abc": 479470107}
    for data, signed in cases.items():
        assert murmur2(data) == signed & 0xFFFFFFFF


def test_a_topic_without_partitions_is_refused() -> None:
    with pytest.raises(ValueError, match="at least one partition"):
        partition_for_key(b"k", 0)
