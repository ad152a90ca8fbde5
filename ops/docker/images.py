"""Builds the local images that stand in for the official ones no registry here can serve.

    python -m ops.docker.images [NAME ...]     # base, kafka, postgres, python, deploy

`base` is Debian minbase made with debootstrap from the release and mirror this machine's
apt sources name, then `docker import`ed; `kafka` (tagged `apache/kafka:<the pinned
version>`), `postgres` (`postgres:15`) and `python` (`python:3.11-slim`) are built on it
with `docker build --network host` (ops/docker/*/Dockerfile), and `deploy`
(`stream-jobs:latest`) is ops/deploy/Dockerfile built on the python one. Each image
carries the digest of its inputs in a label, and is rebuilt only when they change, so
the images are made once per machine (in the engine of ops/docker/engine.sh, whose data
outlives a checkout). Needs root for debootstrap, and DOCKER_HOST pointing at an engine.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path

from stream_jobs.settings import Settings
from stream_jobs.stack.kafka import kafka_version, resolve_jars

REPO = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent
LABEL = "stream-jobs.inputs"
# Bump when the way an image is made changes in a way its input files do not show.
RECIPE = "1"
PG_MAJOR = "15"
LOCAL_CA_DIR = Path("/usr/local/share/ca-certificates")
DEPLOY_TAG = "stream-jobs:latest"
NAMES = ("base", "kafka", "postgres", "python", "deploy")


class BuildFailed(Exception):
    """A step of an image build failed; the message says which and how."""


@dataclass(frozen=True)
class AptSource:
    """Where this machine's Debian packages come from: the mirror and the release."""

    mirror: str
    release: str


def parse_os_release(text: str) -> str:
    """The release codename (`bookworm`) from /etc/os-release."""
    match = re.search(r"^VERSION_CODENAME=\"?([a-z]+)\"?\s*$", text, re.MULTILINE)
    if match is None:
        raise BuildFailed("/etc/os-release names no VERSION_CODENAME: is this Debian?")
    return match.group(1)


