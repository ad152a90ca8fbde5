"""The manual's example apps: the job types and handlers the pages of docs/ use.

`consumers/manual/topics/` declares every type a page enqueues (one TOML file per type, as
`topics/` does for the tour); one command makes them on a stack:

    STREAM_JOBS_TOPICS_DIR=consumers/manual/topics stream-jobs topics apply

Each module is the app of one page (`consumers.manual.workflows:app` for
docs/workflows.md, and so on), shown on that page as it is; the manual's test
(tests/docs/) checks that the page and the file agree and runs the page's samples.
"""
