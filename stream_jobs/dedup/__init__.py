"""The `ctx.once()` family: the dedup table that makes effects happen once per job ID
(`store`), its group commit and deferred writes, the held transaction, the sync handlers'
once, and fencing tokens.
"""
