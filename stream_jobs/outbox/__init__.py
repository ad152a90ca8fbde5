"""The transactional outbox: jobs written in the caller's database transaction, so a job
exists if and only if that transaction commits, and the relay that moves them to Kafka.

`rows` (the rows and their rules, pure), `writer` (the caller's connection kinds),
`relay` (claim, produce, delete), `depth` (how many rows wait, and for how long).
"""
