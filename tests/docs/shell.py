"""The manual's shell blocks, run as transcripts on the page's corner of the stack.

- A ```` ```bash ```` block is a list of commands: each runs in order (a line ending in
  `\\` continues), and each must exit 0. Comments are the reader's.
- A ```` ```console ```` block is a transcript: `$ command` lines, each followed by the
  output the page shows for it. The output must match, `...` standing for any text (as
  doctest's ELLIPSIS), trailing spaces ignored. A command whose shown output does not match
  yet (a job still running) is run again until it does, for up to `SETTLE_S`.
- Shell variables set by one command (`id=$(stream-jobs enqueue ...)`) are there for the
  next ones on the page; `export NAME=value` also sets the page's environment, so the
  page's Python samples see it as a reader's would.
- A page that has the reader choose a corner of the stack of their own (`export
  STREAM_JOBS_TOPIC_PREFIX=tour`, `..._DATABASE_SCHEMA`, or the stack's addresses
  `..._KAFKA_BOOTSTRAP`, `..._DATABASE_URL`) keeps the page's values in the test: the
  reader picks a name, the test a fresh one, so no two runs share topics, groups or
  tables. Only a line that is that export alone is read so (see `placed`), and a page
  shows no output that depends on the name (`...` stands for it).
- A command that runs until stopped (`stream-jobs worker` without `--until-idle`,
  `stats --watch`, `serve`, `scheduler`, `history`, `outbox relay`; alone, not joined to
  another by `||` or `|`) starts in the background, as in a second terminal; at the page's end it
  gets Ctrl-C (SIGINT) and must stop cleanly (exit 0). In a console block, the output
  shown under it is what it printed by then, from its start to its last line (`...` for
  the log lines a reader would skim).
- A console block can also stop such a command where it stands, as a reader at the
  terminal does: a `^C` line in its output means "once it printed what is shown above
  this line, press Ctrl-C"; it must then stop with exit 0 and have printed, in all, what
  is shown above and below the `^C` (see `interrupted`). The next command runs after it
  stopped. A reader's Ctrl-C comes once the command has said it runs: a background
  command still silent at the page's end gets it after `START_S`.
- Commands run from the repository's root with the project's virtualenv first on `PATH`,
  stdout and stderr together, in a terminal 120 columns wide without colour.
- A page's hidden blocks check what its commands did with `shell_output(page, command)`
  (what a command prints in the page's shell, with its variables) and
  `background_lines(page, text)` (lines a background command printed, e.g. a worker's log).
"""

from __future__ import annotations

import os
import re
import shlex
import signal
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from sybil import Example
from sybil.parsers.markdown import CodeBlockParser

from tests.docs.page import Page

COMMAND_TIMEOUT_S = 180.0
SETTLE_S = 60.0
STOP_TIMEOUT_S = 60.0
# A reader presses Ctrl-C once a command has said it runs, or has had this long to start
# (one that prints nothing until it stops, as `stats --watch` into a file).
START_S = 15.0
ASSIGNMENT = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
EXPORT = re.compile(r"^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=")
# The settings that place a page on the stack: its own in the test, whatever the page says.
PLACING = ("STREAM_JOBS_TOPIC_PREFIX", "STREAM_JOBS_DATABASE_SCHEMA",
           "STREAM_JOBS_KAFKA_BOOTSTRAP", "STREAM_JOBS_DATABASE_URL")


@dataclass
class Step:
    """One command of a block and the output the page shows for it (None: not shown)."""

    command: str
    shown: str | None = None
    line: int = 0


def commands(source: str) -> Iterator[tuple[int, str]]:
    """A bash block's commands (joined across `\\` line ends), with their line in the block;
    blank lines and whole-line comments skipped."""
    pending: list[str] = []
    start = 0
    for number, line in enumerate(source.splitlines()):
        if not pending:
            start = number
            if not line.strip() or line.lstrip().startswith("#"):
                continue
        if line.endswith("\\"):
            pending.append(line)  # bash reads the backslash-newline as a continuation
            continue
        pending.append(line)
        yield start, "\n".join(pending)
        pending = []
    if pending:
        yield start, "\n".join(pending)


def bash_steps(source: str) -> list[Step]:
    return [Step(command, None, line) for line, command in commands(source)]


