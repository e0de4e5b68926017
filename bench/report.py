"""The Markdown table and PNG plots of a results file; each scenario renders its own part."""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any


def markdown(results: dict[str, Any]) -> str:
    """The whole report: machine, then one section per scenario."""
    m = results["machine"]
    lines = [
        f"# Herald benchmarks, {results['date']}"
        + (" (quick: not for quoting)" if results["quick"] else ""),
        "",
        f"Machine: {m['cpu']}, {m['cores']} cores, {m['memory_gib']} GiB; Python {m['python']}, "
        f"Linux {m['kernel']}, PostgreSQL {m['postgresql']}. "
        "Each figure is the median of the runs, with (min–max) when there were several.",
        "",
    ]
    for name, scenario in results["scenarios"].items():
        module = importlib.import_module(f"bench.scenarios.{name}")
        runs = scenario.get("runs", results["runs"])
        when = scenario.get("date", results["date"])
        lines += [
            f"## {scenario['title']}",
            "",
            f"{runs} run(s), {when}, {scenario['seconds']:.0f} s.",
            "",
            module.table(scenario["data"]),
            "",
        ]
    return "\n".join(lines)


def plots(results: dict[str, Any], folder: Path, stem: str) -> list[Path]:
    """One PNG per scenario that has a plot; the paths written."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    for name, scenario in results["scenarios"].items():
        module = importlib.import_module(f"bench.scenarios.{name}")
        draw = getattr(module, "plot", None)
        if draw is None:
            continue
        fig = plt.figure(figsize=(9, 4))
        draw(fig, scenario["data"])
        fig.suptitle(scenario["title"])
        fig.tight_layout()
        path = folder / f"{stem}-{name}.png"
        fig.savefig(path, dpi=100)
        plt.close(fig)
        written.append(path)
    return written
