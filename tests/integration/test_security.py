"""SASL_SSL with SCRAM-SHA-512, docs/security.md's ACLs and secret hygiene, on a real broker.

The broker is our own (`KafkaCluster(..., security=ScramTls(...))`): its own folder and
free loopback ports, a certificate made by `stream_jobs/stack/secure.py`, SCRAM users
seeded at format time and the ACL authorizer on. It starts once for the module. Every
password is a canary, a unique string that must appear in no log record, error, CLI
output or broker log.
"""

from __future__ import annotations

import asyncio
import logging
import os
import shlex
import shutil
import tempfile
import traceback
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiokafka.protocol.admin import CreateAclsRequest
from pydantic import SecretStr

from stream_jobs.app import App
from stream_jobs.client import JobClient
from stream_jobs.context import JobContext
from stream_jobs.errors import AccessDenied, AuthenticationFailed, PermanentError
from stream_jobs.job_types import JobTypePolicy, load_job_types
from stream_jobs.kafka import TopicPartition
from stream_jobs.kafka.admin import admin_client
from stream_jobs.kafka.consumer import open_reader
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.topics import apply
from stream_jobs.settings import Settings
from stream_jobs.stack import KafkaCluster
from stream_jobs.stack.secure import ScramTls, make_tls_files

from .test_dev_stack import REPO, assert_one_line_error, free_port, run_cli

JOB_TYPE = "email.send"  # docs/security.md's example type: its ACL commands apply as written
USERS = ("admin", "email-worker", "web-app")
PASSWORDS = {user: f"canary{user.replace('-', '')}{uuid.uuid4().hex}" for user in USERS}
WRONG_PASSWORD = f"canarywrong{uuid.uuid4().hex}"
SECRETS = (*PASSWORDS.values(), WRONG_PASSWORD)

# Kafka's ACL enums (org.apache.kafka.common.acl / resource).
TOPIC, GROUP = 2, 3
LITERAL = 3
ALLOW = 3
OPERATIONS = {"Read": 3, "Write": 4, "Create": 5, "Delete": 6, "Alter": 7, "Describe": 8}


@dataclass(frozen=True)
class SecureBroker:
    cluster: KafkaCluster

    def settings(self, user: str, folder: Path, prefix: str, *,
                 password: str | None = None) -> Settings:
        return Settings(
            kafka_bootstrap=self.cluster.bootstrap,
            kafka_security_protocol="SASL_SSL",
            kafka_sasl_mechanism="SCRAM-SHA-512",
            kafka_sasl_username=user,
            kafka_sasl_password=SecretStr(password or PASSWORDS[user]),
            kafka_ssl_cafile=self.cluster.tls.ca_cert,
            topic_prefix=prefix,
            topics_dir=folder,
            kafka_request_timeout_ms=15_000,
        )

    def env(self, user: str, folder: Path, prefix: str, password: str) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("STREAM_JOBS_")}
        env.update(
            STREAM_JOBS_KAFKA_BOOTSTRAP=self.cluster.bootstrap,
            STREAM_JOBS_KAFKA_SECURITY_PROTOCOL="SASL_SSL",
            STREAM_JOBS_KAFKA_SASL_MECHANISM="SCRAM-SHA-512",
            STREAM_JOBS_KAFKA_SASL_USERNAME=user,
            STREAM_JOBS_KAFKA_SASL_PASSWORD=password,
            STREAM_JOBS_KAFKA_SSL_CAFILE=str(self.cluster.tls.ca_cert),
            STREAM_JOBS_TOPIC_PREFIX=prefix,
            STREAM_JOBS_TOPICS_DIR=str(folder),
        )
        return env


@pytest.fixture(scope="module")
def secure() -> Iterator[SecureBroker]:
    root = Path(tempfile.mkdtemp(prefix="stream-jobs-secure-test-"))
    settings = Settings(stack_dir=root, dev_kafka_port=free_port(span=3))
    security = ScramTls(users={u: SecretStr(p) for u, p in PASSWORDS.items()},
                        super_users=("admin",))
    cluster = KafkaCluster(settings, 1, security=security)
    try:
        cluster.up()
        yield SecureBroker(cluster)
    finally:
        cluster.down()
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def prefix() -> str:
    return f"s{uuid.uuid4().hex[:12]}"


