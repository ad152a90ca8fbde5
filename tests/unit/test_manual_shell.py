"""How the manual's shell blocks are read (tests/docs/shell.py), without a stack: the
commands of a bash block, the steps of a console block, what a shown output matches, which
commands run until stopped, and the page's own corner of the stack."""

from __future__ import annotations

import pytest

from tests.docs.shell import (
    Step,
    bash_steps,
    commands,
    console_steps,
    interrupted,
    matches,
    pattern_of,
    placed,
    ready_line,
    runs_until_stopped,
)


def test_a_bash_block_is_its_commands_in_order_comments_and_blank_lines_skipped() -> None:
    source = ("# make the topics\n"
              "stream-jobs topics apply     # never deletes\n"
              "\n"
              "stream-jobs db migrate\n")
    assert list(commands(source)) == [(1, "stream-jobs topics apply     # never deletes"),
                                      (3, "stream-jobs db migrate")]


def test_a_line_ending_in_a_backslash_continues_the_command() -> None:
    source = ('psql "$URL" \\\n'
              '  -c "SELECT 1"\n'
              "id=$(stream-jobs enqueue email.send '{}' \\\n"
              "       --key user-42)\n")
    assert list(commands(source)) == [
        (0, 'psql "$URL" \\\n  -c "SELECT 1"'),
        (2, "id=$(stream-jobs enqueue email.send '{}' \\\n       --key user-42)"),
    ]
    assert bash_steps(source)[1] == Step("id=$(stream-jobs enqueue email.send '{}' \\\n"
                                         "       --key user-42)", None, 2)


def test_a_comment_inside_a_continued_command_stays_with_it() -> None:
    source = "stream-jobs enqueue \\\n# not a command of its own\n"
    assert list(commands(source)) == [(0, "stream-jobs enqueue \\\n# not a command of its own")]


def test_a_console_block_pairs_each_command_with_the_output_shown_under_it() -> None:
    source = ("$ stream-jobs job \"$ok\"\n"
              "done Job ... is done: attempt 1 committed its effects at ...\n"
              "$ stream-jobs topics apply\n"
              "$ stream-jobs dlq list email.send\n"
              "... holds 1 letter.\n"
              "...\n"
              "\n")
    assert console_steps(source) == [
        Step('stream-jobs job "$ok"',
             "done Job ... is done: attempt 1 committed its effects at ...", 0),
        Step("stream-jobs topics apply", None, 2),
        Step("stream-jobs dlq list email.send", "... holds 1 letter.\n...", 3),
    ]


def test_a_console_command_continues_on_lines_after_a_backslash() -> None:
    source = ("$ stream-jobs enqueue email.send '{\"to\": \"a@b.c\"}' \\\n"
              ">     --priority high\n"
              "01...\n")
    [step] = console_steps(source)
    assert step.command == "stream-jobs enqueue email.send '{\"to\": \"a@b.c\"}' \\\n" \
                           "    --priority high"
    assert step.shown == "01..."


def test_a_command_shown_with_blank_output_has_none_to_check() -> None:
    assert console_steps("$ true\n\n\n$ false\n") == [Step("true", None, 0),
                                                       Step("false", None, 3)]


def test_a_console_block_starts_with_a_command() -> None:
    with pytest.raises(ValueError, match="starts with a `\\$ ` command"):
        console_steps("output first\n$ true\n")


def test_three_dots_stand_for_any_text_and_the_rest_is_literal() -> None:
    shown = "done Job ... (email.send) is done: attempt ... committed its effects at ..."
    assert matches(shown, "done Job 01a2-7c (email.send) is done: attempt 2 committed its "
                          "effects at 2026-12-02T09:48:31+00:00.")
    assert not matches(shown, "retrying Job 01a2 (email.send) waits in delay tier 5s")
    assert matches("a.b (c) [d] *", "a.b (c) [d] *")
    assert not matches("a.b", "axb")


def test_three_dots_span_lines_and_the_whole_output_must_match() -> None:
    table = "...\n│ permanent │       1 │\n..."
    output = "title\n┏━━┓\n│ permanent │       1 │\n└──┘\n"
    assert matches(table, output)
    assert not matches("│ permanent │       1 │", output)  # only part of what was printed
    assert matches("...-...-7...-...-...", "01a23627-38fd-7237-9940-62ed9b7814b2")


def test_trailing_spaces_and_blank_lines_around_the_output_do_not_count() -> None:
    assert matches("line one\nline two", "\nline one   \nline two\n\n")
    assert pattern_of("a   \n").pattern == "a"


