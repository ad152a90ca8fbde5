"""Chains and batches whose callbacks fire exactly once, and the finish transaction that
commits a job's dedup row, effects, result and counters together.

`members` (who belongs where, the jobs written later; pure), `sql` (the statements),
`create` (making a batch or chain in one transaction), `finish` (the finish transaction),
`progress` (where a batch or chain stands). docs/workflows.md and docs/results.md.
"""

from stream_jobs.workflows.members import BatchSummary, step_job_id

__all__ = ["BatchSummary", "step_job_id"]
