"""One no-op drain in a process of its own, so two versions of the code run the same
drain side by side (ops/bench/before.py):

    PYTHONPATH=<code> python -m ops.bench.noop_drain TYPE N

drains the backlog of exactly N jobs of TYPE with `ops.bench.ours.drain` (the processing
section's no-op worker, `run(until_idle=True)`) on the settings of the environment, and
prints its figures as one line of JSON.
"""

from __future__ import annotations

import json
import sys

from ops.bench.common import run_async
from ops.bench.ours import drain
from stream_jobs.settings import load_settings


def main() -> int:
    job_type, n = sys.argv[1], int(sys.argv[2])
    print(json.dumps(run_async(drain(load_settings(), job_type, n), 960)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
