"""A gateway whose Postgres does not answer says so on its pages and JSON routes without
showing the database password, whichever form the URL carries it in."""

from __future__ import annotations

import socket

import pytest

from stream_jobs.gateway import create_app
from stream_jobs.settings import Settings

from .conftest import Declare
from .test_gateway import AUTH, _gateway_settings, served

CANARY = "hunter2-canary"
SCHEDULE = '\n[[schedules]]\nname = "beat"\nevery = "1h"\npayload = {}\n'


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize("form", ["query", "userinfo"])
async def test_an_unreachable_database_is_reported_without_its_password(
        settings: Settings, declare: Declare, form: str) -> None:
    await declare("gw.secret")
    with (settings.topics_dir / "gw.secret.toml").open("a") as toml:
        toml.write(SCHEDULE)  # the overview reads schedules from Postgres
    port = _closed_port()
    url = (f"postgresql://stream_jobs@127.0.0.1:{port}/x?password={CANARY}" if form == "query"
           else f"postgresql://stream_jobs:{CANARY}@127.0.0.1:{port}/x")
    gateway = create_app(_gateway_settings(settings, database_url=url))
    async with served(gateway) as http:
        await gateway.state.gateway.sampler.sampled.wait()
        shown = {
            "overview": await http.get("/"),
            "healthz": await http.get("/healthz"),
            "stats": await http.get("/types/gw.secret/stats"),
            "job": await http.get("/jobs/no-such-job?type=gw.secret", headers=AUTH),
            "cancel": await http.post("/jobs/no-such-job/cancel", headers=AUTH),
        }
    overview = shown["overview"].text
    # The problem and the URL are shown, only the password is not.
    assert f"127.0.0.1:{port}" in overview, overview
    assert f"127.0.0.1:{port}" in shown["cancel"].text
    for route, answer in shown.items():
        assert CANARY not in answer.text, (route, answer.text)
