"""topics/*.toml: loading, every refusal, normalisation, topic specs and the broker diff."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from stream_jobs.durations import parse_duration
from stream_jobs.errors import ConfigError, TopicPlanError, UnknownJobType
from stream_jobs.job_types import KNOWN_KEYS, JobTypePolicy, get_job_type, load_job_types
from stream_jobs.naming import TopicRef, parse_topic
from stream_jobs.topic_plan import Change, TopicState, desired_overrides, diff_policy

REPO_TOPICS = Path(__file__).resolve().parents[2] / "topics"


def write(directory: Path, name: str, text: str) -> Path:
    path = directory / name
    path.write_text(text)
    return path


def load_one(tmp_path: Path, text: str, name: str = "email.send.toml") -> JobTypePolicy:
    write(tmp_path, name, text)
    (policy,) = load_job_types(tmp_path).values()
    return policy


def refusal(tmp_path: Path, text: str, name: str = "email.send.toml") -> str:
    write(tmp_path, name, text)
    with pytest.raises(ConfigError) as caught:
        load_job_types(tmp_path)
    return str(caught.value)


# --- loading ------------------------------------------------------------------------------


def test_an_empty_file_declares_a_type_with_every_default(tmp_path: Path) -> None:
    policy = load_one(tmp_path, "")
    assert policy == JobTypePolicy("email.send")
    assert policy.job_type == "email.send"
    assert policy.partitions == 12
    assert policy.replication_factor == 1
    assert policy.retention_s == 7 * 86_400
    assert policy.retry_tiers == ("5s", "1m", "10m")
    assert policy.tier_delays_s == (5.0, 60.0, 600.0)
    assert policy.max_attempts == 4
    assert policy.priorities == ("default",)
    assert policy.expires_in_s is None
    assert policy.rate_limit_per_s is None
    assert policy.max_payload_bytes is None
    assert policy.source == str(tmp_path / "email.send.toml")


def test_every_key_is_read(tmp_path: Path) -> None:
    policy = load_one(tmp_path, """
        type = "mail.out"
        partitions = 6
        replication_factor = 3
        retention = "2d"
        retry_tiers = ["10s", "5m"]
        max_attempts = 7
        priorities = ["low", "default", "high"]
        expires_in = "1h"
        rate_limit = "50/m"
        max_payload_bytes = 65536
    """, name="anything.toml")
    assert policy == JobTypePolicy(
        "mail.out", partitions=6, replication_factor=3, retention_s=172_800.0,
        retry_tiers=("10s", "5m"), max_attempts=7, priorities=("high", "default", "low"),
        expires_in_s=3600.0, rate_limit_per_s=50 / 60, max_payload_bytes=65536,
    )


def test_bare_numbers_are_seconds(tmp_path: Path) -> None:
    policy = load_one(tmp_path, "retention = 86400\nretry_tiers = [5, 60]\nexpires_in = 30")
    assert policy.retention_s == 86_400
    assert policy.retry_tiers == ("5s", "1m")
    assert policy.expires_in_s == 30


def test_tier_names_are_normalised(tmp_path: Path) -> None:
    policy = load_one(tmp_path, 'retry_tiers = ["500ms", "60s", "600s", "3600s"]')
    assert policy.retry_tiers == ("500ms", "1m", "10m", "1h")
    assert policy.tier_topics("jobs") == {
        "500ms": "jobs.email.send.retry-500ms",
        "1m": "jobs.email.send.retry-1m",
        "10m": "jobs.email.send.retry-10m",
        "1h": "jobs.email.send.retry-1h",
    }


def test_the_repository_demo_types_load() -> None:
    types = load_job_types(REPO_TOPICS)
    assert {"email.send", "image.resize", "search.index"} <= set(types)
    email = types["email.send"]
    assert email.priorities == ("high", "default", "low")
    assert email.rate_limit_per_s == 200
    assert email.expires_in_s == 3600


# --- refusals -----------------------------------------------------------------------------


def test_an_unknown_key_is_named_with_its_file_and_the_known_keys(tmp_path: Path) -> None:
    message = refusal(tmp_path, "partitons = 6")
    assert message.startswith(f"{tmp_path / 'email.send.toml'}: unknown key 'partitons'")
    assert "did you mean 'partitions'?" in message
    assert "known keys are " + ", ".join(KNOWN_KEYS) in message


def test_a_table_is_an_unknown_key(tmp_path: Path) -> None:
    assert "unknown key 'worker'" in refusal(tmp_path, "[worker]\nconcurrency = 4")


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("partitions = 0", "'partitions' must be a whole number of 1 or more, not 0"),
        ("partitions = -3", "'partitions' must be a whole number of 1 or more, not -3"),
        ("partitions = 1.5", "'partitions' must be a whole number of 1 or more, not 1.5"),
        ("partitions = true", "'partitions' must be a whole number of 1 or more, not True"),
        ('partitions = "12"', "'partitions' must be a whole number of 1 or more, not '12'"),
        ("replication_factor = 0", "'replication_factor' must be a whole number of 1 or more"),
        ("max_attempts = 0", "'max_attempts' must be a whole number of 1 or more, not 0"),
        ("max_payload_bytes = 0", "'max_payload_bytes' must be a whole number of 1 or more"),
        ("max_payload_bytes = 3000000", "'max_payload_bytes' must be at most 2031616"),
        ('retention = "soon"', "'retention': 'soon' is not a duration"),
        ('retention = "0s"', "'retention' must be longer than zero"),
        ('retention = "5m"', "'retention' (5m) must be longer than the longest retry tier (10m)"),
        ("retention = [7]", "'retention' must be a duration such as '7d', not [7]"),
        ('expires_in = "0s"', "'expires_in' must be longer than zero"),
        ('expires_in = "later"', "'expires_in': 'later' is not a duration"),
        ('rate_limit = "fast"', "'rate_limit': 'fast' is not a rate"),
        ('rate_limit = "0/s"', "'rate_limit': '0/s' is not a positive rate"),
        ("rate_limit = 200", "'rate_limit' must be a rate such as '200/s', not 200"),
        ("retry_tiers = []", "'retry_tiers' needs at least one tier"),
        ('retry_tiers = "5s"', "'retry_tiers' must be a list such as"),
        ('retry_tiers = ["1m", "5s"]', "'retry_tiers' must be strictly increasing; 5s follows 1m"),
        ('retry_tiers = ["60s", "1m"]', "'retry_tiers' must be strictly increasing; 1m follows 1m"),
        ('retry_tiers = ["5s", "x"]', "'retry_tiers': 'x' is not a duration"),
        ('retry_tiers = ["0s"]', "'retry_tiers' has '0s': a tier is a whole number"),
        ('retry_tiers = ["1.5s"]', "'retry_tiers' has '1.5s': a tier is a whole number"),
        ('priorities = ["high"]', "'priorities' must include 'default'"),
        ('priorities = ["default", "urgent"]', "'priorities' has 'urgent'; lanes are high,"),
        ('priorities = ["default", "default"]', "'priorities' names 'default' twice"),
        ("priorities = [1]", "'priorities' must be a list such as"),
        ("type = 3", "'type' must be a string such as 'email.send'"),
        ('type = "Email"', "'type': 'Email' is not a job type name"),
        ('type = "a.dlq"', "'type': 'a.dlq' ends in 'dlq'"),
        ("partitions = ", "not valid TOML"),
    ],
)
def test_each_bad_value_names_the_file_the_key_and_the_problem(
    tmp_path: Path, text: str, expected: str
) -> None:
    message = refusal(tmp_path, text)
    assert message.startswith(f"{tmp_path / 'email.send.toml'}: ")
    assert expected in message
    assert "\n" not in message


def test_a_bad_file_name_is_refused(tmp_path: Path) -> None:
    message = refusal(tmp_path, "", name="Email Send.toml")
    assert "the file name: 'Email Send' is not a job type name" in message


def test_a_file_that_is_not_utf8_is_refused(tmp_path: Path) -> None:
    (tmp_path / "email.send.toml").write_bytes(b"partitions = 6 # \xff\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_job_types(tmp_path)


def test_a_type_declared_twice_is_refused(tmp_path: Path) -> None:
    write(tmp_path, "email.send.toml", "")
    write(tmp_path, "mail.toml", 'type = "email.send"')
    with pytest.raises(ConfigError, match=r"mail\.toml: job type 'email\.send' is already "
                                          r"declared in .*email\.send\.toml"):
        load_job_types(tmp_path)


def test_types_whose_topics_clash_in_kafka_are_refused(tmp_path: Path) -> None:
    # Kafka reads '.' and '_' alike when it checks topic names for collisions.
    write(tmp_path, "email.send.toml", "")
    write(tmp_path, "email_send.toml", "")
    with pytest.raises(ConfigError, match=r"Kafka treats '\.' and '_' alike"):
        load_job_types(tmp_path)


def test_a_missing_folder_says_how_to_declare_a_type(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match=r"does not exist: declare each job type in "
                                          r".*/<type>\.toml"):
        load_job_types(tmp_path / "nowhere")


def test_an_empty_folder_says_how_to_declare_a_type(tmp_path: Path) -> None:
    write(tmp_path, "README.md", "not a type")
    with pytest.raises(ConfigError, match=r"No job types in .*: declare each job type in "
                                          r".*email\.send\.toml"):
        load_job_types(tmp_path)


def test_an_unknown_type_says_where_to_declare_it(tmp_path: Path) -> None:
    types = {"email.send": JobTypePolicy("email.send")}
    assert get_job_type(types, "email.send") is types["email.send"]
    with pytest.raises(UnknownJobType) as caught:
        get_job_type(types, "sms.send")
    assert str(caught.value) == (
        "Unknown job type 'sms.send': declare it in topics/sms.send.toml and run "
        "`stream-jobs topics apply`."
    )


def test_a_policy_built_in_code_is_validated_too() -> None:
    assert JobTypePolicy("a", retry_tiers=("60s", "600s")).retry_tiers == ("1m", "10m")
    with pytest.raises(ConfigError, match="'partitions'"):
        JobTypePolicy("a", partitions=0)
    with pytest.raises(ConfigError, match="not a job type name"):
        JobTypePolicy("A")


def test_a_topic_name_longer_than_kafka_allows_is_refused() -> None:
    with pytest.raises(ConfigError, match="Kafka allows 249"):
        JobTypePolicy("a" * 240).all_topics("jobs")


# --- topics -------------------------------------------------------------------------------


def test_topics_follow_the_contract() -> None:
    policy = JobTypePolicy("email.send", partitions=6, priorities=("high", "default", "low"))
    assert policy.lane_topics("jobs") == {
        "high": "jobs.email.send.high",
        "default": "jobs.email.send",
        "low": "jobs.email.send.low",
    }
    assert policy.dlq_topic("jobs") == "jobs.email.send.dlq"
    assert [s.name for s in policy.all_topics("jobs")] == [
        "jobs.email.send.high", "jobs.email.send", "jobs.email.send.low",
        "jobs.email.send.retry-5s", "jobs.email.send.retry-1m", "jobs.email.send.retry-10m",
        "jobs.email.send.dlq",
    ]


def test_topic_configs() -> None:
    specs = {s.name: s for s in JobTypePolicy("a", partitions=6, retention_s=86_400)
             .all_topics("jobs")}
    for name in ("jobs.a", "jobs.a.retry-5s", "jobs.a.retry-1m", "jobs.a.retry-10m"):
        assert specs[name].configs == {"retention.ms": "86400000",
                                       "max.message.bytes": "2097152"}
    assert specs["jobs.a.dlq"].configs == {"retention.ms": "345600000",
                                           "max.message.bytes": "2097152"}
    assert {(s.partitions, s.replication_factor) for s in specs.values()} == {(6, 1)}
    assert [s.role for s in specs.values()] == ["lane", "tier", "tier", "tier", "dlq"]


def test_three_replicas_require_two_in_sync() -> None:
    for spec in JobTypePolicy("a", replication_factor=3).all_topics("jobs"):
        assert spec.configs["min.insync.replicas"] == "2"
        assert spec.replication_factor == 3
    for spec in JobTypePolicy("a", replication_factor=2).all_topics("jobs"):
        assert "min.insync.replicas" not in spec.configs


tier_seconds = st.lists(
    st.one_of(st.integers(1, 59), st.integers(1, 59).map(lambda m: m * 60),
              st.integers(1, 23).map(lambda h: h * 3600)),
    min_size=1, max_size=5, unique=True,
).map(sorted)
lanes = st.sets(st.sampled_from(["high", "low"])).map(lambda extra: ["default", *extra])


@given(tier_seconds, lanes, st.permutations(["high", "default", "low"]))
def test_every_valid_policy_gives_unique_topics_that_parse_back(
    seconds: list[int], lane_set: list[str], order: list[str]
) -> None:
    priorities = tuple(lane for lane in order if lane in lane_set)
    policy = JobTypePolicy("shop.order", retry_tiers=tuple(f"{s}s" for s in seconds),
                           priorities=priorities, retention_s=30 * 86_400)
    assert policy.tier_delays_s == tuple(float(s) for s in seconds)
    assert [parse_duration(t) for t in policy.retry_tiers] == seconds
    assert list(policy.priorities) == [lane for lane in ("high", "default", "low")
                                       if lane in lane_set]
    specs = policy.all_topics("p")
    assert len({s.name for s in specs}) == len(specs) == len(lane_set) + len(seconds) + 1
    for spec in specs:
        ref = parse_topic("p", spec.name)
        assert ref.job_type == "shop.order"
        assert ref.role == spec.role
        if ref.role == "tier":
            assert ref == TopicRef("shop.order", "tier", tier=ref.tier)
            assert ref.tier in policy.retry_tiers
        assert int(spec.configs["retention.ms"]) == (
            30 * 86_400_000 * (4 if spec.role == "dlq" else 1)
        )


@given(st.one_of(st.integers(1, 10_000), st.integers(1, 100).map(lambda m: m * 60)))
def test_tier_spellings_of_one_delay_normalise_alike(seconds: int) -> None:
    spellings = [f"{seconds}s", f"{seconds * 1000}ms"]
    if seconds % 60 == 0:
        spellings.append(f"{seconds // 60}m")
    names = {JobTypePolicy("a", retry_tiers=(t,), retention_s=10**6).retry_tiers for t in
             spellings}
    assert len(names) == 1


# --- diff against the broker --------------------------------------------------------------


def state_of(policy: JobTypePolicy, prefix: str = "jobs", **changes: object
             ) -> dict[str, TopicState]:
    states = {}
    for spec in policy.all_topics(prefix):
        fields: dict[str, object] = {
            "partitions": spec.partitions, "replication_factor": spec.replication_factor,
            "configs": dict(spec.configs), "overrides": dict(spec.configs),
        }
        fields.update(changes)
        states[spec.name] = TopicState(spec.name, **fields)  # type: ignore[arg-type]
    return states


def test_missing_topics_are_created() -> None:
    policy = JobTypePolicy("a", partitions=3)
    changes = diff_policy(policy, "jobs", {})
    assert [c.action for c in changes] == ["create"] * 5
    assert changes[0].topic == "jobs.a"
    assert "3 partitions" in changes[0].detail


def test_one_partition_is_written_singular() -> None:
    policy = JobTypePolicy("a", partitions=1)
    created = diff_policy(policy, "jobs", {})[0]
    assert created.detail.startswith("1 partition, replication factor")
    [ok] = [c for c in diff_policy(policy, "jobs", state_of(policy)) if c.topic == "jobs.a"]
    assert (ok.action, ok.detail) == ("ok", "1 partition")


def test_matching_topics_are_ok() -> None:
    policy = JobTypePolicy("a", partitions=3)
    assert {c.action for c in diff_policy(policy, "jobs", state_of(policy))} == {"ok"}


def test_more_partitions_are_added_and_configs_set() -> None:
    policy = JobTypePolicy("a", partitions=6)
    states = state_of(policy, partitions=3, configs={"retention.ms": "1",
                                                     "max.message.bytes": "2097152"})
    changes = diff_policy(policy, "jobs", states)
    assert Change("add-partitions", "jobs.a", changes[0].detail) == changes[0]
    assert changes[0].detail.startswith("3 -> 6 partitions")
    assert changes[1] == Change("set-config", "jobs.a", "retention.ms 1 -> 604800000")


def test_fewer_partitions_are_refused() -> None:
    policy = JobTypePolicy("x", partitions=6, source="topics/x.toml")
    with pytest.raises(TopicPlanError) as caught:
        diff_policy(policy, "jobs", state_of(policy, partitions=12))
    assert str(caught.value) == (
        "jobs.x has 12 partitions; topics/x.toml asks for 6: Kafka cannot shrink a topic "
        "without deleting its records (create a new type or keep 12)."
    )


def test_a_different_replication_factor_is_a_warning_not_a_change() -> None:
    policy = JobTypePolicy("a", replication_factor=1, source="topics/a.toml")
    changes = diff_policy(policy, "jobs", state_of(policy, replication_factor=3))
    assert [c.action for c in changes[:2]] == ["ok", "warn"]
    assert "never moves replicas" in changes[1].detail


def test_overrides_set_by_hand_are_kept() -> None:
    policy = JobTypePolicy("a")
    spec = policy.all_topics("jobs")[0]
    state = TopicState(spec.name, 12, 1, {"retention.ms": "5"},
                       {"retention.ms": "5", "segment.ms": "3600000"})
    assert desired_overrides(spec, state) == {**spec.configs, "segment.ms": "3600000"}


# --- flow control keys --------------------------------------------------------------------


def test_lane_weights_default_to_six_three_one_over_the_declared_lanes(tmp_path: Path) -> None:
    three = load_one(tmp_path, 'priorities = ["high", "default", "low"]')
    assert three.lane_weights == (("high", 6), ("default", 3), ("low", 1))
    assert JobTypePolicy("email.send").lane_weights == (("default", 3),)


def test_lane_weights_and_heartbeat_interval_are_read(tmp_path: Path) -> None:
    policy = load_one(tmp_path, """
        priorities = ["high", "default", "low"]
        lane_weights = {low = 2, high = 10}
        heartbeat_interval = "500ms"
    """)
    assert policy.lane_weights == (("high", 10), ("default", 3), ("low", 2))
    assert policy.lane_weight("low") == 2
    assert policy.heartbeat_interval_s == 0.5


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ('lane_weights = {high = 6}', "'lane_weights' weighs 'high', which 'priorities' does "
                                      "not declare (default)"),
        ('lane_weights = {urgent = 6}', "'lane_weights' has 'urgent'; lanes are high,"),
        ('lane_weights = {default = 0}', "'lane_weights.default' must be a whole number of 1"),
        ('lane_weights = {default = 1.5}', "'lane_weights.default' must be a whole number"),
        ('lane_weights = [6, 3, 1]', "'lane_weights' must be a table such as {high = 6"),
        ('heartbeat_interval = "10ms"', "'heartbeat_interval' must be at least 100ms"),
        ('heartbeat_interval = "often"', "'heartbeat_interval': 'often' is not a duration"),
    ],
)
def test_bad_flow_control_keys_are_refused(tmp_path: Path, text: str, expected: str) -> None:
    assert expected in refusal(tmp_path, text)


# --- redact -------------------------------------------------------------------------------


def test_redact_lists_payload_fields_dotted_into_nested_objects(tmp_path: Path) -> None:
    policy = load_one(tmp_path, 'redact = ["card_number", "customer.ssn"]')
    assert policy.redact == ("card_number", "customer.ssn")
    assert load_one(tmp_path, "").redact == ()


@pytest.mark.parametrize("value", ['"card_number"', '["card..number"]', '[""]', '[".ssn"]',
                                   '["ssn."]', '[1]', '{ card = true }'])
def test_a_bad_redact_is_refused_naming_the_file(tmp_path: Path, value: str) -> None:
    message = refusal(tmp_path, f"redact = {value}")
    assert "email.send.toml" in message
    assert "'redact' must be a list of field names" in message
