"""``gpuagent status`` start-up latency against ``python3 -c pass`` (ratio of medians).

A second floor is the libraries the command cannot do without, imported alone: click (the
CLI), tomllib (the config file) and json (the state file).

Both run with Debian's /usr/bin/python3, byte-compiled as the package installs them, against a
state file of an 8-GPU host.  The commands take turns, one run each a round, so that a change
of load on the box weighs on all of them alike.  Usage::

    /usr/bin/python3 -m bench.status_latency [--runs 30]
"""

from __future__ import annotations

import argparse
import compileall
import os
import statistics
import subprocess
import sys
import tempfile
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PYTHON = "/usr/bin/python3"


def medians_ms(commands: list[list[str]], runs: int, env: dict[str, str]) -> list[float]:
    """Each command's median wall time (ms) over ``runs`` rounds of one run each."""
    times: list[list[float]] = [[] for _ in commands]
    for _ in range(runs):
        for argv, took in zip(commands, times, strict=True):
            start = time.perf_counter()
            subprocess.run(
                argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=False
            )
            took.append(time.perf_counter() - start)
    return [statistics.median(took) * 1000 for took in times]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    compileall.compile_dir(os.path.join(REPO, "gpuagent"), quiet=1)
    with tempfile.TemporaryDirectory() as d:
        from bench.sim import make_host, scripted_agent  # noqa: PLC0415
        from gpuagent import report, state  # noqa: PLC0415

        slots = make_host(os.path.join(d, "sys"), 8)
        sim = scripted_agent(os.path.join(d, "sys"), "/usr/bin/nvidia-smi", slots)
        ticked = sim.agent.tick()
        path = os.path.join(d, "state.json")
        state.write(path, report.finished(ticked, "ticks", ticked.state["updated_at"]))
        conf = os.path.join(d, "gpuagent.toml")
        with open(conf, "w") as f:
            f.write(f'state_file = "{path}"\n')
        env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": REPO, "GPUAGENT_CONFIG": conf}
        # The console script the package installs (setuptools' entry-point form).
        script = os.path.join(d, "gpuagent")
        with open(script, "w") as f:
            f.write(
                f"#!{PYTHON}\nimport sys\nfrom gpuagent.commands.entry import main\n"
                "if __name__ == '__main__':\n    sys.exit(main())\n"
            )
        os.chmod(script, 0o755)
        base, human, as_json, click, libraries = medians_ms(
            [
                [PYTHON, "-c", "pass"],
                [script, "status"],
                [script, "status", "--json"],
                [PYTHON, "-c", "import click"],
                [PYTHON, "-c", "import click, json, tomllib"],
            ],
            args.runs,
            env,
        )
    print(f"{'command':<34} {'median ms':>9} {'ratio':>6}")
    for name, ms in (
        ("python3 -c pass", base),
        ("python3 -c 'import click'", click),
        ("... 'import click, json, tomllib'", libraries),
        ("gpuagent status", human),
        ("gpuagent status --json", as_json),
    ):
        print(f"{name:<34} {ms:>9.1f} {ms / base:>6.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
