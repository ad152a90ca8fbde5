"""History: what every type did over time, kept exactly (docs/history.md).

`tally` (pure: one window's counts and percentiles), `windows` (pure: slots, windows,
spans), `reports` (pure: what the history reads of a worker's report), `store` (the
windows in Postgres, where readers find them), `stream` (the faust-streaming app that
folds reports into windows exactly once) and `process` (running it: `stream-jobs
history`, or inside `serve --history`). Workers count per slot with
`windows.SlotTallies`.
"""
