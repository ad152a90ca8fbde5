"""The README's tour, without a stack: the two commands come first, its handler block names
`consumers/mail.py` (so the manual's test checks it is that file, and runs it), and its
`psql` line creates, in the reader's schema, the table that file writes to.

The tour itself runs as a test, commands and outputs, on the real stack (`pytest README.md`,
tests/docs/); tests/integration/test_tour.py runs the handler's three jobs."""

from __future__ import annotations

import re
from pathlib import Path

from consumers import mail
from tests.docs.samples import named_file

REPO = Path(__file__).resolve().parents[2]
README = REPO / "README.md"
FENCE = re.compile(r"^```(\w*)\n(.*?)^```$", re.MULTILINE | re.DOTALL)


def blocks(language: str) -> list[str]:
    return [body for lang, body in FENCE.findall(README.read_text()) if lang == language]


def test_the_tours_handler_block_names_consumers_mail_py() -> None:
    # The manual's test compares a block that names a file with the file; this keeps the
    # tour's handler block one of those.
    assert "consumers/mail.py" in [named_file(block) for block in blocks("python")]


def test_the_tour_creates_the_table_the_handler_writes_to_in_the_readers_schema() -> None:
    commands = "\n".join(blocks("bash")).replace("\\\n", " ")
    [psql] = [line for line in commands.splitlines() if "psql" in line]
    assert f'-c "{mail.SCHEMA}"' in psql
    # Without the schema on psql's search path the table lands in `public`, where the
    # worker (whose search path is the schema alone) does not look.
    assert 'PGOPTIONS="-c search_path=$STREAM_JOBS_DATABASE_SCHEMA"' in psql


def test_the_tour_migrates_before_it_enqueues() -> None:
    # `unique_key=` (step 3) writes to the outbox and keys tables `db migrate` creates.
    text = README.read_text()
    assert text.index("stream-jobs db migrate") < text.index("unique_key=\"welcome")


def test_the_two_commands_come_first() -> None:
    top = "\n".join(README.read_text().splitlines()[:40])
    assert "make demo" in top
    assert "make test" in top
