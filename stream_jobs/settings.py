"""Settings: one model, read from `STREAM_JOBS_*` environment variables.

Every CLI option that names a setting is the same setting, so `--kafka-bootstrap` and
`STREAM_JOBS_KAFKA_BOOTSTRAP` are interchangeable. Units are in the names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, SecretStr, field_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from stream_jobs.errors import ConfigError

DEFAULT_KAFKA_PORT = 9092
# Below Linux's ephemeral port range (32768+), where a port can be taken for a while by
# an outgoing connection; each node also uses port + 1 (controller) and + 2 (secure).
DEFAULT_CLUSTER_PORTS = (19092, 19192, 19292)
DEFAULT_POSTGRES_PORT = 54320
# The collector's young-generation threshold while a worker runs (stream_jobs/runtime/gc_tuning.py).
YOUNG_THRESHOLD = 50_000

SecurityProtocol = Literal["PLAINTEXT", "SSL", "SASL_PLAINTEXT", "SASL_SSL"]
LogLevelName = Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"]
SaslMechanism = Literal["PLAIN", "SCRAM-SHA-256", "SCRAM-SHA-512"]


class Settings(BaseSettings):
    """What a client, a worker and the CLI need to find Kafka, Postgres and the job types."""

    model_config = SettingsConfigDict(env_prefix="STREAM_JOBS_", extra="ignore")

    kafka_bootstrap: str = f"127.0.0.1:{DEFAULT_KAFKA_PORT}"
    database_url: str = (
        f"postgresql://stream_jobs@127.0.0.1:{DEFAULT_POSTGRES_PORT}/stream_jobs"
    )
    # Where the long-lived LISTEN connections go (the cancel watch, the outbox relay's
    # wake-ups, result waits): the database_url when unset. Set it when database_url is a
    # pooler in transaction mode (PgBouncer), which cannot hold a LISTEN.
    database_listen_url: str | None = None
    database_schema: str = "public"
    topic_prefix: str = "jobs"
    topics_dir: Path = Path("topics")

    # Kafka security (used by the client, the worker and the admin commands alike).
    kafka_security_protocol: SecurityProtocol = "PLAINTEXT"
    kafka_sasl_mechanism: SaslMechanism | None = None
    kafka_sasl_username: str | None = None
    kafka_sasl_password: SecretStr | None = None
    kafka_ssl_cafile: Path | None = None
    kafka_ssl_certfile: Path | None = None
    kafka_ssl_keyfile: Path | None = None
    kafka_ssl_key_password: SecretStr | None = None

    kafka_request_timeout_ms: int = Field(default=30_000, gt=0)
    # 0: an awaited enqueue goes out at once (p50 0.7 ms here, against 7.4 ms at 5 ms);
    # enqueue_many batches anyway, since its records are queued before the first is sent.
    producer_linger_ms: int = Field(default=0, ge=0)
    producer_max_batch_bytes: int = Field(default=1_048_576, gt=0)
    max_payload_bytes: int = Field(default=1_048_576, gt=0)
    database_pool_size: int = Field(default=10, gt=0)
    # Group commit of ctx.once(): jobs share a transaction for up to dedup_linger_ms or
    # dedup_batch_max jobs (at most 60), each in its own savepoint
    # (stream_jobs/dedup/group_commit.py).
    # ctx.once_deferred() applies up to dedup_batch_max jobs per transaction, one transaction
    # at a time, without savepoints (stream_jobs/dedup/deferred.py).
    dedup_group_commit: bool = True
    dedup_batch_max: int = Field(default=500, gt=0)
    dedup_linger_ms: float = Field(default=3.0, ge=0)

    # The transactional outbox (stream_jobs/outbox/): every worker runs a relay that moves
    # committed rows of stream_jobs_outbox to Kafka (false: only `stream-jobs outbox relay`
    # does); rows per claim; and how often a relay looks without being woken by a NOTIFY
    # (rows a killed relay held, or ones whose retry is due).
    outbox_relay: bool = True
    outbox_batch_max: int = Field(default=500, gt=0, le=10_000)
    outbox_sweep_interval_s: float = Field(default=5.0, gt=0)

    # Results (docs/results.md): a handler's return value kept by `keep_result` is refused
    # over this size (the job fails; nothing is truncated). Batch members' and chain steps'
    # rows, which their batch's counters rest on, are kept at least workflow_keep_s.
    max_result_bytes: int = Field(default=1_048_576, gt=0)
    workflow_keep_s: float = Field(default=7 * 86_400.0, gt=0)
    # Cancels (docs/control.md): a worker keeps its type's cancelled job IDs in memory,
    # loaded at start and kept current by LISTEN/NOTIFY, and checks each job before it
    # starts. false: it does not listen, and a cancelled job is stopped only by its
    # ctx.once() claim meeting the cancel's dedup row.
    cancel_watch: bool = True

    # The collector's young-generation threshold while a worker runs: CPython's 700 cost a
    # deferred exactly-once worker a quarter of its CPU; 0 leaves it.
    worker_gc_young_threshold: int = Field(default=YOUNG_THRESHOLD, ge=0)

    # The HTTP gateway (`stream-jobs serve`): the bearer token of its write and operator
    # routes, request limits, and how often it samples stats for /metrics and the dashboard.
    gateway_token: SecretStr | None = None
    gateway_max_batch: int = Field(default=1000, gt=0)
    gateway_max_body_bytes: int = Field(default=16 * 1_048_576, gt=0)
    gateway_enqueue_timeout_s: float = Field(default=10.0, gt=0)
    gateway_retry_after_s: int = Field(default=5, gt=0)
    gateway_sample_interval_s: float = Field(default=5.0, gt=0)
    # The names the gateway answers to in the Host header, comma-separated ("*": any);
    # empty: the address it listens on, localhost, 127.0.0.1 and ::1 (gateway/origins.py).
    gateway_allowed_hosts: str = ""
    # The proxies (addresses, comma-separated, "*": any) whose X-Forwarded-Proto and
    # X-Forwarded-For the gateway believes; empty: none.
    gateway_trusted_proxies: str = ""
    # Prometheus metrics of a worker on this port (`worker --metrics-port`); 0: off.
    metrics_port: int = Field(default=0, ge=0, lt=65536)
    metrics_host: str = "127.0.0.1"

    # Periodic jobs (stream_jobs/schedules/): a scheduler that stops answering (paused,
    # frozen, cut off) loses its type's leadership after this long, and another takes over.
    scheduler_lease_s: float = Field(default=10.0, ge=1.0)

    # History (docs/history.md): workers count per slot of this many seconds, and the
    # history process keeps windows of it (a "minute", kept 7 days) and of 60 of it (an
    # "hour", kept 90 days). Workers and the history process must agree; 60 outside tests.
    history_window_s: int = Field(default=60, gt=0, le=3600)
    # Where `stream-jobs history` keeps faust-streaming's local files (its state itself is
    # in Kafka: the changelog topics).
    history_data_dir: Path = Path(".stream-jobs-history")

    # Log lines of the worker command: "text" (fields as key=value) or "json" (one object a
    # line); see stream_jobs/logs.py.
    log_format: Literal["text", "json"] = "text"

    # The Kafka driver's (aiokafka's) log lines from this level up (or the command's
    # --log-level, if higher), in any case: its INFO lines repeat a group's partitions
    # several times at each rebalance (1-2 KB each).
    kafka_log_level: LogLevelName = "WARNING"

    # Local development stack (`stream-jobs dev ...`).
    stack_dir: Path = Path(".stack")
    jars_cache_dir: Path = Path.home() / ".cache" / "stream-jobs"
    dev_kafka_port: int = Field(default=DEFAULT_KAFKA_PORT, gt=0, lt=65535)
    dev_postgres_port: int = Field(default=DEFAULT_POSTGRES_PORT, gt=0, lt=65536)
    # The dev broker's heap: 1 GiB, because test runs leave their topics behind and a broker
    # holding ~4,600 of them ran out of 512 MB (a development machine's broker, wiped by
    # `make clean`; a production broker is sized in docs/capacity.md).
    dev_kafka_heap_mb: int = Field(default=1024, ge=128)
    # The three-node cluster's client ports (each node's controller listens on port + 1);
    # STREAM_JOBS_DEV_CLUSTER_PORTS='[19192, 29192, 39192]' runs a second cluster beside it.
    dev_cluster_ports: tuple[int, int, int] = DEFAULT_CLUSTER_PORTS
    dev_postgres_os_user: str = "postgres"

    @field_validator("kafka_bootstrap")
    @classmethod
    def _bootstrap_has_ports(cls, value: str) -> str:
        servers = [s.strip() for s in value.split(",") if s.strip()]
        if not servers:
            raise ValueError("give at least one host:port")
        for server in servers:
            host, sep, port = server.rpartition(":")
            if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise ValueError(f"{server!r} is not host:port")
        return ",".join(servers)

    @field_validator("kafka_log_level", mode="before")
    @classmethod
    def _level_in_capitals(cls, value: object) -> object:
        return value.strip().upper() if isinstance(value, str) else value

    @field_validator("database_url", "database_listen_url")
    @classmethod
    def _dsn_is_postgres(cls, value: str | None) -> str | None:
        if value is not None and not value.startswith(("postgresql://", "postgres://")):
            raise ValueError("must start with postgresql://")
        return value

    @field_validator("topic_prefix")
    @classmethod
    def _prefix_is_a_topic_name(cls, value: str) -> str:
        allowed = set("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789._-")
        if not value or not set(value) <= allowed:
            raise ValueError("use letters, digits, '.', '_' and '-' only")
        return value

    @field_validator("database_schema")
    @classmethod
    def _schema_is_an_identifier(cls, value: str) -> str:
        if not value or not value.replace("_", "").isalnum() or value[0].isdigit():
            raise ValueError("use letters, digits and '_' only, not starting with a digit")
        return value

    @property
    def listen_url(self) -> str:
        """The DSN of the LISTEN connections: `database_listen_url`, else `database_url`."""
        return self.database_listen_url or self.database_url

    @property
    def bootstrap_servers(self) -> list[str]:
        return self.kafka_bootstrap.split(",")


def load_settings(**overrides: object) -> Settings:
    """Read settings from the environment, with explicit overrides winning.

    Raises `ConfigError` with one sentence per bad field instead of pydantic's report.
    """
    from pydantic import ValidationError

    clean = {k: v for k, v in overrides.items() if v is not None}
    try:
        return Settings(**clean)  # type: ignore[arg-type]
    except ValidationError as exc:
        problems = "; ".join(
            f"STREAM_JOBS_{'_'.join(str(p) for p in err['loc']).upper()}: {err['msg']}"
            for err in exc.errors()
        )
        raise ConfigError(f"Invalid settings: {problems}.") from exc
