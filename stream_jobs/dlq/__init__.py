"""The dead-letter tools: reading letters, listing and showing them, requeue and purge.
"""
