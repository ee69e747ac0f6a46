"""srtscope's side of the comparisons, in-process: load_timeline + diagnose -> the JSON contract.

Runs in the PROJECT venv (.venv), as a subprocess like the peers, so wall time and peak memory are
measured the same way. `benchmarks/peers/common.py:srtscope_command` chooses between this driver and
the CLI (`srtscope diagnose TRACE... --json`); both print the same JSON contract on stdout.

    .venv/bin/python benchmarks/peers/run_srtscope.py TRACE... [--threshold-us 5]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("traces", nargs="+")
    ap.add_argument("--threshold-us", type=float, default=None)
    args = ap.parse_args(argv)

    from srtscope.analyzers.diagnose import DiagnoseParams, diagnose
    from srtscope.analyzers.readers import load_timeline

    tl = load_timeline(args.traces)
    params = DiagnoseParams() if args.threshold_us is None else DiagnoseParams(threshold_us=args.threshold_us)
    print(json.dumps(diagnose(tl, params).to_json(), default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
