"""Cancelling a job: `rules` (the answers, done and cancelled exclusive, the notices; pure),
`store` (the one transaction that cancels, and what workers read back), `watch` (the
cancelled IDs a worker process keeps current by LISTEN/NOTIFY). docs/control.md.
"""
