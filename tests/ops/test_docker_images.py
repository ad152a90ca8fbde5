"""ops/docker/images.py reads the release and mirror the base image is made from out of
the machine's own apt configuration, in either of apt's two formats."""

from __future__ import annotations

import pytest

from ops.docker.images import AptSource, BuildFailed, parse_apt_sources, parse_os_release

DEB822 = """\
Types: deb
# a comment line
URIs: http://mirror.example/debian
Suites: bookworm bookworm-updates
Components: main
Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg

Types: deb
URIs: http://mirror.example/debian-security
Suites: bookworm-security
Components: main
"""

ONE_LINE = """\
# deb http://old.example/debian bookworm main
deb-src http://src.example/debian bookworm main
deb [arch=amd64 signed-by=/k.gpg] http://mirror.example/debian bookworm main contrib
"""


def test_a_deb822_source_gives_the_mirror_of_the_release() -> None:
    found = parse_apt_sources([("debian.sources", DEB822)], "bookworm")
    assert found == AptSource("http://mirror.example/debian", "bookworm")


def test_a_one_line_source_gives_the_mirror_of_the_release() -> None:
    found = parse_apt_sources([("sources.list", ONE_LINE)], "bookworm")
    assert found == AptSource("http://mirror.example/debian", "bookworm")


def test_other_releases_and_other_kinds_of_files_do_not_count() -> None:
    with pytest.raises(BuildFailed, match="No apt source serves trixie main"):
        parse_apt_sources([("debian.sources", DEB822), ("sources.list", ONE_LINE),
                           ("google.list.disabled", "deb http://x trixie main")], "trixie")


def test_the_release_is_the_codename_in_os_release() -> None:
    text = 'PRETTY_NAME="Debian GNU/Linux 12 (bookworm)"\nVERSION_CODENAME=bookworm\nID=debian\n'
    assert parse_os_release(text) == "bookworm"
    with pytest.raises(BuildFailed, match="VERSION_CODENAME"):
        parse_os_release("ID=alpine\n")
