"""The reader's project a page shows (tests/docs/samples.py): which blocks are its files."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs import samples
from tests.docs.samples import project_files, section_of, write_project

PAGE = '''# A page

## First

```python
# myapp/one.py
ONE = 1
```

<!-- invisible-code-block: python
# not a heading: a comment inside a hidden block
-->

```toml
# pyproject.toml (your project's)
[tool.pytest.ini_options]
```

```python
# consumers/app.py
IN_THE_REPOSITORY = True
```

### Inside first

```python
# tests/test_one.py
def test_one(): ...
```

## Second

```python
# myapp/two.py
TWO = 2
```
'''


@pytest.fixture
def page(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    repo = tmp_path / "repo"
    (repo / "consumers").mkdir(parents=True)
    (repo / "consumers" / "app.py").write_text("# consumers/app.py\nIN_THE_REPOSITORY = True\n")
    (repo / "pyproject.toml").write_text("[project]\n")
    monkeypatch.setattr(samples, "REPO", repo)
    path = tmp_path / "page.md"
    path.write_text(PAGE)
    return path


def test_a_section_ends_at_a_heading_of_its_level_not_at_a_comment_line(page: Path) -> None:
    first = section_of(page.read_text(), "## First")
    assert first.startswith("## First\n")
    assert "### Inside first" in first
    assert "# myapp/one.py" in first
    assert "## Second" not in first


def test_the_project_is_the_files_the_repository_does_not_have(page: Path) -> None:
    assert project_files(page, "## First") == {
        "myapp/one.py": "# myapp/one.py\nONE = 1\n",
        "pyproject.toml": "# pyproject.toml (your project's)\n[tool.pytest.ini_options]\n",
        "tests/test_one.py": "# tests/test_one.py\ndef test_one(): ...\n",
    }
    assert set(project_files(page)) == {"myapp/one.py", "pyproject.toml", "tests/test_one.py",
                                        "myapp/two.py"}


def test_the_project_is_written_where_asked(page: Path, tmp_path: Path) -> None:
    folder = write_project(tmp_path / "project", project_files(page, "## Second"))
    assert (folder / "myapp" / "two.py").read_text() == "# myapp/two.py\nTWO = 2\n"