def declare(folder: Path) -> dict[str, JobTypePolicy]:
    # The lanes and tiers the ACL commands of docs/security.md name.
    (folder / f"{JOB_TYPE}.toml").write_text(
        'partitions = 1\npriorities = ["high", "default", "low"]\n'
        'retry_tiers = ["5s", "1m", "10m"]\nmax_attempts = 3\n')
    return load_job_types(folder)


def documented_acls(prefix: str) -> list[tuple[int, str, str, int]]:
    """The ACLs the `acls --add` commands of docs/security.md grant: (resource type, name,
    principal, op)."""
    page = (REPO / "docs" / "security.md").read_text()
    lines = page.replace("\\\n", " ").splitlines()
    commands = [line for line in lines if line.startswith("acls --add ")]
    assert len(commands) >= 5, "docs/security.md lost its ACL commands"
    acls: list[tuple[int, str, str, int]] = []
    for line in commands:
        args = shlex.split(line.replace("$P", prefix).replace("$T", JOB_TYPE))[2:]
        principal, operations, resources = "", [], []
        for flag, value in zip(args[::2], args[1::2], strict=True):
            if flag == "--allow-principal":
                principal = value
            elif flag == "--operation":
                operations.append(OPERATIONS[value])
            elif flag in ("--topic", "--group"):
                resources.append((TOPIC if flag == "--topic" else GROUP, value))
            else:
                raise AssertionError(f"the test does not know {flag} in docs/security.md: {line}")
        assert principal, line
        assert operations, line
        assert resources, line
        acls += [(kind, name, principal, op) for kind, name in resources for op in operations]
    return acls


async def grant(admin: Settings, acls: list[tuple[int, str, str, int]]) -> None:
    async with admin_client(admin) as client:
        # aiokafka has no CreateAcls call of its own; its protocol has the request.
        responses = await asyncio.gather(*(
            client._send_request(CreateAclsRequest(kind, name, LITERAL, principal, "*", op,
                                                   ALLOW))
            for kind, name, principal, op in acls))
    for response in responses:
        [result] = response.to_object()["creation_responses"]
        assert result["error_code"] == 0, result


def assert_no_secret(*texts: str) -> None:
    for text in texts:
        for secret in SECRETS:
            assert secret not in text


def log_text(caplog: pytest.LogCaptureFixture) -> str:
    return "\n".join(f"{r.name} {r.getMessage()} {r.exc_text or ''}" for r in caplog.records)


async def test_client_and_worker_run_as_their_users_with_the_documented_acls(
    secure: SecureBroker, tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)  # aiokafka's connection and SASL logs included
    admin = secure.settings("admin", tmp_path, prefix)
    types = declare(tmp_path)
    await apply(admin, types)
    acls = documented_acls(prefix)
    assert {p for _, _, p, _ in acls} == {"User:email-worker", "User:web-app"}
    await grant(admin, acls)

    web = secure.settings("web-app", tmp_path, prefix)
    async with JobClient(web, types) as client:
        plain = [await client.enqueue(JOB_TYPE, {"n": i}, priority=lane)
                 for i, lane in enumerate(["default", "high", "low", "default"])]
        delayed = await client.enqueue(JOB_TYPE, {"n": 10}, delay=0.2)  # via tier retry-5s
        refused = await client.enqueue(JOB_TYPE, {"n": -1})

    app = App(secure.settings("email-worker", tmp_path, prefix))
    ran: dict[str, int] = {}

    @app.job(JOB_TYPE, concurrency=4)
    async def send(job: dict[str, Any], ctx: JobContext) -> None:
        ran[ctx.job_id] = job["n"]
        if job["n"] < 0:
            raise PermanentError("this address refuses mail")

    worker = app.worker(JOB_TYPE, report_interval_s=0.5)
    await worker.run(until_idle=True)
    assert set(ran) == {*plain, delayed, refused}
    assert worker.outcomes["succeeded"] == 5
    assert worker.outcomes["dead_lettered"] == 1
    assert worker.relay is not None
    assert worker.relay.released == 1  # read from the tier, written back to its lane
    # The documented ACLs cover all the worker does besides jobs: reports, the control topic.
    complaints = [r.getMessage() for r in caplog.records if r.name.startswith("stream_jobs")
                  and r.levelno >= logging.WARNING and "dead-lettered" not in r.getMessage()]
    assert complaints == []

    async with open_reader(admin) as consumer:  # the letter is in the DLQ, as the admin sees it
        dlq = TopicPartition(f"{prefix}.{JOB_TYPE}.dlq", 0)
        consumer.assign([dlq])
        records = (await consumer.getmany(dlq, timeout_ms=5_000)).get(dlq, [])
    assert [dict(r.headers)["sj-job-id"].decode() for r in records] == [refused]

    # The web app may enqueue, not work: its worker stops with one sentence, not a traceback.
    intruder = App(web)
    intruder.job(JOB_TYPE)(send)
    with pytest.raises(AccessDenied) as caught:
        await asyncio.wait_for(intruder.worker(JOB_TYPE, relay=False, control=False).run(), 30)
    message = str(caught.value)
    assert message.startswith("Kafka's ACLs do not let user 'web-app' "
                              "(STREAM_JOBS_KAFKA_SASL_USERNAME) read ")
    assert f"group {prefix}.{JOB_TYPE}.worker" in message
    assert_no_secret(log_text(caplog))


