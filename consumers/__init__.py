"""Deployable apps: handlers grouped by job type (`stream-jobs worker consumers.demo:app`)."""
