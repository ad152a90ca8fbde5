"""Per-tenant limits across the fleet on the real Postgres (stream_jobs/fairness/): three
worker processes asking at once never hold more than the tenant's concurrency and reach
it; their grants keep to the tenant's rate plus its burst; a SIGKILLed holder's slots come
back within the lease; `stream-jobs throttle T --tenant X RATE` reaches a running gate
within the bound docs/fairness.md states; a job costs the round trips the page says. Each
process is `tests.integration.tenant_gates`.
"""

from __future__ import annotations

import asyncio
import json
import os
import signal
import sys
import time
from pathlib import Path

import pytest

from stream_jobs.fairness.gate import TenantGate
from stream_jobs.fairness.limit_store import LimitStore
from stream_jobs.fairness.limits import OVERRIDE_REFRESH_S, bucket_capacity, slot_return_bound_s
from stream_jobs.job_types import load_job_types
from stream_jobs.postgres.migrate import migrate
from stream_jobs.settings import Settings
from stream_jobs.tenants import FairnessSpec
from tests.waiting import until

from .cli_env import settings_env

REPO = Path(__file__).resolve().parents[2]
STREAM_JOBS = Path(sys.executable).with_name("stream-jobs")
JOB_TYPE = "tenant.work"


@pytest.fixture
async def migrated(settings: Settings, schema: str) -> Settings:
    await migrate(settings)
    return settings


async def _processes(settings: Settings, tmp_path: Path, mode: str, count: int,
                     *args: str) -> list[list[object]]:
    """Run `count` gate processes in `mode` to their end; what each wrote."""
    start_at = time.time() + 3.0  # each has started (imports, pool) by then
    outs = [tmp_path / f"{mode}-{i}.json" for i in range(count)]
    procs = [await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.tenant_gates", mode, "--out", str(out),
        "--job-type", JOB_TYPE, "--start-at", str(start_at), *args, cwd=REPO,
        env=settings_env(settings, PYTHONPATH=str(REPO)),
        stderr=asyncio.subprocess.PIPE) for out in outs]
    for proc in procs:
        _, err = await asyncio.wait_for(proc.communicate(), 120)
        assert proc.returncode == 0, err.decode()
    return [json.loads(out.read_text()) for out in outs]


def _most_at_once(holds: list[tuple[int, int]]) -> int:
    # An end sorts before a start at the same instant: they did not overlap.
    events = sorted([(start, 1) for start, _ in holds] + [(end, -1) for _, end in holds])
    most = current = 0
    for _, step in events:
        current += step
        most = max(most, current)
    return most


async def test_three_processes_never_hold_more_than_the_tenants_concurrency(
        migrated: Settings, tmp_path: Path) -> None:
    limit = 10
    written = await _processes(migrated, tmp_path, "hold", 3, "--concurrency", str(limit),
                               "--loops", "8", "--seconds", "4", "--hold-ms", "20")
    holds = [(start, end) for out in written for start, end in out]  # type: ignore[misc]
    # 24 loops want a slot at every moment; 10 are there.
    assert _most_at_once(holds) == limit, (_most_at_once(holds), len(holds))
    assert all(len(out) > 50 for out in written), [len(out) for out in written]
    # Each process freed its slots at its stop.
    store = LimitStore(migrated)
    try:
        assert await store.held(JOB_TYPE) == {}
    finally:
        await store.close()


async def test_three_processes_keep_to_the_tenants_rate_plus_its_burst(
        migrated: Settings, tmp_path: Path) -> None:
    rate, seconds = 20.0, 4.0
    written = await _processes(migrated, tmp_path, "rate", 3, "--rate", f"{rate:g}",
                               "--loops", "4", "--seconds", f"{seconds:g}")
    grants = sorted((asked, answered) for out in written for asked, answered in out)  # type: ignore[misc]
    capacity = bucket_capacity(rate)
    # Every window of Postgres' clock holds at most rate * w + capacity grants. The grants
    # surely inside one are those whose ask and answer both are: from p's ask to q's answer.
    for p_asked, _ in grants:
        for _, q_answered in grants:
            if q_answered <= p_asked:
                continue
            inside = sum(1 for asked, answered in grants
                         if asked >= p_asked and answered <= q_answered)
            window_s = (q_answered - p_asked) / 1e9
            assert inside <= rate * window_s + capacity + 1e-6, (inside, window_s)
    # And the fleet gets its rate: every process asks, so the bucket never idles.
    assert len(grants) >= rate * seconds * 0.9, len(grants)
    assert all(written), [len(out) for out in written]


