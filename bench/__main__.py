"""``python -m bench``: run every bench/bench_*.py on the GPU, then one summary table.

Each script writes bench/results/<name>.json through the harness; the summary reads those files:
per result file, the number of rows and the smallest / median / largest ge2-vs-torch ratio
(torch time / ge2 time: > 1 means ge2 is faster). ``python -m bench --summary`` only summarises.
"""
from __future__ import annotations

import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent


def summarize() -> None:
    print(f"{'result':28} {'device':24} {'rows':>4} {'min x':>7} {'median x':>8} {'max x':>7}")
    for path in sorted((HERE / "results").glob("*.json")):
        data = json.loads(path.read_text())
        rows = data.get("rows", [])
        ratios = [v for r in rows if isinstance(r, dict) for k, v in r.items()
                  if k.startswith("ratio_torch") and isinstance(v, (int, float))]
        stats = (f"{min(ratios):7.2f} {statistics.median(ratios):8.2f} {max(ratios):7.2f}" if ratios
                 else f"{'-':>7} {'-':>8} {'-':>7}")
        print(f"{path.stem:28} {str(data.get('device', '?'))[:24]:24} {len(rows):4d} {stats}")


def main(argv: list[str]) -> int:
    failed = []
    if "--summary" not in argv:
        for script in sorted(HERE.glob("bench_*.py")):
            print(f"== {script.name}", flush=True)
            if subprocess.run([sys.executable, str(script)], cwd=HERE.parent).returncode != 0:
                failed.append(script.name)
    summarize()
    if failed:
        print(f"failed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
