"""`stream-jobs db migrate` without a database: what its help names, and its one line."""

from __future__ import annotations

import re

import typer

from stream_jobs.cli import app
from stream_jobs.cli.db import migrated
from stream_jobs.postgres.migrate import Migration
from stream_jobs.postgres.schema import SCHEMA_OBJECTS, schema_ddl


def test_the_objects_listed_are_the_ones_the_ddl_creates() -> None:
    made = [re.match(r"\s*CREATE (?:TABLE|SEQUENCE) IF NOT EXISTS (\w+)", s)
            for s in schema_ddl()]
    assert sorted(m.group(1) for m in made if m) == sorted(SCHEMA_OBJECTS)


def test_the_help_names_every_table_and_sequence_it_creates() -> None:
    group = typer.main.get_command(app).commands["db"]  # type: ignore[attr-defined]
    text = " ".join(group.commands["migrate"].help.split())
    assert "Create the schema STREAM_JOBS_DATABASE_SCHEMA names if it is missing" in text
    assert f"It creates {', '.join(SCHEMA_OBJECTS)}." in text


def test_its_line_says_what_was_created_and_what_was_there() -> None:
    every = SCHEMA_OBJECTS
    assert migrated(Migration("mine", True, every, ())) == (
        f"created schema mine and in it {', '.join(every)}")
    assert migrated(Migration("public", False, (), every)) == (
        f"schema public is up to date ({len(every)} tables and sequences)")
    assert migrated(Migration("public", False, every[:1], every[1:])) == (
        f"schema public: created {every[0]}; {len(every) - 1} others were there already")
    assert migrated(Migration("public", False, every[1:], every[:1])).endswith(
        "; 1 other was there already")
