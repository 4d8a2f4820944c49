"""Plots beside benchmark results: every ``octavo bench`` JSON gets a PNG of the same name.

matplotlib is optional (it is in the ``dev`` extra): without it the JSON is still written and one line on
stderr says why no plot was, and how to get one.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any


def pyplot(target: str) -> Any:
    """``matplotlib.pyplot`` on the Agg backend, or None (after saying so) when matplotlib is missing."""
    try:
        import matplotlib
    except ImportError:
        print(f"octavo bench: matplotlib is not installed, so no plot at {target}; "
              "pip install matplotlib (or octavo[dev]) to get one.", file=sys.stderr)
        return None
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png_beside(json_path: str) -> str:
    """``results/x.json`` -> ``results/x.png``."""
    return str(Path(json_path).with_suffix(".png"))


def load_runs(paths: list[str]) -> list[dict[str, Any]]:
    """Earlier ``octavo bench serve --save-result`` files (e.g. the peer's), to draw in the same plot."""
    runs = []
    for path in paths:
        data = json.loads(Path(path).read_text())
        found = data.get("runs", [data]) if isinstance(data, dict) else data
        for run in found:
            if not isinstance(run, dict) or "levels" not in run:
                raise ValueError(f"{path}: not an `octavo bench serve` result (no 'levels')")
            runs.append(run)
    return runs
