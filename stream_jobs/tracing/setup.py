"""Turn tracing on from the standard `OTEL_*` environment, at a process's start.

`configure_from_env()` is what the `stream-jobs` command runs first. It sets up the
OpenTelemetry SDK (`pip install 'stream-jobs[otel]'`) when `OTEL_TRACES_EXPORTER` names
exporters, with nothing else to write:

- `OTEL_TRACES_EXPORTER=console` prints spans (on stderr); `otlp` sends them to a collector
  (`OTEL_EXPORTER_OTLP_ENDPOINT`, over `http/protobuf`, or `grpc` by
  `OTEL_EXPORTER_OTLP_PROTOCOL` when that exporter is installed); any exporter an installed
  package registers under its name works too; `none` (or unset) traces nothing.
- `OTEL_SERVICE_NAME`, `OTEL_RESOURCE_ATTRIBUTES`, `OTEL_TRACES_SAMPLER`, `OTEL_BSP_*`
  and `OTEL_SDK_DISABLED` mean what the SDK says they mean; the service is `stream-jobs`
  when nothing names it.

An application that set up its own tracer provider keeps it: nothing is changed then. An
exporter asked for while the SDK (or that exporter) is not installed gets one warning that
says what to install, and the process runs on untraced.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Mapping
from importlib import import_module
from importlib.metadata import entry_points
from typing import Any

from opentelemetry import trace

log = logging.getLogger("stream_jobs.tracing")

EXPORTERS_GROUP = "opentelemetry_traces_exporter"
DEFAULT_SERVICE = "stream-jobs"
# `otlp` is the OTLP exporter of the protocol asked for (http/protobuf by default, as the
# specification says); the SDK's packages register them under these names.
_OTLP_BY_PROTOCOL = {"http/protobuf": "otlp_proto_http", "grpc": "otlp_proto_grpc"}
_INSTALL = "install the SDK with `pip install 'stream-jobs[otel]'`"


def exporter_names(env: Mapping[str, str]) -> list[str]:
    """The exporters `env` asks for, each by the name its package registers, in order;
    empty when tracing is not asked for (`OTEL_TRACES_EXPORTER` unset or `none`, or
    `OTEL_SDK_DISABLED=true`). Pure."""
    if env.get("OTEL_SDK_DISABLED", "").strip().lower() == "true":
        return []
    asked = [name.strip().lower() for name in env.get("OTEL_TRACES_EXPORTER", "").split(",")]
    if "none" in asked:
        return []
    protocol = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL")
                or env.get("OTEL_EXPORTER_OTLP_PROTOCOL") or "http/protobuf").strip().lower()
    names: list[str] = []
    for name in asked:
        if name == "otlp":
            name = _OTLP_BY_PROTOCOL.get(protocol, f"otlp ({protocol})")
        if name and name not in names:
            names.append(name)
    return names


def configure_from_env(env: Mapping[str, str] | None = None) -> bool:
    """Set the process's tracer provider from `env` (the process's environment); whether
    one was set. Warns once, and sets nothing, when what is asked for is not installed."""
    env = os.environ if env is None else env
    names = exporter_names(env)
    if not names or _provider_set():
        return False
    try:
        sdk_trace: Any = import_module("opentelemetry.sdk.trace")
        export: Any = import_module("opentelemetry.sdk.trace.export")
        resources: Any = import_module("opentelemetry.sdk.resources")
    except ImportError:
        log.warning("OTEL_TRACES_EXPORTER=%s asks for traces, but the OpenTelemetry SDK is "
                    "not installed: %s. Running without traces.",
                    env.get("OTEL_TRACES_EXPORTER"), _INSTALL)
        return False
    exporters = [exporter for exporter in map(_exporter, names) if exporter is not None]
    if not exporters:
        return False
    # The SDK reads OTEL_SERVICE_NAME and OTEL_RESOURCE_ATTRIBUTES from the process's
    # environment itself; a name in `env` wins.
    named = {"service.name": env["OTEL_SERVICE_NAME"]} if env.get("OTEL_SERVICE_NAME") else {}
    resource = resources.Resource.create(named)
    if str(resource.attributes.get("service.name", "")).startswith("unknown_service"):
        resource = resource.merge(resources.Resource({"service.name": DEFAULT_SERVICE}))
    provider = sdk_trace.TracerProvider(resource=resource)
    for exporter in exporters:
        provider.add_span_processor(export.BatchSpanProcessor(exporter))
    trace.set_tracer_provider(provider)
    return True


def _provider_set() -> bool:
    return not isinstance(trace.get_tracer_provider(),
                          trace.ProxyTracerProvider | trace.NoOpTracerProvider)


def _exporter(name: str) -> Any:
    found = entry_points(group=EXPORTERS_GROUP, name=name)
    if not found:
        log.warning("OTEL_TRACES_EXPORTER asks for the %r exporter, which no installed "
                    "package provides (for otlp: %s); spans go to the other exporters "
                    "asked for, if any.", name, _INSTALL)
        return None
    exporter_class = next(iter(found)).load()
    if name == "console":
        # On stderr, beside the logs: a command's stdout is its answer (`id=$(stream-jobs
        # enqueue ...)` must read the job ID, not spans).
        return exporter_class(out=sys.stderr)
    return exporter_class()


__all__ = ["configure_from_env", "exporter_names"]