async def test_a_killed_holders_slots_come_back_within_the_lease(
        migrated: Settings, tmp_path: Path) -> None:
    ttl_s, limit = 2.0, 4
    keeper = await asyncio.create_subprocess_exec(
        sys.executable, "-m", "tests.integration.tenant_gates", "keep", "--out",
        str(tmp_path / "keeper.json"), "--job-type", JOB_TYPE, "--concurrency", str(limit),
        "--keep", str(limit), "--ttl", f"{ttl_s:g}", cwd=REPO,
        env=settings_env(migrated, PYTHONPATH=str(REPO)), stdout=asyncio.subprocess.PIPE)
    gate = TenantGate(migrated, JOB_TYPE, FairnessSpec(tenant_concurrency=limit), "survivor",
                      lease_ttl_s=ttl_s)
    await gate.start()
    try:
        assert keeper.stdout is not None
        line = await asyncio.wait_for(keeper.stdout.readline(), 60)
        assert line.decode().strip() == f"held {limit}"
        # Renewed, its slots outlive several leases while it lives.
        refused_until = time.monotonic() + 2 * ttl_s
        while time.monotonic() < refused_until:
            wait_s = await gate.acquire("acme")
            assert wait_s is not None
            assert wait_s > 0
            await asyncio.sleep(wait_s)
        os.kill(keeper.pid, signal.SIGKILL)
        killed = time.monotonic()
        await keeper.wait()
        granted = 0
        while granted < limit:  # asked as the dispatcher would: when the gate says
            wait_s = await gate.acquire("acme")
            if wait_s is None:
                granted += 1
            else:
                await asyncio.sleep(wait_s)
            assert time.monotonic() - killed < 30, "the killed holder's slots never came back"
        back_s = time.monotonic() - killed
        print(f"a killed holder's {limit} slots came back in {back_s:.2f} s (lease {ttl_s:g} s)")
        assert back_s <= slot_return_bound_s(ttl_s) + 0.5, back_s
        # Not before its lease lapsed: the last renewal was at most TTL/3 before the kill.
        assert back_s >= ttl_s * 2 / 3 - 0.1, back_s
    finally:
        if keeper.returncode is None:
            keeper.kill()
            await keeper.wait()
        await gate.stop()


async def _command(settings: Settings, *args: str) -> str:
    proc = await asyncio.create_subprocess_exec(
        str(STREAM_JOBS), *args, cwd=REPO, env=settings_env(settings, COLUMNS="200"),
        stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.PIPE)
    out, err = await asyncio.wait_for(proc.communicate(), 60)
    assert proc.returncode == 0, (args, out.decode(), err.decode())
    return out.decode()


async def test_throttle_with_a_tenant_reaches_a_running_gate_within_its_bound(
        migrated: Settings) -> None:
    (migrated.topics_dir / f"{JOB_TYPE}.toml").write_text(
        '[fairness]\ntenant_concurrency = 10\n[fairness.tenants.acme]\nrate = "100/s"\n')
    spec = load_job_types(migrated.topics_dir)[JOB_TYPE].fairness
    assert spec is not None
    gate = TenantGate(migrated, JOB_TYPE, spec, "watcher")
    await gate.start()
    try:
        # A tenant limited by the TOML: the next ask reads the new rate.
        out = await _command(migrated, "throttle", JOB_TYPE, "--tenant", "acme", "2/s")
        assert "100/s (toml) -> 2/s (throttle)" in out, out
        assert await gate.acquire("acme") is None
        wait_s = await gate.acquire("acme")
        assert wait_s is not None
        assert 0.3 < wait_s <= 0.5, wait_s
        await gate.release("acme")
        # A tenant no rate limited: the gate's loop learns it within a second.
        gate_free = TenantGate(migrated, JOB_TYPE, FairnessSpec(), "watcher-2")
        await gate_free.start()
        try:
            assert not gate_free.limited("beta")
            await _command(migrated, "throttle", JOB_TYPE, "--tenant", "beta", "5/s")
            took_s = await until(lambda: gate_free.limited("beta"), "beta limited", 5)
            assert took_s <= OVERRIDE_REFRESH_S + 0.5, took_s
            assert gate_free.rate_of("beta") == 5.0
            shown = await _command(migrated, "throttle", JOB_TYPE, "--tenants")
            assert "beta" in shown, shown
            assert "5/s (throttle)" in shown, shown
            await _command(migrated, "throttle", JOB_TYPE, "--tenant", "beta", "--reset")
            await until(lambda: not gate_free.limited("beta"), "beta back on the TOML", 5)
        finally:
            await gate_free.stop()
    finally:
        await gate.stop()


class CountingStore(LimitStore):
    """The store, counting its statements (each is one round trip to Postgres)."""

    statements = 0

    async def _run(self, method: str, what: str, statement: str, *args: object) -> object:
        self.statements += 1
        return await super()._run(method, what, statement, *args)


@pytest.mark.parametrize(("spec", "per_job"), [
    (FairnessSpec(tenant_concurrency=10, tenant_rate_per_s=1e6), 2),
    (FairnessSpec(tenant_concurrency=10), 2),
    (FairnessSpec(tenant_rate_per_s=1e6), 1),
])
async def test_a_job_costs_a_statement_to_start_and_one_to_end_if_it_holds_a_slot(
        migrated: Settings, spec: FairnessSpec, per_job: int) -> None:
    store = CountingStore(migrated)
    gate = TenantGate(migrated, JOB_TYPE, spec, "measured", store=store)
    await gate.start()
    try:
        assert await gate.acquire("acme") is None  # the first ask also makes the rows
        await gate.release("acme")
        jobs, took = 300, []
        before = store.statements
        for _ in range(jobs):
            started = time.perf_counter()
            assert await gate.acquire("acme") is None
            await gate.release("acme")
            took.append(time.perf_counter() - started)
        # The gate's loop may have read the operators' rates meanwhile: once a second.
        loop_reads = int(sum(took) / OVERRIDE_REFRESH_S) + 1
        assert jobs * per_job <= store.statements - before <= jobs * per_job + loop_reads
        took.sort()
        limits = f"concurrency {spec.tenant_concurrency}, rate {spec.tenant_rate_per_s}"
        print(f"{limits}: {per_job} round trips per job, {took[jobs // 2] * 1000:.2f} ms median, "
              f"{took[jobs * 99 // 100] * 1000:.2f} ms p99")
    finally:
        await gate.stop()