def console_steps(source: str) -> list[Step]:
    """A console block's `$ ` commands, each with the lines up to the next as its output."""
    steps: list[Step] = []
    shown: list[str] = []
    for number, line in enumerate(source.splitlines()):
        if line.startswith("$ "):
            if steps:
                steps[-1].shown = "\n".join(shown) if shown else None
            shown = []
            steps.append(Step(line[2:], None, number))
        elif steps and steps[-1].command.endswith("\\") and not shown:
            steps[-1].command += "\n" + line.removeprefix("> ")
        elif steps:
            shown.append(line)
        elif line.strip():
            raise ValueError(f"a console block starts with a `$ ` command, not {line!r}")
    if steps:
        steps[-1].shown = "\n".join(shown).rstrip("\n") if shown else None
    for step in steps:
        if step.shown is not None and not step.shown.strip():
            step.shown = None
    return steps


def pattern_of(shown: str) -> re.Pattern[str]:
    """The output a page shows as a pattern: `...` is any text, trailing spaces ignored."""
    lines = [line.rstrip() for line in shown.strip("\n").splitlines()]
    parts = [re.escape(part) for part in "\n".join(lines).split("...")]
    return re.compile(".*?".join(parts), re.DOTALL)


def matches(shown: str, output: str) -> bool:
    actual = "\n".join(line.rstrip() for line in output.strip("\n").splitlines())
    return pattern_of(shown).fullmatch(actual) is not None


def placed(command: str, values: Mapping[str, str]) -> str:
    """`command` with every line that is only `export NAME=value` (a comment after it
    allowed) of a name in `values` made to export `values[NAME]` instead."""
    lines = []
    for line in command.splitlines():
        try:
            words = shlex.split(line, comments=True)
        except ValueError:
            words = []
        if len(words) == 2 and words[0] == "export" and "=" in words[1]:
            name = words[1].split("=", 1)[0]
            if name in values:
                indent = line[: len(line) - len(line.lstrip())]
                line = f"{indent}export {name}={shlex.quote(values[name])}"
        lines.append(line)
    return "\n".join(lines)


INTERRUPT = "^C"


def interrupted(shown: str | None) -> tuple[str, str] | None:
    """The output a console block shows before and after its `^C` line (Ctrl-C pressed
    there), or None when it shows none."""
    if shown is None:
        return None
    lines = shown.splitlines()
    marks = [number for number, line in enumerate(lines) if line.strip() == INTERRUPT]
    if not marks:
        return None
    if len(marks) > 1:
        raise ValueError(f"one Ctrl-C stops a command; the output shows {len(marks)}")
    return "\n".join(lines[:marks[0]]), "\n".join(lines[marks[0] + 1:])


def runs_until_stopped(command: str) -> bool:
    """Whether a command runs until Ctrl-C (the CLI's long-running commands). One joined
    to others (`||`, `&&`, `;`, `|`: `stream-jobs worker APP -t nope || echo $?`) is run to
    its end: the page shows it ending."""
    try:
        lexer = shlex.shlex(command, posix=True, punctuation_chars=True)
        lexer.whitespace_split = True
        words = list(lexer)
    except ValueError:
        return False
    if any(set(word) <= set("|&;") for word in words):
        return False
    while words and ASSIGNMENT.match(words[0]):
        words = words[1:]  # NAME=value before the command
    if not words or Path(words[0]).name != "stream-jobs":
        return False
    args = words[1:]
    if "--until-idle" in args or "--help" in args:
        return False
    if args[:1] in (["worker"], ["serve"], ["scheduler"], ["history"]):
        return True
    if args[:2] == ["outbox", "relay"]:
        return True
    return args[:1] == ["stats"] and "--watch" in args


# What a long-running command prints once it serves, where its first line comes earlier:
# `serve` names its address before uvicorn has bound the port.
READY = {"serve": "Uvicorn running on"}


def ready_line(command: str) -> str:
    """The line that says a long-running command is ready ("" for its first line)."""
    words = command.split()
    return next((line for name, line in READY.items() if name in words[1:2]), "")


@dataclass
class Background:
    """A command running until stopped: where the page started it, its log, what the page
    shows it printed (checked once it stopped)."""

    where: str
    process: subprocess.Popen[bytes]
    log: Path
    shown: str | None = None
    started: float = field(default_factory=time.monotonic)