def parse_apt_sources(files: Iterable[tuple[str, str]], release: str) -> AptSource:
    """The mirror serving `release`'s main component, from apt's sources.

    `files` are (name, text): `*.sources` in deb822 form, `*.list` one-line form.
    """
    for name, text in files:
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if ("deb" in fields.get("types", "").split()
                        and release in fields.get("suites", "").split()
                        and "main" in fields.get("components", "").split()
                        and fields.get("uris")):
                    return AptSource(fields["uris"].split()[0], release)
        elif name.endswith(".list"):
            for line in text.splitlines():
                words = re.sub(r"\[[^]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 4 and words[0] == "deb" and words[2] == release \
                        and "main" in words[3:]:
                    return AptSource(words[1], release)
    raise BuildFailed(f"No apt source serves {release} main: the base image needs the mirror "
                      "this machine installs its Debian packages from.")


def machine_apt_source() -> AptSource:
    release = parse_os_release(Path("/etc/os-release").read_text())
    paths = [Path("/etc/apt/sources.list"), *sorted(Path("/etc/apt/sources.list.d").glob("*"))]
    files = [(p.name, p.read_text()) for p in paths
             if p.is_file() and p.name.endswith((".list", ".sources"))]
    return parse_apt_sources(files, release)


def docker(*args: str, stdin: int | None = None) -> str:
    """Run the docker CLI against DOCKER_HOST; its stdout. A failure raises with its output."""
    result = subprocess.run(["docker", *args], stdin=stdin, capture_output=True, text=True,
                            check=False)
    if result.returncode != 0:
        detail = (result.stderr.strip() or result.stdout.strip())[-800:]
        raise BuildFailed(f"docker {' '.join(args[:2])} failed ({result.returncode}): {detail}")
    return result.stdout


def label_of(tag: str) -> str | None:
    """The inputs digest the image `tag` was built from here; "" for an image made
    elsewhere (an official one, pulled); None when the engine has no such image."""
    result = subprocess.run(["docker", "image", "inspect", "-f", "{{json .Config.Labels}}", tag],
                            capture_output=True, text=True, check=False)
    if result.returncode != 0:
        return None
    labels = json.loads(result.stdout or "null") or {}
    return str(labels.get(LABEL, ""))


def image_id(tag: str) -> str:
    return docker("image", "inspect", "-f", "{{.Id}}", tag).strip()


def digest(parts: Iterable[str | bytes]) -> str:
    sha = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        sha.update(len(data).to_bytes(8, "big"))
        sha.update(data)
    return sha.hexdigest()[:16]


def folder_digest(folder: Path) -> list[str | bytes]:
    """Every file under `folder`, by relative path, mode and content."""
    parts: list[str | bytes] = []
    for path in sorted(p for p in folder.rglob("*") if p.is_file()):
        parts += [str(path.relative_to(folder)), oct(path.stat().st_mode & 0o777),
                  hashlib.sha256(path.read_bytes()).hexdigest()]
    return parts


def base_tag(source: AptSource) -> str:
    return f"stream-jobs/debian:{source.release}"


def local_ca_certificates() -> list[Path]:
    """The CA certificates this machine's admin added to its trust store."""
    return sorted(p for p in LOCAL_CA_DIR.glob("**/*.crt") if p.is_file())


def build_base(source: AptSource, work: Path) -> str:
    """Debian minbase from the machine's mirror, imported as an image; returns its tag.

    It trusts what the machine trusts: the CA certificates added to the machine's store
    are added to the image's, so builds on it reach package registries as the machine
    does (through a TLS-inspecting proxy, say).
    """
    tag = base_tag(source)
    cas = local_ca_certificates()
    want = digest([RECIPE, source.mirror, source.release, "minbase",
                   *(p.read_bytes() for p in cas)])
    if label_of(tag) == want:
        return tag
    if shutil.which("debootstrap") is None:
        raise BuildFailed("debootstrap is not installed: run ops/docker/engine.sh as root "
                          "(it installs it) or apt-get install debootstrap.")
    if os.geteuid() != 0:
        raise BuildFailed("The base image is made with debootstrap, which needs root.")
    work.mkdir(parents=True, exist_ok=True)
    root = Path(tempfile.mkdtemp(prefix="debootstrap-", dir=work))
    try:
        debootstrap(source, root, cas, work / "debootstrap.log")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."],
                               stdout=subprocess.PIPE)
        assert tar.stdout is not None
        docker("import", "--change", f"LABEL {LABEL}={want}",
               "--change", "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
               "--change", 'CMD ["bash"]', "-", tag, stdin=tar.stdout.fileno())
        if tar.wait() != 0:
            raise BuildFailed(f"tar of the debootstrap folder {root} failed.")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return tag


def debootstrap(source: AptSource, root: Path, cas: Sequence[Path], log: Path) -> None:
    """A minbase system in `root`, trusting `cas` too, without apt's downloads."""
    with log.open("wb") as out:
        done = subprocess.run(["debootstrap", "--variant=minbase", "--include=ca-certificates",
                               source.release, str(root), source.mirror],
                              stdout=out, stderr=subprocess.STDOUT, check=False)
    if done.returncode != 0:
        raise BuildFailed(f"debootstrap {source.release} from {source.mirror} failed; "
                          f"see {log}.")
    if cas:
        target = root / "usr/local/share/ca-certificates"
        for ca in cas:
            shutil.copy2(ca, target / ca.name)
        added = subprocess.run(["chroot", str(root), "update-ca-certificates"],
                               capture_output=True, text=True, check=False)
        if added.returncode != 0:
            raise BuildFailed("update-ca-certificates in the base image failed: "
                              f"{added.stderr.strip()[-400:]}")
    # What apt downloaded to install the base is no part of it.
    for leftover in ("var/cache/apt/archives", "var/lib/apt/lists"):
        for path in (root / leftover).glob("*"):
            if path.is_file():
                path.unlink()


