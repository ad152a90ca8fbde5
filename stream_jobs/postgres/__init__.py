"""Postgres for everything that is not a handler's `ctx.once()`: `pool` (a small pool
opened on first use), `questions` (one question on a connection of its own, for the
tools), `schema` (every table stream-jobs owns and the fencing sequence, for `db migrate`).
"""
