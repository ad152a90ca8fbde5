"""Testing users' handlers: fixtures on a real stack (`stream_jobs.testing.plugin`, a pytest
plugin registered on install), with the stack chosen by `STREAM_JOBS_TEST_BACKEND`
(`stream_jobs.testing.stack`; Docker containers: `stream_jobs.testing.containers`).
"""

from stream_jobs.testing.stack import TestStack, choose_backend, declare_type, settings_for

__all__ = ["TestStack", "choose_backend", "declare_type", "settings_for"]