async def test_a_wrong_password_is_one_sentence_naming_the_user(
    secure: SecureBroker, tmp_path: Path, prefix: str, caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.DEBUG)
    wrong = secure.settings("web-app", tmp_path, prefix, password=WRONG_PASSWORD)
    types = declare(tmp_path)
    failures: list[AuthenticationFailed] = []
    with pytest.raises(AuthenticationFailed) as producer_error:
        async with JobProducer(wrong):
            pass
    failures.append(producer_error.value)
    with pytest.raises(AuthenticationFailed) as admin_error:
        await apply(wrong, types)
    failures.append(admin_error.value)
    with pytest.raises(AuthenticationFailed) as consumer_error:
        async with open_reader(wrong):
            pass
    failures.append(consumer_error.value)
    for failure in failures:
        message = str(failure)
        assert message.startswith(f"Kafka at {secure.cluster.bootstrap} refused the credentials "
                                  "of user 'web-app' (STREAM_JOBS_KAFKA_SASL_USERNAME")
        assert "STREAM_JOBS_KAFKA_SASL_PASSWORD" in message
        assert message.endswith(".")
        assert "\n" not in message
        assert_no_secret("".join(traceback.format_exception(failure)), repr(failure))
    assert_no_secret(log_text(caplog), repr(wrong), str(wrong), wrong.model_dump_json())

    result = run_cli("topics", "list",
                     env=secure.env("web-app", tmp_path, prefix, WRONG_PASSWORD))
    assert_one_line_error(result, "refused the credentials of user 'web-app'",
                          "STREAM_JOBS_KAFKA_SASL_PASSWORD")
    assert_no_secret(result.stdout, result.stderr)


async def test_a_certificate_from_another_ca_is_one_sentence(
    secure: SecureBroker, tmp_path: Path, prefix: str,
) -> None:
    stranger = make_tls_files(tmp_path / "other-ca")
    settings = secure.settings("web-app", tmp_path, prefix).model_copy(
        update={"kafka_ssl_cafile": stranger.ca_cert})
    with pytest.raises(AuthenticationFailed) as caught:
        async with JobProducer(settings):
            pass
    message = str(caught.value)
    assert "did not verify against the CA in STREAM_JOBS_KAFKA_SSL_CAFILE" in message
    assert str(stranger.ca_cert) in message
    assert message.endswith(".")


def test_the_cli_and_the_broker_log_never_show_a_password(
    secure: SecureBroker, tmp_path: Path, prefix: str,
) -> None:
    declare(tmp_path)
    result = run_cli("topics", "list",
                     env=secure.env("admin", tmp_path, prefix, PASSWORDS["admin"]))
    assert result.returncode == 0, result.stderr
    assert f"{prefix}.{JOB_TYPE}" in result.stdout
    assert_no_secret(result.stdout, result.stderr)
    node = secure.cluster.nodes[0]
    assert_no_secret(node.log_file.read_text(errors="replace"), node.config.read_text())
