"""The HTTP gateway against the real stack: enqueue (one, batch), every error status,
auth, job lookup, stats, the DLQ list and requeue, and the metrics of a worker and of
the gateway scraped while jobs run.

The gateway runs in-process (httpx over ASGI, with its lifespan); the worker too.
Nothing waits by sleeping: every wait polls a condition against a deadline.
"""

from __future__ import annotations

import asyncio
import logging
import re
import socket
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from pydantic import BaseModel, SecretStr

from stream_jobs.app import App
from stream_jobs.context import JobContext
from stream_jobs.errors import PermanentError
from stream_jobs.gateway import create_app
from stream_jobs.runtime.metrics import serve_metrics, worker_registry
from stream_jobs.settings import Settings
from tests.waiting import until

from .conftest import Declare

TOKEN = "gw-test-token-5f1c"
AUTH = {"Authorization": f"Bearer {TOKEN}"}


class Task(BaseModel):
    n: int
    fail: bool = False




@asynccontextmanager
async def served(app: FastAPI) -> AsyncIterator[httpx.AsyncClient]:
    async with app.router.lifespan_context(app), httpx.AsyncClient(
            transport=httpx.ASGITransport(app=app), base_url="http://localhost") as http:
        yield http


def metric(text: str, name: str, **labels: str) -> float | None:
    """The value of one series in Prometheus text, or None when it is absent."""
    for line in text.splitlines():
        match = re.fullmatch(r"([a-z_]+)(?:\{(.*)\})? (\S+)", line)
        if match is None or match.group(1) != name:
            continue
        found = dict(re.findall(r'(\w+)="([^"]*)"', match.group(2) or ""))
        if all(found.get(k) == v for k, v in labels.items()):
            return float(match.group(3))
    return None


def _gateway_settings(settings: Settings, **extra: Any) -> Settings:
    return settings.model_copy(update={"gateway_token": SecretStr(TOKEN), "gateway_max_batch": 5,
                                       "gateway_max_body_bytes": 64 * 1024,
                                       "max_payload_bytes": 2000,
                                       "gateway_sample_interval_s": 0.3, **extra})


