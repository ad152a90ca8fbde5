"""Retry now: a job waiting in a delay tier (a retry, or a delayed enqueue) runs now
instead of at its due time, and only once (docs/control.md).

`stream-jobs retry-now ID`, `POST /jobs/{id}/retry-now` and the job page's button write a
copy of the job's tier record to its lane (same job ID and attempt, due time cleared,
marked `sj-released-early`) and record the attempt as released early in
`stream_jobs_released_early`, which NOTIFYs every process's cancel watch. The relay then
finishes the original tier record without releasing it; a worker skips a lane record of
that attempt without the mark (the relay released it just before the notice arrived).
`rules` is the pure part, `store` the transaction; the action is `stream_jobs.tools.retry_now`.
"""
