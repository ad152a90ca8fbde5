"""`/ui/types/{type}/tenants` in headless Chromium: a type with `[fairness]` whose jobs of
fourteen tenants wait in its lane and two in its overflow lane, with no worker: the top
ten tenants with exact counts and the rest as one row, open without a session like the
other figure pages, at 1280 and 390 px; the overview lists the overflow lane like a lane;
`/metrics` exports the tenants, at most ten by name and `other`."""

from __future__ import annotations

import time
from pathlib import Path

import httpx
from prometheus_client.parser import text_string_to_metric_families

from stream_jobs.job_ids import new_job_id
from stream_jobs.job_types import load_job_types
from stream_jobs.kafka.producer import JobProducer
from stream_jobs.kafka.topics import apply
from stream_jobs.naming import lane_topic, overflow_topic
from stream_jobs.record import JobRecord
from stream_jobs.settings import Settings
from tests.waiting import until

from .browser import chromium, fits, needs_chromium, new_page
from .served_gateway import serve_env, serving

FAIR = "pages.fair"
TOKEN = "tenant-pages-token-7a2d"


def _job(tenant: str | None) -> JobRecord:
    return JobRecord(job_id=new_job_id(), job_type=FAIR, payload=b"{}", key=None, attempt=1,
                     enqueued_at_ms=int(time.time() * 1000), tenant=tenant)


async def _fill(settings: Settings) -> None:
    (settings.topics_dir / f"{FAIR}.toml").write_text(
        "partitions = 2\n\n[fairness]\noverflow = true\n")
    await apply(settings, load_job_types(settings.topics_dir))
    lane = lane_topic(settings.topic_prefix, FAIR, "default")
    plan: dict[str | None, int] = {"acme": 7, "globex": 3, None: 2}
    plan.update({f"small-{n:02}": 1 for n in range(11)})
    async with JobProducer(settings) as producer:
        for tenant, count in plan.items():
            for _ in range(count):
                await producer.send(lane, _job(tenant))
        for _ in range(2):
            await producer.send(overflow_topic(settings.topic_prefix, FAIR), _job("acme"))


@needs_chromium
async def test_the_tenants_tab_shows_the_top_tenants_and_the_rest(
        settings: Settings, tmp_path: Path) -> None:
    await _fill(settings)
    env = serve_env(settings, settings.topics_dir, STREAM_JOBS_GATEWAY_TOKEN=TOKEN,
                    STREAM_JOBS_GATEWAY_SAMPLE_INTERVAL_S="0.3")
    with serving(env, tmp_path / "serve.log") as (port, _):
        base = f"http://127.0.0.1:{port}"
        async with httpx.AsyncClient(base_url=base, timeout=60) as http:
            opened = await http.get(f"/ui/types/{FAIR}/tenants")  # figures: no session
            assert opened.status_code == 200
            assert (await http.get("/ui/types/no.such/tenants")).status_code == 404

            families: dict[str, dict[str, float]] = {}

            async def sampled() -> bool:
                text = (await http.get("/metrics")).text
                families.clear()
                for family in text_string_to_metric_families(text):
                    if family.name.startswith("stream_jobs_tenant_"):
                        families[family.name] = {s.labels["tenant"]: s.value
                                                 for s in family.samples}
                return families.get("stream_jobs_tenant_waiting", {}).get("acme") == 7

            await until(sampled, "/metrics exports acme's 7 waiting jobs")
            waiting = families["stream_jobs_tenant_waiting"]
            assert len(waiting) == 11  # ten tenants by name, and other
            assert waiting["other"] == 4  # the four smallest of 14 tenants
            assert sum(waiting.values()) == 23
            assert families["stream_jobs_tenant_overflow"]["acme"] == 2

        async with chromium() as browser:
            page = await new_page(browser)
            await page.goto(f"{base}/ui/types/{FAIR}/tenants")
            acme = page.locator('tr[data-tenant="acme"]')
            assert await acme.get_attribute("data-waiting") == "7"
            assert await acme.get_attribute("data-overflow") == "2"
            nobody = page.locator('tr[data-tenant=""]')
            assert await nobody.get_attribute("data-waiting") == "2"
            assert await page.locator("tr[data-tenant]").count() == 10
            other = page.locator("tr[data-tenant-other]")
            assert await other.get_attribute("data-tenant-other") == "4"
            assert await other.get_attribute("data-waiting") == "4"
            assert await page.locator('[data-figure="waiting"]').inner_text() == "23"
            assert await page.locator('[data-figure="overflow"]').inner_text() == "2"
            assert await page.locator('[data-figure="tenants"]').inner_text() == "14"
            assert await page.locator('nav.tabs a[aria-current="page"]').inner_text() \
                == "Tenants"
            await fits(page, "dashboard-tenants")

            await page.goto(f"{base}/")  # the overflow lane beside the type's lanes
            assert await page.locator("td", has_text="overflow").count() >= 1