async def test_enqueue_errors_lookup_dlq_and_metrics(settings: Settings, app: App,
                                                     declare: Declare,
                                                     caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO)
    await declare("gw.task", partitions=2, retry_tiers=["1s"], max_attempts=1,
                  priorities=["high", "default"])
    gw_settings = _gateway_settings(settings)
    gateway = create_app(gw_settings, models={"gw.task": Task})
    async with served(gateway) as http:
        # Auth: a clear 401 without the token or with another one; the token is never echoed.
        for headers in ({}, {"Authorization": "Bearer nope"}, {"Authorization": "Basic x"}):
            answer = await http.post("/jobs/gw.task", json={"payload": {"n": 1}},
                                     headers=headers)
            assert answer.status_code == 401, answer.text
            assert answer.headers["www-authenticate"] == "Bearer"
            assert "STREAM_JOBS_GATEWAY_TOKEN" in answer.json()["detail"]
            assert TOKEN not in answer.text
        for route in ("/dlq/gw.task", "/jobs/0190f3a2-7c1e-7b4a-9d2e-5f3c1a2b4c6d"):
            assert (await http.get(route)).status_code == 401

        # One job, then a batch: IDs come back once the broker has them.
        one = await http.post("/jobs/gw.task", json={"payload": {"n": 0}, "key": "k"},
                              headers=AUTH)
        assert one.status_code == 202, one.text
        batch = await http.post("/jobs/gw.task", headers=AUTH, json={"jobs": [
            {"payload": {"n": 1}, "priority": "high"},
            {"payload": {"n": 2, "fail": True}, "job_id": "gw-fails-1"},
            {"payload": {"n": 3, "fail": True}},
        ]})
        assert batch.status_code == 202, batch.text
        ids = one.json()["job_ids"] + batch.json()["job_ids"]
        assert len(set(ids)) == 4
        assert ids[2] == "gw-fails-1"

        # Every refusal, each before anything is sent.
        async def status(body: Any, job_type: str = "gw.task", **kw: Any) -> int:
            answer = await http.post(f"/jobs/{job_type}", headers=AUTH, json=body, **kw)
            assert answer.headers["content-type"] == "application/json", answer.text
            return answer.status_code

        assert await status({"payload": {"n": 1}}, "gw.nope") == 404
        assert await status({"payload": {"n": "x"}}) == 422  # does not fit the model
        assert await status({"payload": [1, 2]}) == 422  # not an object
        assert await status({"payload": {"n": 1}, "priority": "low"}) == 422  # no such lane
        assert await status({"payload": {"n": 1}, "delay_s": -1}) == 422
        assert await status({"payload": {"n": 1}, "surprise": 1}) == 422
        assert await status({"jobs": []}) == 422
        assert await status({"payload": {"n": 1, "pad": "x" * 3000}}) == 413  # one payload
        assert await status({"jobs": [{"payload": {"n": i}} for i in range(6)]}) == 413
        not_json = await http.post("/jobs/gw.task", content=b'{"payload": {"n": NaN}}',
                                   headers={**AUTH, "content-type": "application/json"})
        assert not_json.status_code == 422  # strict JSON: NaN would become null
        big = b'{"payload": {"n": 1, "pad": "' + b"x" * 70_000 + b'"}}'
        answer = await http.post("/jobs/gw.task", headers={**AUTH, "content-type":
                                                           "application/json"}, content=big)
        assert answer.status_code == 413
        assert "GATEWAY_MAX_BODY_BYTES" in answer.text

        async def streamed() -> AsyncIterator[bytes]:  # no Content-Length: counted as read
            for _ in range(20):
                yield b" " * 4096

        answer = await http.post("/jobs/gw.task", content=streamed(),
                                 headers={**AUTH, "content-type": "application/json"})
        assert answer.status_code == 413
        assert "GATEWAY_MAX_BODY_BYTES" in answer.text

        # Types and stats are open to read.
        types = (await http.get("/types")).json()
        assert [t["job_type"] for t in types] == ["gw.task"]
        assert types[0]["lanes"] == ["high", "default"]
        stats = await http.get("/types/gw.task/stats")
        assert stats.status_code == 200
        assert stats.json()["lag"] == 4
        assert (await http.get("/types/gw.nope/stats")).status_code == 404
        pending = (await http.get(f"/jobs/{ids[0]}", params={"type": "gw.task"},
                                  headers=AUTH)).json()
        assert pending["status"] == "pending", pending

        # A worker with metrics runs them; its counts are scraped while it runs.
        @app.job("gw.task", concurrency=8)
        async def run_task(job: Task, ctx: JobContext) -> None:
            if job.fail and ctx.attempt == 1:
                raise PermanentError("asked to fail")
            async with ctx.once():
                pass

        worker = app.worker("gw.task", report_interval_s=0.3)
        server = await serve_metrics(worker_registry(worker), "127.0.0.1", 0)
        port = server.sockets[0].getsockname()[1]
        running = asyncio.create_task(worker.run())
        try:
            async with httpx.AsyncClient(base_url=f"http://127.0.0.1:{port}") as scrape:
                async def worker_counted() -> bool:
                    text = (await scrape.get("/metrics")).text
                    return (metric(text, "stream_jobs_jobs_total", type="gw.task",
                                   outcome="succeeded") == 2
                            and metric(text, "stream_jobs_jobs_total", type="gw.task",
                                       outcome="dead_lettered") == 2)

                await until(worker_counted, "the worker's metrics to count 2 + 2 jobs")
                text = (await scrape.get("/metrics")).text
                assert metric(text, "stream_jobs_handler_duration_seconds_count",
                              type="gw.task") == 4
                assert metric(text, "stream_jobs_dead_letters_total", type="gw.task",
                              reason="permanent") == 2
                assert metric(text, "stream_jobs_worker_in_flight", type="gw.task") is not None

            async def gateway_sampled() -> bool:
                text = (await http.get("/metrics")).text
                return (metric(text, "stream_jobs_dlq_depth", type="gw.task") == 2
                        and metric(text, "stream_jobs_lag", type="gw.task", lane="default") == 0
                        and metric(text, "stream_jobs_lag", type="gw.task", lane="high") == 0
                        and metric(text, "stream_jobs_workers_alive", type="gw.task") == 1)

            await until(gateway_sampled, "the gateway's metrics to show the DLQ and no lag")
            text = (await http.get("/metrics")).text
            assert metric(text, "stream_jobs_gateway_enqueued_total", type="gw.task") == 4
            assert metric(text, "stream_jobs_gateway_requests_total", route="/jobs/{type}",
                          status="202") == 2

            # Lookup: done (dedup row) and dead-lettered.
            done = (await http.get(f"/jobs/{ids[0]}", headers=AUTH)).json()
            assert done["status"] == "done", done
            dead = (await http.get("/jobs/gw-fails-1", params={"type": "gw.task"},
                                   headers=AUTH)).json()
            assert dead["status"] == "dead_lettered", dead

            # The DLQ: list, then requeue one by ID; it runs again (attempt 2) and is done.
            listing = (await http.get("/dlq/gw.task", headers=AUTH)).json()
            assert listing["letters"] == 2
            assert listing["reasons"] == {"permanent": 2}
            assert {r["job_id"] for r in listing["rows"]} == {ids[2], ids[3]}
            assert (await http.get("/dlq/gw.nope", headers=AUTH)).status_code == 404
            both = await http.post("/dlq/gw.task/requeue", headers=AUTH,
                                   json={"ids": ["x"], "all": True})
            assert both.status_code == 422
            missing = await http.post("/dlq/gw.task/requeue", headers=AUTH,
                                      json={"ids": ["no-such-letter"]})
            assert missing.status_code == 404
            assert "no-such-letter" in missing.text
            requeued = await http.post("/dlq/gw.task/requeue", headers=AUTH,
                                       json={"ids": ["gw-fails-1"]})
            assert requeued.status_code == 200, requeued.text
            assert requeued.json()["requeued"] == 1
            assert requeued.json()["lanes"] == {"default": 1}

            async def requeued_done() -> bool:
                found = (await http.get("/jobs/gw-fails-1", params={"type": "gw.task"},
                                        headers=AUTH)).json()
                return bool(found["status"] == "done")

            await until(requeued_done, "the requeued job to run and be done")
        finally:
            worker.request_stop()
            await running
            server.close()
    assert TOKEN not in caplog.text


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


async def test_broker_unreachable_is_503_with_retry_after(settings: Settings,
                                                          declare: Declare) -> None:
    await declare("gw.down")
    down = _gateway_settings(settings, kafka_bootstrap=f"127.0.0.1:{_closed_port()}",
                             gateway_retry_after_s=7)
    gateway = create_app(down, sample=False)
    async with served(gateway) as http:  # starts although no broker answers
        answer = await http.post("/jobs/gw.down", json={"payload": {"n": 1}}, headers=AUTH)
        assert answer.status_code == 503, answer.text
        assert answer.headers["retry-after"] == "7"
        assert "STREAM_JOBS_KAFKA_BOOTSTRAP" in answer.json()["detail"]
        stats = await http.get("/types/gw.down/stats")
        assert stats.status_code == 503
        assert stats.headers["retry-after"] == "7"
        # Unknown types are still told apart from a broker that is down.
        assert (await http.post("/jobs/gw.nope", json={"payload": {}},
                                headers=AUTH)).status_code == 404
