"""Which partition a record key belongs to, as every Kafka producer computes it.

Kafka's default partitioner takes murmur2 of the key bytes, clears the sign bit and
takes it modulo the partition count. A job written by `enqueue_many`, by `enqueue`, or
by a Java producer with the same key must land on the same partition, or jobs of one
key would lose their order; this module is that function, pure and fast enough to run
per job (the reading below unpacks the key's 4-byte words at once instead of byte by
byte).
"""

from __future__ import annotations

import struct
from functools import lru_cache

_SEED = 0x9747B28C
_M = 0x5BD1E995
_MASK = 0xFFFFFFFF


@lru_cache(maxsize=256)
def _words(count: int) -> struct.Struct:
    return struct.Struct(f"<{count}I")


def murmur2(data: bytes) -> int:
    """MurmurHash2 of `data` as Kafka computes it, as an unsigned 32-bit number."""
    length = len(data)
    h = _SEED ^ length
    count = length >> 2
    if count:
        for k in _words(count).unpack_from(data):
            k = (k * _M) & _MASK
            # One mask for the xor of two products: the bits above 32 fall off together.
            h = ((h * _M) ^ ((k ^ (k >> 24)) * _M)) & _MASK
    tail = length & 3
    if tail:
        base = length - tail
        if tail == 3:
            h ^= data[base + 2] << 16
        if tail >= 2:
            h ^= data[base + 1] << 8
        h = ((h ^ data[base]) * _M) & _MASK
    h ^= h >> 13
    h = (h * _M) & _MASK
    return h ^ (h >> 15)


def partition_for_key(key: bytes, partitions: int) -> int:
    """The partition, of `partitions`, that Kafka's default partitioner picks for `key`."""
    if partitions < 1:
        raise ValueError(f"a topic has at least one partition, not {partitions}")
    return (murmur2(key) & 0x7FFFFFFF) % partitions
