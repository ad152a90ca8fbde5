"""`python -m ops.bench.report [results.json]`: RESULTS.md rendered again from a run's
results (ops/bench/out/results.json by default), on stdout; nothing is measured."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from ops.bench.report import render


def main() -> None:
    path = Path(sys.argv[1]) if len(sys.argv) > 1 else Path("ops/bench/out/results.json")
    print(render(json.loads(path.read_text())))


if __name__ == "__main__":
    main()
