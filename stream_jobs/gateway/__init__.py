"""The HTTP gateway: enqueue over HTTP, stats and DLQ routes, `/metrics`, the dashboard."""

from stream_jobs.gateway.app import create_app

__all__ = ["create_app"]
