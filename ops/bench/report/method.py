"""`## How each figure is taken` in RESULTS.md: the method of the sections that feed the
shared tables (the sections with headings of their own say theirs)."""

METHOD = [
    "- **Kafka tools**: `ProducerPerformance`, `ConsumerPerformance` (its fetch rate, "
    "without the group join) and `EndToEndLatency` (acks=all, one message at a time, "
    "linger 0) from the broker's own jars, on 6-partition topics made by `stream-jobs`' "
    "admin, records as large as ours on the wire.",
    "- **Raw aiokafka producer**: JobProducer's settings, the same value, key and header "
    "bytes, every `send()` pipelined and then every future awaited; first send to last ack.",
    "- **Raw aiokafka consume loop**: `getmany(max_records=500)` then `commit()` per batch, "
    "counting records, on the same backlog the worker drains, from the first batch to the "
    "last record.",
    "- **enqueue_many**: `JobClient.enqueue_many` of 500 `Job`s at a time, each call awaited "
    "(all acks) before the next. **Awaited enqueue**: `await client.enqueue(...)` one by "
    "one; each call's latency is its own round trip including linger.",
    "- **Processing**: `Worker.run(until_idle=True)` in-process over a pre-filled backlog "
    "(6 partitions), timed from the first handler call to the last (start-up, group join "
    "and the idle check are left out and reported separately). The backlog is filled once; "
    "between runs the worker group is rewound to offset 0 with `reset_offsets`. Each "
    "run drains the raw loop, unordered and key in a rotated order.",
    "- **Sync handlers**: a no-op `def` handler (run on the worker's pool: 64 threads at "
    "the default concurrency 64) and a no-op `async def` drain the same backlog in one run, "
    "each as the processing figures are taken (ordering=key, first handler call to the "
    "last), rotating which goes first; the worker group is rewound between them. The "
    "`def` pays a hand-off to a pool thread and back per job (a queue put, a thread "
    "wake-up, `call_soon_threadsafe`) and shares the GIL with the loop.",
    "- **Exactly-once**: the handler inserts one row, once through `ctx.once_deferred()` "
    "(the statement is recorded; many jobs' dedup rows and effects are applied together, "
    "one claim statement and one pipelined `executemany` per batch) and once through "
    "`ctx.once()` (a live connection: each job's claim and effect are round trips in its "
    "own savepoint of a shared transaction), both at the default concurrency of 64, and "
    "the deferred form again at concurrency 256 (what an I/O-bound type would declare: "
    "more jobs wait for each commit, so batches are bigger); all three in every run, "
    "rotating which goes first. The tables are truncated between runs and the row count "
    "is checked to equal N.",
    "- **Fencing tokens**: a quarter of the processing backlog, drained in every run by "
    "four handlers in a rotated order: a no-op that never reads `ctx.fencing_token`, one "
    "that awaits it and does nothing else (a `nextval` of the dedup database's sequence; "
    "requests made while one is in flight share the next round trip), one that awaits it "
    "and upserts one row per job through docs/fencing.md's fenced write on a pool of its "
    "own (autocommit, so a commit per job: a store outside the dedup transaction), and the "
    "same upsert through `ctx.once()` (group commit). Each drain checks that the sequence "
    "moved by exactly N for the contenders that read the token (0 for the others) and "
    "that the writing ones left N rows.",
    "- **End-to-end latency**: a worker runs (key ordering); a separate paced process "
    "offers a rate, every 2 ms sending the jobs due as one `enqueue_many` (the rate it "
    "achieved is reported); the handler records now - `ctx.enqueued_at` (stamped by "
    "`enqueue` before sending, so linger and the ack are inside) into two arrays of "
    "doubles (a list of tuples filled the worker's young generation: one collection "
    "walked 50,000 of them, a 46 ms pause); the pacer keeps only failed batches. The "
    "first second is dropped. Capacity is the end-to-end capacity, searched first in "
    "the same way: the "
    "offered rate rises a tenth of the worker's no-op drain rate at a time until a step "
    "does not keep up (see the latency detail); the last step that kept up is what "
    "producer, broker and worker carry together. The goal is judged at half of it, three "
    "runs (and a quarter is reported). The producer costs "
    "about as much CPU per job as the worker, and both share the box's 2 cores with the "
    "broker, so half the worker-alone drain rate (also reported, the measure of earlier "
    "runs) offers close to what the box can carry at all.",
    "- **Memory**: see the memory detail. The 1,000,000-job backlog is drained once, not "
    "three times: filling it at enqueue_many speed and draining it take about two minutes "
    "each, and three drains would not fit the ~20-minute budget. Its RSS curve over the "
    "drain (10% to 100%) stands in for the spread: it shows whether memory grows with the "
    "jobs behind the worker. The 10,000- and 100,000-job backlogs are drained three times "
    "each (rewound between runs); the 100,000 one tells a plateau (buffers full) from "
    "growth with the backlog.",
    "- **Retry accuracy**: N jobs each fail once on attempt 1; the gap from the failure to "
    "attempt 2's start, minus 5 s. The tier adds up to 10% jitter (<= 0.5 s). Cold: a fresh "
    "worker meets the N jobs as a backlog, so its first failures are its producer's first "
    "writes to the tier topic. Warm: the running worker has already retried one canary job "
    "when the N jobs are enqueued.",
    "- **Schedules**: two `Scheduler`s of one type in the bench process (one leads by the "
    "advisory lock) and a worker run a 1 s schedule (`every = \"1s\"`) for the window, the "
    "handler stamping each run; beside them, in a rotated order, two `celery beat` "
    "processes (each its own schedule file and pidfile, as a team running two for "
    "failover would) and one solo worker run a 1 s beat entry on the bench's Redis. The "
    "first 2 s are left out. Runs per firing: ours, handler runs over distinct firing IDs; "
    "Celery, runs per second of the entry. Lateness: a run's start less its fire time "
    "(from the firing's job ID; Celery's tasks carry no fire time). Jitter: per stream of "
    "runs (ours: the firings; Celery: each beat's), |interval - 1 s| at p99.",
    "- **Celery / Dramatiq**: their own venv, Redis 127.0.0.1:6390 without persistence, "
    "N no-op tasks enqueued one by one (timed), then the workers started and timed from "
    "their first task to their last (counted in memory per process, flushed to Redis every "
    "100 ms: no broker round trip per task). Celery: 2 worker processes with the solo pool "
    "(the fastest of solo, threads, prefork and gevent for a no-op task in a pilot on this "
    "box: about 600, 490, 410 and 400 tasks/s), prefetch multiplier 128 (Celery's advice "
    "for many short tasks), results ignored, early acks. Dramatiq: 2 processes x 8 threads "
    "(its defaults here), default middleware. Ours runs in the same rotation (awaited "
    "enqueues of N jobs, then a drain of a 5N backlog), so the ratios to the peers are "
    "side by side; figures marked 'its section' were measured minutes apart.",
]

