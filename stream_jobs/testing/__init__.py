"""Testing users' handlers. In memory, on the real job path: `JobTester`
(`stream_jobs.testing.tester`, the pytest fixture `job_tester`). On a real stack: fixtures
(`stream_jobs.testing.plugin`, a pytest plugin registered on install), with the stack
chosen by `STREAM_JOBS_TEST_BACKEND` (`stream_jobs.testing.stack`; Docker containers:
`stream_jobs.testing.containers`).
"""

from stream_jobs.testing.stack import TestStack, choose_backend, declare_type, settings_for
from stream_jobs.testing.tester import JobTester

__all__ = ["JobTester", "TestStack", "choose_backend", "declare_type", "settings_for"]