def test_a_ctrl_c_line_splits_what_a_command_prints_before_and_after_it() -> None:
    [step] = console_steps("$ stream-jobs worker consumers.mail:app\n"
                           "worker for email.send on ...\n"
                           "^C\n"
                           "...\n"
                           "stopped: no jobs\n")
    assert interrupted(step.shown) == ("worker for email.send on ...", "...\nstopped: no jobs")
    assert interrupted("^C\nstopped: no jobs") == ("", "stopped: no jobs")
    assert interrupted("stopped: no jobs") is None
    assert interrupted(None) is None
    assert interrupted("echo ^C in a line") is None


def test_one_ctrl_c_stops_a_command() -> None:
    with pytest.raises(ValueError, match="one Ctrl-C"):
        interrupted("a\n^C\nb\n^C\n")


@pytest.mark.parametrize("command", [
    "stream-jobs worker consumers.mail:app --type email.send",
    ".venv/bin/stream-jobs worker consumers.demo:app --processes auto",
    "STREAM_JOBS_WORKER_PROCESSES=4 stream-jobs worker consumers.demo:app",
    "stream-jobs worker consumers.mail:app --shadow   # a comment",
    "stream-jobs serve consumers.mail:app",
    "stream-jobs scheduler consumers.mail:app",
    "stream-jobs outbox relay",
    "stream-jobs stats --watch --interval 2",
    "stream-jobs worker consumers.mail:app 2>&1",
])
def test_the_long_running_commands_run_until_stopped(command: str) -> None:
    assert runs_until_stopped(command)


@pytest.mark.parametrize("command", [
    "stream-jobs worker consumers.mail:app --until-idle",
    "stream-jobs worker --help",
    "stream-jobs stats email.send",
    "stream-jobs outbox list",
    "id=$(stream-jobs enqueue email.send '{}')",
    "make worker",
    "echo stream-jobs worker",
    "stream-jobs worker 'unbalanced",
    "",
    # joined to another command: the page shows it ending (a refusal, say)
    'stream-jobs worker consumers.demo:app --type nope || echo "exit code $?"',
    "stream-jobs worker consumers.demo:app --type nope; echo $?",
    "stream-jobs stats --watch | head -n 20",
    "stream-jobs worker consumers.mail:app && echo stopped",
])
def test_other_commands_run_to_their_end(command: str) -> None:
    assert not runs_until_stopped(command)


PAGE = {"STREAM_JOBS_TOPIC_PREFIX": "t1a2b3c", "STREAM_JOBS_DATABASE_SCHEMA": "t1a2b3c"}


def test_exporting_the_readers_own_prefix_and_schema_keeps_the_pages() -> None:
    source = ("export STREAM_JOBS_TOPIC_PREFIX=tour          # your topics: tour.email.send...\n"
              "  export STREAM_JOBS_DATABASE_SCHEMA='tour'\n"
              "export STREAM_JOBS_TOPICS_DIR=consumers/manual/topics")
    assert placed(source, PAGE).splitlines() == [
        "export STREAM_JOBS_TOPIC_PREFIX=t1a2b3c",
        "  export STREAM_JOBS_DATABASE_SCHEMA=t1a2b3c",
        "export STREAM_JOBS_TOPICS_DIR=consumers/manual/topics",  # not a placing name
    ]


@pytest.mark.parametrize("command", [
    "STREAM_JOBS_TOPIC_PREFIX=tour stream-jobs topics list",  # one command's, not exported
    "export STREAM_JOBS_TOPIC_PREFIX=tour && stream-jobs topics list",
    "echo export STREAM_JOBS_TOPIC_PREFIX=tour",
    "export STREAM_JOBS_TOPIC_PREFIX='unbalanced",
])
def test_only_a_line_that_is_the_export_alone_is_changed(command: str) -> None:
    assert placed(command, PAGE) == command


def test_a_value_is_quoted_for_the_shell() -> None:
    assert placed("export STREAM_JOBS_DATABASE_URL=x",
                  {"STREAM_JOBS_DATABASE_URL": "postgresql://u@h:1/d?x=1 2"}) == \
        "export STREAM_JOBS_DATABASE_URL='postgresql://u@h:1/d?x=1 2'"


def test_serve_is_ready_once_uvicorn_listens_and_others_at_their_first_line() -> None:
    assert ready_line("stream-jobs serve --host 127.0.0.1 --port 8080") == "Uvicorn running on"
    assert ready_line("stream-jobs worker consumers.mail:app") == ""
    assert ready_line("stream-jobs stats --watch") == ""
