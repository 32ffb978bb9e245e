"""Load time against the time to read the files, each load in a fresh process, this tree's loader
and (``--rev``) an earlier commit's, interleaved.

    python scripts/load_vs_read.py /tmp/specvis-scale/lumina-1.5b --rev e59cf5d --repeats 5 \\
        --json docs/results/data/scale-load.json

For each repeat, for each loader in turn (``--rev``: that commit's ``specvis`` from ``git archive``,
first on PYTHONPATH; then this tree's): ``cat DIR/*.safetensors > /dev/null`` timed (nothing dropped
from the page cache: what the previous step left cached stays), then ``scale_bench.py load DIR``
(``sv.load(DIR, threads=1)``, one torch thread): load seconds, peak resident memory (VmHWM), weights
bytes. The 1-minute load average is recorded beside each pair: on a shared machine the figures are
upper bounds. Benchmark, not a test: run it alone.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GIB = 2 ** 30


def read_seconds(directory: Path) -> tuple[float, int]:
    files = sorted(directory.glob("*.safetensors")) + sorted(directory.glob("t2i_*.pt"))
    t0 = time.perf_counter()
    subprocess.run(["cat", *map(str, files)], stdout=subprocess.DEVNULL, check=True)
    return time.perf_counter() - t0, sum(f.stat().st_size for f in files)


def load(directory: Path, pythonpath: str | None) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if pythonpath:
        env["PYTHONPATH"] = pythonpath
    r = subprocess.run([sys.executable, str(ROOT / "scripts" / "scale_bench.py"), "load", str(directory)],
                       capture_output=True, text=True, env=env, timeout=3600)
    for line in r.stdout.splitlines():
        if line.startswith("RESULT "):
            return json.loads(line[7:])
    raise RuntimeError(f"load failed ({r.returncode}): {r.stderr.strip().splitlines()[-1:]}")


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("dirs", nargs="+", type=Path)
    p.add_argument("--rev", help="also time this commit's loader (git archive of its specvis/)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    a = p.parse_args(argv)
    loaders = {"this tree": None}
    with tempfile.TemporaryDirectory() as tmp:
        if a.rev:
            archive = subprocess.run(["git", "-C", str(ROOT), "archive", a.rev, "specvis"], capture_output=True, check=True)
            subprocess.run(["tar", "-x", "-C", tmp], input=archive.stdout, check=True)
            loaders = {a.rev: tmp, **loaders}
        report = json.loads(Path(a.json).read_text()) if a.json and Path(a.json).exists() else {}
        for d in a.dirs:
            rows = []
            for _ in range(a.repeats):
                for name, path in loaders.items():
                    read_s, size = read_seconds(d)
                    r = load(d, path)
                    rows.append({"loader": name, "read_s": read_s, "load_s": r["load_s"], "peak_rss": r["peak_rss"],
                                 "weights_bytes": r["weights_bytes"], "file_bytes": size,
                                 "loadavg_1min": os.getloadavg()[0]})
                    print(f"{d.name} {name}: read {read_s:.2f} s, load {r['load_s']:.2f} s, peak {r['peak_rss'] / GIB:.2f} GiB "
                          f"(weights {r['weights_bytes'] / GIB:.2f}), load average {rows[-1]['loadavg_1min']:.1f}", flush=True)
            summary = {}
            for name in loaders:
                mine = [r for r in rows if r["loader"] == name]
                summary[name] = {"median_load_s": statistics.median(r["load_s"] for r in mine),
                                 "median_read_s": statistics.median(r["read_s"] for r in mine),
                                 "median_load_over_read": statistics.median(r["load_s"] / r["read_s"] for r in mine),
                                 "max_peak_rss": max(r["peak_rss"] for r in mine)}
            report[d.name] = {"runs": rows, "summary": summary, "cores": os.cpu_count()}
    if a.json:
        tmp_json = Path(a.json + ".tmp")
        tmp_json.write_text(json.dumps(report, indent=1) + "\n")
        os.replace(tmp_json, a.json)


if __name__ == "__main__":
    main()