@dataclass
class Shell:
    """A page's shell: its variables, its background commands, its environment."""

    page: Page
    state: Path
    background: list[Background] = field(default_factory=list)

    @classmethod
    def of(cls, page: Page) -> Shell:
        shell = page.namespace.get("_shell")
        if shell is None:
            shell = cls(page, page.workdir / "shell-state.sh")
            shell.state.write_text("")
            page.namespace["_shell"] = shell
            page.on_close(shell.stop_background)
        assert isinstance(shell, Shell)
        return shell

    def script(self, command: str) -> str:
        command = placed(command, {name: self.page.env[name] for name in PLACING
                                   if name in self.page.env})
        names = sorted({m.group(1) for line in command.splitlines()
                        if (m := ASSIGNMENT.match(line))})
        keep = "".join(f'declare -p {name} >> "{self.state}" 2>/dev/null\n' for name in names)
        return (f'set -o pipefail\nsource "{self.state}"\n{command}\n__status=$?\n'
                f"{keep}exit $__status\n")

    def environment(self) -> dict[str, str]:
        """The page's environment, with the project's virtualenv first on PATH (a reader
        has it activated) and output sized as a terminal's."""
        path = f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}"
        return {**os.environ, "PATH": path, "COLUMNS": "120", "NO_COLOR": "1",
                "TERM": "dumb"}

    def run(self, step: Step, where: str) -> None:
        stop_at = interrupted(step.shown)
        if stop_at is not None:
            self.interrupt(step.command, where, *stop_at)
            return
        if runs_until_stopped(step.command):
            self.start(step, where)
            return
        deadline = time.monotonic() + SETTLE_S
        while True:
            code, output = self.execute(step.command)
            if code != 0:
                raise AssertionError(f"{where}: `{step.command}` exited {code}:\n{output}")
            if step.shown is None or matches(step.shown, output):
                break
            if time.monotonic() > deadline:
                raise AssertionError(f"{where}: `{step.command}` printed\n{output}\n"
                                     f"which is not what the page shows:\n{step.shown}")
            time.sleep(0.5)  # the shown output is a state still coming (a job in a handler)
        for line in step.command.splitlines():
            if (exported := EXPORT.match(line)) is not None:
                self.export(exported.group(1))

    def execute(self, command: str) -> tuple[int, str]:
        """Run `command` to its end in the page's shell: its exit code, and what it printed
        (stdout and stderr, as a terminal shows them)."""
        done = subprocess.run(["bash", "-c", self.script(command)], cwd=self.page.cwd,
                              env=self.environment(), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, timeout=COMMAND_TIMEOUT_S, check=False)
        return done.returncode, done.stdout.decode(errors="replace")

    def export(self, name: str) -> None:
        """Give the page's environment a variable the page exported."""
        done = subprocess.run(["bash", "-c", f'source "{self.state}"; printf %s "${name}"'],
                              env=self.environment(), capture_output=True, check=True)
        self.page.use_env(**{name: done.stdout.decode()})

    def start(self, step: Step, where: str) -> None:
        log = self.page.workdir / f"background-{len(self.background)}.log"
        with log.open("wb") as out:
            # A session of its own: Ctrl-C reaches the command's whole process group, as a
            # terminal's would.
            process = subprocess.Popen(["bash", "-c", self.script(step.command)],
                                       cwd=self.page.cwd, env=self.environment(),
                                       stdout=out, stderr=subprocess.STDOUT,
                                       start_new_session=True, preexec_fn=_terminal_sigint)
        self.background.append(Background(f"{where}: `{step.command}`", process, log,
                                          step.shown))
        self.until_ready(process, log, ready_line(step.command))

    @staticmethod
    def until_ready(process: subprocess.Popen[bytes], log: Path, ready: str) -> None:
        """Go on once a background command printed `ready` (or anything, for ""), as a
        reader turns to the second terminal once the first says it runs; or once it
        stopped, or after START_S (a silent command)."""
        deadline = time.monotonic() + START_S
        while process.poll() is None and time.monotonic() < deadline:
            output = log.read_text(errors="replace")
            if output and ready in output:
                return
            time.sleep(0.1)  # the command is still starting

    def interrupt(self, command: str, where: str, before: str, after: str) -> None:
        """Run `command` until it printed `before`, press Ctrl-C, and check it stopped with
        exit 0 having printed `before` then `after`."""
        self.start(Step(command), where)
        running = self.background.pop()
        running.shown = "\n".join(part for part in (before, after) if part.strip()) or None
        deadline = time.monotonic() + SETTLE_S
        while True:
            output = running.log.read_text(errors="replace")
            if output and matches(f"{before}...", output):
                break
            if running.process.poll() is not None or time.monotonic() > deadline:
                if running.process.poll() is None:
                    os.killpg(running.process.pid, signal.SIGKILL)
                    running.process.wait()
                raise AssertionError(f"{running.where} printed\n{output}\nwhich is not what "
                                     f"the page shows before ^C:\n{before}")
            time.sleep(0.2)  # the command is still starting: a reader waits for its lines
        failure = self.stop(running)
        if failure is not None:
            raise AssertionError(failure)

    def stop(self, command: Background) -> str | None:
        """Ctrl-C `command`; what went wrong, if it did not stop with exit 0 having printed
        what the page shows."""
        what, process, log = command.where, command.process, command.log
        # Ctrl-C after the command said it runs (or had START_S to), not while Python
        # starts: a reader waits for the prompt's answer.
        while (process.poll() is None and not log.stat().st_size
               and time.monotonic() < command.started + START_S):
            time.sleep(0.1)
        if process.poll() is None:
            os.killpg(process.pid, signal.SIGINT)
        try:
            code = process.wait(timeout=STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
            return (f"{what} did not stop within {STOP_TIMEOUT_S:g} s of Ctrl-C:\n"
                    f"{log.read_text(errors='replace')}")
        output = log.read_text(errors="replace")
        if code != 0:
            return f"{what} exited {code}:\n{output}"
        if command.shown is not None and not matches(command.shown, output):
            return f"{what} printed\n{output}\nwhich is not what the page shows:\n{command.shown}"
        return None

    def stop_background(self) -> None:
        """Ctrl-C each background command, newest first; each must stop with exit 0 and
        have printed what the page shows."""
        failures = [failure for command in reversed(self.background)
                    if (failure := self.stop(command)) is not None]
        self.background.clear()
        if failures:
            raise AssertionError("\n".join(failures))


def _terminal_sigint() -> None:
    # As in a terminal: a test run started in the background of a script's shell ignores
    # SIGINT, and a command would inherit that and never meet the page's Ctrl-C.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def shell_output(page: Page, command: str) -> str:
    """What `command` prints in `page`'s shell, with the variables its blocks set: for a
    hidden block's check of what a page's commands did. It must exit 0."""
    code, output = Shell.of(page).execute(command)
    if code != 0:
        raise AssertionError(f"`{command}` exited {code}:\n{output}")
    return output


def background_lines(page: Page, containing: str) -> list[str]:
    """The lines `page`'s background commands printed that contain `containing`, once at
    least one has (waiting up to SETTLE_S, as a console block's output does): for a hidden
    block's check of what a worker logged."""
    logs = [command.log for command in Shell.of(page).background]
    deadline = time.monotonic() + SETTLE_S
    while True:
        found = [line for log in logs for line in log.read_text(errors="replace").splitlines()
                 if containing in line]
        if found:
            return found
        if time.monotonic() > deadline:
            raise AssertionError(f"no background command of the page printed {containing!r} "
                                 f"within {SETTLE_S:g} s")
        time.sleep(0.5)  # a worker logs as it goes: the line is still coming


def run_shell(example: Example) -> None:
    """Run a bash or console block's commands in the page's shell."""
    __tracebackhide__ = True
    page: Page = example.namespace["page"]
    language = str(example.region.lexemes.get("arguments", "")).split()[0]
    source = str(example.parsed)
    steps = console_steps(source) if language == "console" else bash_steps(source)
    shell = Shell.of(page)
    for step in steps:
        shell.run(step, f"{Path(example.path).name}:{example.line + 1 + step.line}")


def shell_samples() -> list[CodeBlockParser]:
    return [CodeBlockParser(language=language, evaluator=run_shell)
            for language in ("bash", "console")]
