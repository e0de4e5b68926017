"""`make bench`: run every scenario, write `bench/results/<date>.{json,md}` and PNG plots.

`python -m bench.run [--quick] [--only api,history] [--backends sqlite,postgres] [--runs 3]`
"""

from __future__ import annotations

import argparse
import asyncio
import importlib
import json
import os
import platform
import subprocess
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

from bench.context import Context
from bench.report import markdown, plots

SCENARIOS = (
    "api",
    "telegram",
    "history",
    "search",
    "memory",
    "startup",
    "storm",
    "failover",
    "scaleout",
)
RESULTS = Path(__file__).resolve().parent / "results"


def machine() -> dict[str, Any]:
    """What the figures were measured on."""
    cpu = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    mem_kb = int(Path("/proc/meminfo").read_text().split()[1])
    try:
        pg = subprocess.run(
            [
                "psql",
                "-h",
                "127.0.0.1",
                "-U",
                "postgres",
                "-d",
                "test",
                "-tAc",
                "SHOW server_version",
            ],
            capture_output=True,
            text=True,
            timeout=10,
            check=False,
        ).stdout.strip()
    except OSError:
        pg = "unknown"
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gib": round(mem_kb / 1024 / 1024, 1),
        "python": platform.python_version(),
        "kernel": platform.release(),
        "postgresql": pg or "unknown",
    }


async def main_async(args: argparse.Namespace) -> Path:
    """Run the chosen scenarios and write the results; return the JSON path."""
    names = [n for n in (args.only.split(",") if args.only else SCENARIOS) if n]
    backends = tuple(b for b in args.backends.split(",") if b)
    results: dict[str, Any] = {
        "date": datetime.now(UTC).isoformat(timespec="seconds"),
        "quick": args.quick,
        "runs": args.runs,
        "machine": machine(),
        "scenarios": {},
    }
    with tempfile.TemporaryDirectory(prefix="herald-bench-") as tmp:
        ctx = Context(Path(tmp), backends, args.quick, args.runs)
        for name in names:
            module = importlib.import_module(f"bench.scenarios.{name}")
            print(f"== {module.TITLE}", flush=True)
            started = time.monotonic()
            data = await module.run(ctx)
            results["scenarios"][name] = {
                "title": module.TITLE,
                "seconds": round(time.monotonic() - started, 1),
                "runs": args.runs,
                "date": datetime.now(UTC).isoformat(timespec="seconds"),
                "data": data,
            }
            print(json.dumps(data, indent=1, default=str)[:4000], flush=True)
            path = write(results, args.quick)  # each scenario kept as soon as it is done
    return path


def write(results: dict[str, Any], quick: bool) -> Path:
    """`bench/results/<date>.{json,md}` and the plots. Scenarios run separately on one day add
    up in one file (a rerun replaces its own); returns the JSON path."""
    RESULTS.mkdir(exist_ok=True)
    stem = datetime.now(UTC).strftime("%Y-%m-%d") + ("-quick" if quick else "")
    path = RESULTS / f"{stem}.json"
    merged = dict(results)
    if path.exists():
        earlier = json.loads(path.read_text(encoding="utf-8"))
        merged["scenarios"] = {**earlier.get("scenarios", {}), **results["scenarios"]}
    path.write_text(json.dumps(merged, indent=1, default=str), encoding="utf-8")
    (RESULTS / f"{stem}.md").write_text(markdown(merged), encoding="utf-8")
    plots(merged, RESULTS, stem)
    return path


def main() -> None:
    """Parse the command line and run."""
    parser = argparse.ArgumentParser(prog="python -m bench.run", description=__doc__)
    parser.add_argument("--quick", action="store_true")
    parser.add_argument("--only", default="")
    parser.add_argument("--backends", default="sqlite,postgres")
    parser.add_argument("--runs", type=int, default=3)
    args = parser.parse_args()
    if args.quick and args.runs == 3:
        args.runs = 1
    path = asyncio.run(main_async(args))
    print(f"results: {path} and {path.with_suffix('.md')}")


if __name__ == "__main__":
    main()
