"""Run a benchmark script against ANOTHER copy of the octavo tree in this interpreter, without reinstalling.

    python benchmarks/tree_run.py .base .base/benchmarks/nano_host_gap.py --out /tmp/base.json --runs defaults

``pip install -e .`` maps ``octavo`` / ``octavo.core`` / ``octavo.plugins`` to this checkout's ``sdk`` / ``core`` /
``plugins`` through an editable-install finder on ``sys.meta_path`` whose ``MAPPING`` it reads at each import. This
points that mapping at ``ROOT`` (e.g. a ``git archive`` of an older commit) before anything imports octavo, then runs
``SCRIPT`` as ``__main__`` with the remaining arguments: a same-call A/B of two trees on one device (session 11: the
nano-vllm key, the session-10 tree against the current one) in fresh processes, no reinstall between them. Refuses
to run (exit 2) if no such finder is installed or ``ROOT`` lacks the three folders, rather than measure the wrong tree.
"""

from __future__ import annotations

import os
import runpy
import sys


def point_at(root: str) -> dict:
    """Point the editable finder's octavo mapping at ``root``; returns the new mapping."""
    root = os.path.abspath(root)
    for finder in sys.meta_path:
        mapping = getattr(sys.modules.get(getattr(finder, "__module__", ""), None), "MAPPING", None)
        if isinstance(mapping, dict) and "octavo" in mapping:
            new = {name: os.path.join(root, os.path.basename(path)) for name, path in mapping.items()}
            missing = [p for p in new.values() if not os.path.isdir(p)]
            if missing:
                raise SystemExit(f"tree_run: {root} lacks {missing}")
            mapping.clear()
            mapping.update(new)
            return new
    raise SystemExit("tree_run: no editable-install finder for octavo on sys.meta_path (pip install -e . first)")


def main() -> None:
    if len(sys.argv) < 3:
        raise SystemExit(__doc__)
    if "octavo" in sys.modules:
        raise SystemExit("tree_run: octavo is already imported")
    root, script = sys.argv[1], sys.argv[2]
    mapping = point_at(root)
    sys.argv = [script, *sys.argv[3:]]
    sys.path[0] = os.path.dirname(os.path.abspath(script))  # the script's own folder, as `python script` has it
    import octavo

    print(f"tree_run: octavo from {os.path.dirname(octavo.__file__)} ({mapping})", flush=True)
    if not os.path.abspath(octavo.__file__).startswith(os.path.abspath(root)):
        raise SystemExit(f"tree_run: octavo imported from {octavo.__file__}, not {root}")
    runpy.run_path(script, run_name="__main__")


if __name__ == "__main__":
    main()
