"""The manual's harness (tests/docs/): how it reads blocks and counts them, without a stack."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any
from unittest import SkipTest

import pytest
from sybil import Document

from tests.docs import samples
from tests.docs.manual import count, summary_lines
from tests.docs.samples import Fragments, check_named_file, named_file


def test_a_block_names_its_file_on_its_first_line() -> None:
    assert named_file("# consumers/mail.py\nimport x\n") == "consumers/mail.py"
    assert named_file("# topics/email.send.toml\npartitions = 6\n") == "topics/email.send.toml"
    assert named_file("# a comment about mail.py\n") is None
    assert named_file("import x  # consumers/mail.py\n") is None


def example_of(source: str, path: str = "/docs/page.md") -> Any:
    return SimpleNamespace(parsed=source, path=path, line=3)


def test_a_block_naming_a_repository_file_must_be_that_file(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(samples, "REPO", tmp_path)
    source = "# consumers/app.py\nfrom x import y\n\nraise PermanentError('no')\n"
    (tmp_path / "consumers").mkdir()
    (tmp_path / "consumers" / "app.py").write_text(source)
    check_named_file(example_of(source))
    with pytest.raises(AssertionError, match="is not that file as it is") as failed:
        check_named_file(example_of(source.replace("PermanentError", "RuntimeError")))
    assert "+raise PermanentError('no')" in str(failed.value)


def test_a_block_naming_a_file_the_repository_lacks_is_not_compared() -> None:
    check_named_file(example_of("# myapp/signup.py\nx = 1\n"))



def _parse(text: str, parsers: tuple[Any, ...]) -> Document:
    document = Document(text, "/docs/page.md")
    for parser in parsers:
        for region in parser(document):
            document.add(region)
    return document


def test_a_fragment_skips_the_next_block_with_its_reason() -> None:
    document = _parse("<!-- fragment: inside a Django view -->\n\n```python\nboom\n```\n",
                      (Fragments(),))
    [marker] = list(document.examples())
    marker.evaluate()
    follower = SimpleNamespace(document=document)
    [evaluator] = document.evaluators
    with pytest.raises(SkipTest, match="fragment: inside a Django view"):
        evaluator(follower)
    assert document.evaluators == []  # only the next block


def test_a_fragment_must_say_why() -> None:
    with pytest.raises(ValueError, match="says why"):
        _parse("<!-- fragment: -->\n```python\nx\n```\n", (Fragments(),))


def report(outcome: str, kind: str, reason: str = "", when: str = "call") -> Any:
    return SimpleNamespace(user_properties=[("manual", kind)], when=when,
                           longrepr=("page.md", 1, f"Skipped: {reason}"))


def test_the_count_tells_samples_run_fragments_skipped_and_failed() -> None:
    stats = {
        "passed": [report("passed", "python"), report("passed", "python"),
                   report("passed", "python", when="setup"), report("passed", "hidden"),
                   report("passed", "shell")],
        "skipped": [report("skipped", "python", "fragment: a view"),
                    report("skipped", "shell", "needs kubectl")],
        "failed": [report("failed", "python")],
    }
    assert summary_lines(count(stats)) == [
        "manual python samples: 2 ran, 1 marked fragments, 0 skipped, 1 failed, of 4",
        "manual shell samples: 1 ran, 0 marked fragments, 1 skipped, 0 failed, of 2",
    ]
