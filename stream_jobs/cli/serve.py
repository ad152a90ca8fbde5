"""`stream-jobs serve`: the HTTP gateway, its dashboard and `/metrics` (uvicorn)."""

from __future__ import annotations

import logging

import typer
from rich.console import Console

from stream_jobs.app import load_app
from stream_jobs.cli.common import LogLevel, app, settings_of
from stream_jobs.errors import ConfigError

console = Console(stderr=True)


@app.command("serve")
def serve(
    ctx: typer.Context,
    host: str = typer.Option("127.0.0.1", "--host", envvar="STREAM_JOBS_GATEWAY_HOST",
                             help="Address to listen on."),
    port: int = typer.Option(8080, "--port", envvar="STREAM_JOBS_GATEWAY_PORT",
                             help="Port to listen on."),
    app_spec: str | None = typer.Option(
        None, "--app", metavar="MODULE:APP", envvar="STREAM_JOBS_GATEWAY_APP",
        help="An App whose handlers' payload models enqueue checks (422 when a payload "
        "does not fit)."),
    sample_interval: float | None = typer.Option(
        None, "--sample-interval", envvar="STREAM_JOBS_GATEWAY_SAMPLE_INTERVAL_S",
        help="Seconds between stats samples for /metrics and the dashboard (5)."),
    no_auth: bool = typer.Option(False, "--no-auth", help="Open every route without a token; "
                                 "only for a gateway nobody else can reach."),
    history: bool = typer.Option(False, "--history", envvar="STREAM_JOBS_GATEWAY_HISTORY",
                                 help="Run the history process inside the gateway (a single "
                                 "box; else run `stream-jobs history` on its own)."),
    log_level: LogLevel = typer.Option(
        LogLevel.INFO, "--log-level", envvar="STREAM_JOBS_LOG_LEVEL", case_sensitive=False,
        help="Log lines from this level up (any case), uvicorn's access lines among them."),
) -> None:
    """Serve the gateway: POST /jobs/{type}, job lookup, stats, the DLQ, /metrics and the
    dashboard at /. Write and operator routes need STREAM_JOBS_GATEWAY_TOKEN.

    It answers only to the Host names in STREAM_JOBS_GATEWAY_ALLOWED_HOSTS (default: the
    --host address, localhost, 127.0.0.1 and ::1) and believes X-Forwarded-Proto only
    from STREAM_JOBS_GATEWAY_TRUSTED_PROXIES (see docs/security.md)."""
    import uvicorn

    from stream_jobs.gateway import create_app

    settings = settings_of(ctx, gateway_sample_interval_s=sample_interval)
    if settings.gateway_token is None and not no_auth:
        raise ConfigError("Set STREAM_JOBS_GATEWAY_TOKEN (the bearer token of the write and "
                          "operator routes), or pass --no-auth for a gateway only you can reach.")
    models = {}
    if app_spec is not None:
        job_app = load_app(app_spec)
        job_app.use_settings(settings)
        models = job_app.models()
    logging.basicConfig(level=log_level.upper(),
                        format="%(asctime)s %(levelname)s %(name)s %(message)s")
    gateway = create_app(settings, models=models, require_token=not no_auth, host=host,
                         history=history)
    console.print(f"gateway on http://{host}:{port}/ (dashboard), /docs (API), /metrics; "
                  f"Kafka {settings.kafka_bootstrap}")
    # Access logs name method, path and status; never a header, so never the token.
    uvicorn.run(gateway, host=host, port=port, log_level=log_level.lower(),
                lifespan="on", proxy_headers=False, server_header=False)
