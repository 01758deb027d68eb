#!/usr/bin/python3
"""A fake ``nvidia-smi`` that replays real captures, driven by a JSON scenario file.

The scenario is ``$FAKE_NVIDIA_SMI_SCENARIO``, else ``<this program's path>.json``.  It holds
one step (tests rewrite it between ticks):

- ``{"capture": "<file in data/corpus/csv>", "slots": ["0000:18:00.0", ...]}``: answer a
  ``--query-gpu`` from the capture (see ``replay.py``); ``slots`` makes one GPU per slot.
- ``{"error": "<file in data/corpus/errors>", "exit": 18}``: print a captured error, exit.
- ``{"stdout": "text", "exit": 0}`` or ``{"stdout_hex": "ff00", ...}``: print that, exit.
- ``"repeat": N`` with ``stdout``: print it N times (floods).
- ``{"hang": 30, "ignore_term": true}``: sleep, optionally ignoring SIGTERM.
- ``{"grandchild_hang": 30, ...}``: first leave a grandchild in its own session holding
  stdout for that long, then answer as the rest of the step says.
- ``"prepend": "<file in data/corpus/errors>"``: print that captured text first (a warning
  nvidia-smi prints beside valid data, e.g. infoROM, or one GPU's error line); ``"append"``:
  print it after the rows.
- ``"override": {"<slot>": {"field": "cell"}}`` with ``capture`` and ``slots``: those cells
  in that GPU's row (``[GPU requires reset]``, ``Reset``).
- ``"reject": ["field", ...]``: fields this "driver" does not know (exit 2 with the message).
- ``"nvlink": {"status": "<file>", "errorcounters": "<file>", "exit": 0}`` answers
  ``nvlink --status`` / ``-s`` and ``nvlink --errorcounters`` / ``-e`` from captures in
  data/corpus/nvlink (or errors), made one GPU per ``slots`` entry with ``"override"`` applied
  (see ``replay.nvlink_answer``); ``"hang"`` inside it hangs those calls only.  A step
  without ``"nvlink"`` answers them with nothing, as drivers before 595 do on a GPU without
  NVLink, or with its error.

- ``"apps": [{"slot": "<slot>", "pid": 4242, "name": "python3", "mib": 1024}, ...]``
  answers ``--query-compute-apps`` (the fields asked, in the format asked, the agent's
  ``gpu_uuid,pid,used_memory`` or any other; ``"mib"`` may be a cell such as ``"[N/A]"``),
  each process on the GPU of ``slots`` in that slot; ``"name"`` is printed as nvidia-smi
  prints ``process_name``, unquoted, and is the process's comm in the fake host's proc tree
  (``fakehost.write_proc``); or
  ``"apps": {"capture": "<file in data/corpus/csv>", "slot": "<slot>"}`` replays a real
  capture's processes on that GPU; ``"apps": {"stdout": "...", "exit": 6}`` prints that.
  A step without ``"apps"`` answers with no process (an idle GPU).
- ``"query": "<text>"`` answers ``nvidia-smi -q`` and ``nvidia-smi -q -i SLOT`` with that
  text, exit 0 (a vGPU guest's licence, tests/test_vgpu.py; a board's RMA packet,
  tests/test_rma.py); a step without it answers ``-q`` as any other call.

- Loop mode (``-l SEC``, ``--loop=SEC``, ``-lms MS``, ``--loop-ms=MS`` with ``--query-gpu``)
  answers as above once per interval, with no line between two samples, until killed,
  reading the scenario again before each sample (a test changes it mid-loop): a step's
  ``"hang"`` stalls the loop that long, an ``"error"`` or a non-zero ``"exit"`` without rows
  is printed once and ends it with that status, as NVML failing does; a lost GPU is the
  step's ``"append"`` of ``gpu-is-lost-linux.txt`` beside the others' rows, each sample.
  ``"loop_ms"`` in the step overrides the interval asked for (tests run fast); the loop ends
  by itself when its scenario file is gone, or after ``FAKE_NVIDIA_SMI_LOOP_MAX`` s (300).

Each call appends its argv as one JSON line to ``"log"`` when the scenario names one.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.realpath(__file__))))

from tests import replay


def _scenario() -> dict[str, Any]:
    path = os.environ.get("FAKE_NVIDIA_SMI_SCENARIO") or sys.argv[0] + ".json"
    with open(path, encoding="utf-8") as f:
        step: dict[str, Any] = json.load(f)
    return step


def _arg(prefix: str) -> str | None:
    return next((a[len(prefix) :] for a in sys.argv[1:] if a.startswith(prefix)), None)


def main() -> int:
    step = _scenario()
    # Before the call is logged: a test that waits for the log (conftest.CallClock) knows
    # that a SIGTERM from then on is ignored.
    if step.get("ignore_term"):
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log = step.get("log")
    if isinstance(log, str):
        try:
            with open(log, "a", encoding="utf-8") as f:
                f.write(json.dumps(sys.argv[1:]) + "\n")
        except OSError:
            pass
    if "grandchild_hang" in step and os.fork() == 0:
        os.setsid()
        if os.fork() == 0:
            time.sleep(float(step["grandchild_hang"]))
        os._exit(0)
    if "hang" in step:
        time.sleep(float(step["hang"]))
        return 0
    if sys.argv[1:2] == ["nvlink"]:
        return _nvlink(step)
    if _arg("--query-compute-apps=") is not None:
        return _apps(step)
    if sys.argv[1:2] == ["-q"] and len(sys.argv) in (2, 4) and "query" in step:
        sys.stdout.write(str(step["query"]))
        return 0
    query = (_arg("--query-gpu=") or "").split(",")
    rejected = [f for f in query if f in step.get("reject", [])]
    if rejected:
        sys.stdout.write(f'Field "{rejected[0]}" is not a valid field to query.\n\n')
        return 2
    loop = _loop_seconds()
    if loop is not None:
        return _loop(step, query, loop)
    return _answer(step, query)


def _loop_seconds() -> float | None:
    """The interval of loop mode asked for (s), or None: one answer."""
    args = sys.argv[1:]
    for flag, scale in (("-lms", 0.001), ("-l", 1.0)):
        if flag in args[:-1]:
            return float(args[args.index(flag) + 1]) * scale
    for prefix, scale in (("--loop-ms=", 0.001), ("--loop=", 1.0)):
        value = _arg(prefix)
        if value is not None:
            return float(value) * scale
    return None


def _loop(step: dict[str, Any], query: list[str], interval: float) -> int:
    """Loop mode: one answer per interval until killed, the scenario read before each."""
    end = time.monotonic() + float(os.environ.get("FAKE_NVIDIA_SMI_LOOP_MAX", "300"))
    while time.monotonic() < end:
        if "hang" in step:
            time.sleep(float(step["hang"]))
        else:
            code = _answer(step, query)
            if code and "capture" not in step:
                return code
        time.sleep(float(step.get("loop_ms", interval * 1000)) / 1000)
        try:
            step = _scenario()
        except (OSError, ValueError):
            return 0  # the test is over
    return 0


def _answer(step: dict[str, Any], query: list[str]) -> int:
    """One answer to ``--query-gpu``, as the step says; its exit status."""
    code = int(step.get("exit", 0))
    out = sys.stdout.buffer
    if "prepend" in step:
        with open(os.path.join(replay.CORPUS, "errors", str(step["prepend"])), "rb") as first:
            out.write(first.read())
    if "capture" in step:
        cap = replay.load(str(step["capture"]))
        text, answered = replay.answer(
            cap, query, _arg("--format=") or "csv", step.get("slots"), step.get("override")
        )
        # A rejected field is exit 2 whatever the step says; else the step's exit status
        # (14 beside an infoROM warning, 255 beside a lost GPU's error line).
        code = answered or code
        out.write(text.encode())
    elif "error" in step:
        with open(os.path.join(replay.CORPUS, "errors", str(step["error"])), "rb") as captured:
            out.write(captured.read())
    else:
        if "stdout_hex" in step:
            data = bytes.fromhex(str(step["stdout_hex"]))
        else:
            data = str(step.get("stdout", "")).encode()
        for _ in range(int(step.get("repeat", 1))):
            out.write(data)
    if "append" in step:
        with open(os.path.join(replay.CORPUS, "errors", str(step["append"])), "rb") as last:
            out.write(last.read())
    out.flush()
    return code


def _apps(step: dict[str, Any]) -> int:
    asked = (_arg("--query-compute-apps=") or "").split(",")
    fmt = set((_arg("--format=") or "csv").split(","))
    apps = step.get("apps", [])
    if isinstance(apps, dict) and "stdout" in apps:
        sys.stdout.write(str(apps["stdout"]))
        return int(apps.get("exit", 0))
    slots = list(step.get("slots") or [])
    uuid = {slot: replay.gpu_uuid(slot) for slot in slots}
    if isinstance(apps, dict):
        apps = replay.apps_capture(str(apps["capture"]), str(apps["slot"]))
    out = [] if "noheader" in fmt else [", ".join(asked)]
    for app in apps:
        mib = app.get("mib")
        memory = (
            str(mib) if isinstance(mib, str) else f"{mib}" if "nounits" in fmt else f"{mib} MiB"
        )
        cells = {
            "gpu_uuid": uuid.get(str(app["slot"]), "GPU-unknown"),
            "pid": str(app["pid"]),
            "process_name": str(app.get("name", "python3")),
            "used_memory": memory,
            "used_gpu_memory": memory,
        }
        out.append(", ".join(cells.get(f, "[N/A]") for f in asked))
    sys.stdout.write("".join(f"{line}\n" for line in out))
    return 0


_NVLINK_ARGS = {"--status": "status", "-s": "status", "--errorcounters": "errorcounters"}


def _nvlink(step: dict[str, Any]) -> int:
    which = next((_NVLINK_ARGS.get(a) for a in sys.argv[2:] if a in _NVLINK_ARGS), None)
    if which is None and "-e" in sys.argv[2:]:
        which = "errorcounters"
    nv = step.get("nvlink")
    if not isinstance(nv, dict):
        if "error" in step:
            with open(os.path.join(replay.CORPUS, "errors", str(step["error"])), "rb") as f:
                sys.stdout.buffer.write(f.read())
            return int(step.get("exit", 0))
        return 0
    if "hang" in nv:
        time.sleep(float(nv["hang"]))
        return 0
    if which is None or which not in nv:
        sys.stdout.write("nvidia-smi nvlink: this fake knows only --status and --errorcounters\n")
        return 2
    text = replay.nvlink_answer(
        replay.nvlink_capture(str(nv[which])),
        step.get("slots"),
        nv.get("override"),
        counters=which == "errorcounters",
        links=int(nv.get("links", 18)),
    )
    sys.stdout.write(text)
    sys.stdout.flush()
    return int(nv.get("exit", 0))


if __name__ == "__main__":
    sys.exit(main())