def build(tag: str, context: Path, inputs: list[str | bytes], *,
          dockerfile: Path | None = None, args: Sequence[str] = ()) -> str:
    """`docker build --network host` of `context` unless `tag` was built from these inputs,
    or is an image made elsewhere: an official image someone pulled is used, never
    replaced by a stand-in."""
    want = digest([RECIPE, *inputs])
    found = label_of(tag)
    if found == want:
        return tag
    if found == "":
        print(f"{tag}: an image not built here is there; using it as it is", file=sys.stderr)
        return tag
    argv = ["build", "--network", "host", "--force-rm", "--label", f"{LABEL}={want}", "-t", tag]
    if dockerfile is not None:
        argv += ["-f", str(dockerfile)]
    for arg in args:
        argv += ["--build-arg", arg]
    docker(*argv, str(context))
    return tag


def build_kafka(base: str, work: Path) -> str:
    """apache/kafka:<version> from the jars `stream-jobs dev up` resolves with Maven."""
    ops = REPO / "ops"
    version = kafka_version(ops / "kafka" / "pom.xml")
    lib = resolve_jars(Settings())
    context = work / "kafka-context"
    shutil.rmtree(context, ignore_errors=True)
    shutil.copytree(HERE / "kafka", context)
    shutil.copytree(lib, context / "libs", copy_function=os.link if _same_fs(lib, work)
                    else shutil.copy2)
    for name in ("log4j2.properties", "tools-log4j2.properties"):
        shutil.copy2(ops / "kafka" / name, context / "docker" / name)
    try:
        return build(f"apache/kafka:{version}", context,
                     [image_id(base), *folder_digest(context)], args=[f"BASE={base}"])
    finally:
        shutil.rmtree(context, ignore_errors=True)


def _same_fs(a: Path, b: Path) -> bool:
    b.mkdir(parents=True, exist_ok=True)
    return a.stat().st_dev == b.stat().st_dev


def build_deploy() -> str:
    """stream-jobs:latest from ops/deploy/Dockerfile; Docker's layer cache decides what to
    rebuild, since its inputs are the repository's sources."""
    docker("build", "--network", "host", "--force-rm", "-q",
           "-f", str(REPO / "ops" / "deploy" / "Dockerfile"), "-t", DEPLOY_TAG, str(REPO))
    return DEPLOY_TAG


def build_all(names: Sequence[str], work: Path) -> dict[str, float]:
    """Build the named images (and what they stand on); seconds each took."""
    timings: dict[str, float] = {}
    source = machine_apt_source()

    def timed(name: str, make: Callable[[], str]) -> str:
        start = time.monotonic()
        print(f"{name}: building or checking ...", file=sys.stderr)
        tag = make()
        timings[name] = time.monotonic() - start
        print(f"{name}: {tag} ({timings[name]:.1f} s)", file=sys.stderr)
        return tag

    base = timed("base", lambda: build_base(source, work))
    if "kafka" in names:
        timed("kafka", lambda: build_kafka(base, work))
    if "postgres" in names:
        timed("postgres", lambda: build(
            f"postgres:{PG_MAJOR}", HERE / "postgres",
            [image_id(base), PG_MAJOR, *folder_digest(HERE / "postgres")],
            args=[f"BASE={base}", f"PG_MAJOR={PG_MAJOR}"]))
    if "python" in names or "deploy" in names:
        timed("python", lambda: build(
            "python:3.11-slim", HERE / "python",
            [image_id(base), *folder_digest(HERE / "python")], args=[f"BASE={base}"]))
    if "deploy" in names:
        # Docker's own layer cache decides what to rebuild: its inputs are the repository.
        timed("deploy", build_deploy)
    return timings


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("names", nargs="*", metavar="NAME",
                        help=f"images to build, of {', '.join(NAMES)} (default: all)")
    parsed = parser.parse_args(argv)
    names: list[str] = parsed.names or list(NAMES)
    unknown = sorted(set(names) - set(NAMES))
    if unknown:
        parser.error(f"no image named {', '.join(unknown)}; choose from {', '.join(NAMES)}.")
    work = Path(os.environ.get("STREAM_JOBS_DOCKER_DIR",
                               Path.home() / ".cache" / "stream-jobs" / "docker")) / "build"
    try:
        build_all(names, work)
    except BuildFailed as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
