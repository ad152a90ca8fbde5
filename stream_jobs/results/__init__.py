"""Kept results and a job's last state: `rules` (the stored form; pure), `store` (reading
a result, waiting for it, pruning), `finish` (the finish transaction that writes it with
the job's dedup row, effects and batch counters). docs/results.md.
"""
