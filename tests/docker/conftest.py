"""Checks of the Docker files themselves: they need an engine and the locally built images
(`make docker-images`), and skip with the reason when either is missing."""

from __future__ import annotations

import subprocess

import pytest

from stream_jobs.testing.containers import docker_unavailable

DEPLOY_IMAGE = "stream-jobs:latest"


@pytest.fixture(scope="session")
def deploy_image() -> str:
    """ops/deploy/Dockerfile's image, as `make docker-images` tags it."""
    reason = docker_unavailable()
    if reason is not None:
        pytest.skip(reason)
    found = subprocess.run(["docker", "image", "inspect", DEPLOY_IMAGE], capture_output=True,
                           check=False)
    if found.returncode != 0:
        pytest.skip(f"the image {DEPLOY_IMAGE} is not built: make docker-images builds it "
                    "(python -m ops.docker.images deploy).")
    return DEPLOY_IMAGE
