"""The tools' short questions to Postgres (`stream_jobs.postgres.questions`): an unmigrated
schema and a Postgres that does not answer are each one clear error, naming the fix."""

from __future__ import annotations

import pytest

from stream_jobs.errors import ConfigError, DatabaseUnavailable
from stream_jobs.outbox.depth import read_depth
from stream_jobs.settings import Settings
from stream_jobs.workflows.progress import read_progress

pytestmark = pytest.mark.integration


async def test_an_unmigrated_schema_names_the_migration(settings: Settings) -> None:
    # The test's schema exists, but nothing was migrated into it.
    with pytest.raises(ConfigError, match=r"no outbox table in schema .*stream-jobs db migrate"):
        await read_depth(settings)
    with pytest.raises(ConfigError, match=r"no workflow tables in schema .*db migrate"):
        await read_progress(settings, "some-batch")


async def test_a_postgres_that_does_not_answer_is_named_without_its_password(
        settings: Settings) -> None:
    away = settings.model_copy(update={"database_url": "postgresql://u:secret@127.0.0.1:1/nothing"})
    with pytest.raises(DatabaseUnavailable, match="did not answer at") as caught:
        await read_depth(away)
    assert "secret" not in str(caught.value)
