#!/usr/bin/python3
"""A fake ``nvidia-imex-ctl`` that replays a captured ``-N`` answer, driven by a JSON file.

The scenario is ``<this program's path>.json`` (tests link this file under the name
``nvidia-imex-ctl`` and rewrite the scenario between reads), one step:

- ``{"capture": "<file in data/corpus/imex>"}``: print that capture, exit 0;
  ``"replace": [["old", "new"], ...]`` first edits it (a node's row, a cell, the state);
- ``{"stdout": "text", "exit": 1}``: print that, exit with that status;
- ``{"hang": 30}``: sleep that long (a daemon that does not answer).

Each call appends its argv as one JSON line to ``<this program's path>.log``.
"""

from __future__ import annotations

import json
import os
import sys
import time

CORPUS = os.path.join(os.path.dirname(os.path.realpath(__file__)), "data", "corpus", "imex")


def main() -> int:
    with open(sys.argv[0] + ".log", "a", encoding="utf-8") as log:
        log.write(json.dumps(sys.argv[1:]) + "\n")
    with open(sys.argv[0] + ".json", encoding="utf-8") as f:
        step = json.load(f)
    if "hang" in step:
        time.sleep(float(step["hang"]))
        return 0
    if "capture" in step:
        with open(os.path.join(CORPUS, str(step["capture"])), encoding="utf-8") as f:
            text = f.read()
        for old, new in step.get("replace", []):
            text = text.replace(old, new)
        sys.stdout.write(text)
        return 0
    sys.stdout.write(str(step.get("stdout", "")))
    return int(step.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
