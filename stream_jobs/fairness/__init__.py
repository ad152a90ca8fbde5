"""Fair queues across tenants (docs/fairness.md): one tenant's flood cannot hold up the others.

A type with `[fairness]` in its TOML (`stream_jobs.tenants.FairnessSpec`) gets:

- fair dispatch: a worker starts the jobs it fetched round-robin across their tenants,
  by weight (`rotation`), key order kept;
- an overflow lane: a tenant holding more than its share of the worker's in-flight jobs
  or processing time is noisy (`noisy`); its further jobs move to `P.T.overflow`, read by
  the same workers with a bounded share of their slots (`overflow`);
- per-tenant concurrency and rate limits across the fleet (`limits`, `limit_store`,
  `gate`);
- what operators read: tenants by waiting, in flight, dwell and overflow (`census`,
  over the pure `tally`).

The worker's hook is `stream_jobs.runtime.fair_dispatch` (a `Dispatcher`, so it lives with
the runtime); the faces are `stream-jobs stats --tenants`, `throttle --tenant` and the
dashboard's Tenants tab.
"""
