"""Chains and batches whose callbacks fire exactly once.

`members` (who belongs where, the jobs written later; pure), `sql` (the statements),
`create` (making a batch or chain in one transaction), `progress` (where a batch or chain
stands), `calls` (the client's calls for them). The finish transaction that advances them
is `stream_jobs.results.finish`. docs/workflows.md.
"""

from stream_jobs.workflows.members import BatchSummary, step_job_id

__all__ = ["BatchSummary", "step_job_id"]
