"""The dedup store: the table that makes effects happen once per job ID, its group
commit and deferred writes, and its schema.
"""
