"""Unique jobs and debounce: `rules` (what an enqueue asks for and is told; pure), `claim`
(the key and the job's outbox row in one transaction), `release` (the worker gives a key
back when its job ends, and tells a superseded debounced job). docs/control.md.
"""
