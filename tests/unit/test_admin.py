"""`Admin` asks a group's question again while its coordinator is moving (a fresh
cluster's first group question creates `__consumer_offsets`), and only then."""

from __future__ import annotations

from typing import Any

import pytest
from aiokafka.errors import (
    GroupAuthorizationFailedError,
    GroupCoordinatorNotAvailableError,
    GroupLoadInProgressError,
)
from aiokafka.structs import OffsetAndMetadata

from stream_jobs.errors import BrokerError
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import Admin, until_led

TP = TopicPartition("t.orders", 0)


class Described:
    def __init__(self, error_code: int, members: list[dict[str, Any]]) -> None:
        self._group = {"error_code": error_code, "members": members}

    def to_object(self) -> dict[str, Any]:
        return {"groups": [self._group]}


class Client:
    """Answers with each of `answers` in turn: an exception is raised, a value returned."""

    def __init__(self, *answers: Any) -> None:
        self.answers = list(answers)
        self.asked = 0

    def _next(self) -> Any:
        self.asked += 1
        answer = self.answers.pop(0)
        if isinstance(answer, BaseException):
            raise answer
        return answer

    async def list_consumer_group_offsets(self, group: str, partitions: Any = None) -> Any:
        return self._next()

    async def describe_consumer_groups(self, groups: list[str]) -> Any:
        return [self._next()]


async def test_offsets_are_asked_again_while_the_coordinator_is_not_there_yet() -> None:
    client = Client(GroupCoordinatorNotAvailableError(), GroupLoadInProgressError(),
                    {TP: OffsetAndMetadata(7, "")})
    assert await Admin(client).committed_offsets("g", [TP]) == {TP: 7}
    assert client.asked == 3


async def test_a_coordinator_that_never_comes_is_a_broker_error_after_the_patience() -> None:
    client = Client(*[GroupCoordinatorNotAvailableError() for _ in range(100)])
    with pytest.raises(BrokerError, match=r"offsets of group g.*Is the cluster healthy"):
        await Admin(client, patience_s=0.2).committed_offsets("g", [TP])
    assert 2 <= client.asked < 10


async def test_a_refusal_is_not_asked_again() -> None:
    client = Client(GroupAuthorizationFailedError(), {TP: OffsetAndMetadata(7, "")})
    with pytest.raises(BrokerError):
        await Admin(client).committed_offsets("g", [TP])
    assert client.asked == 1


async def test_a_described_group_whose_coordinator_loads_is_described_again() -> None:
    client = Client(Described(GroupLoadInProgressError.errno, []),
                    Described(0, [{"client_host": "/127.0.0.1"}]))
    assert await Admin(client).group_hosts("g") == ["127.0.0.1"]
    assert client.asked == 2


class LaggingMetadata:
    """describe_topics as a broker whose metadata lags the controller: the new topic is
    unknown, then leaderless, then led."""

    def __init__(self, answers: list[dict[str, Any]]) -> None:
        self.answers = answers
        self.asked = 0

    async def describe_topics(self, names: list[str]) -> list[dict[str, Any]]:
        answer = self.answers[min(self.asked, len(self.answers) - 1)]
        self.asked += 1
        return [{"topic": names[0], **answer}]


UNKNOWN = {"error_code": 3, "partitions": []}
LEADERLESS = {"error_code": 0, "partitions": [{"error_code": 5, "leader": -1}]}
LED = {"error_code": 0, "partitions": [{"error_code": 0, "leader": 1}]}


async def test_an_internal_topic_is_ready_only_once_it_has_a_leader() -> None:
    """`stream-jobs throttle` on a fresh prefix created P._control and its producer then
    found no such topic: created is not yet usable."""
    admin = LaggingMetadata([UNKNOWN, LEADERLESS, LED])
    await until_led(admin, "p._control", patience_s=5)
    assert admin.asked == 3


async def test_a_topic_never_led_is_a_broker_error() -> None:
    admin = LaggingMetadata([LEADERLESS])
    with pytest.raises(BrokerError, match="no leader"):
        await until_led(admin, "p._control", patience_s=0.2)
