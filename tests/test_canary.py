"""``drain = "report"``, a fleet's first week on a host (issue 42): each hook that asks for a
drain (Slurm's ``slurm-check``, NHC's check through ``slurm-check --reason``,
node-problem-detector's condition) in both modes, the setting from the config to the state
(a reload too), and the verdict unchanged."""

from __future__ import annotations

import json
import os
import time
from typing import Any

import pytest
from click.testing import CliRunner

from gpuagent.commands import drain
from gpuagent.commands.cli import main
from gpuagent.config import Config
from gpuagent.configkeys import ConfigError, check_key
from gpuagent.schema import State
from tests.conftest import Host
from tests.states import SLOT
from tests.test_drain import REASON, Slurm, check, healthy, nhc, record, sick, slurm
from tests.test_status import write_state

# The fixtures: record keeps slurm-check's record of its drains in the test's directory.
__all__ = ["record", "slurm"]

WOULD = f"would drain: {REASON}"
NPD_SAID = f"{SLOT} recovery_action: reset_gpu"
STATUS_LINE = '    drain: report only (drain = "report")'


def mode(st: State, drain_mode: str | None) -> State:
    """``st`` as an agent with ``drain = drain_mode`` wrote it (None: an older agent's)."""
    out: dict[str, Any] = {k: v for k, v in st.items() if k != "drain"}
    if drain_mode is not None:
        out["drain"] = drain_mode
    return out  # type: ignore[return-value]


def test_the_key_is_ask_or_report() -> None:
    assert Config().drain == "ask"
    assert check_key("f.toml", "drain", "report") == "report"
    with pytest.raises(ConfigError, match=r"^f.toml: drain: expected one of ask, report, got "):
        check_key("f.toml", "drain", "never")


def test_check_config_names_a_bad_drain(tmp_path: str) -> None:
    conf = os.path.join(str(tmp_path), "gpuagent.toml")
    with open(conf, "w") as f:
        f.write('drain = "off"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config", conf])
    assert res.exit_code == 78 and "drain: expected one of ask, report" in res.stderr
    with open(conf, "w") as f:
        f.write('drain = "report"\n')
    res = CliRunner(mix_stderr=False).invoke(main, ["check-config", conf])
    assert (res.exit_code, res.stdout) == (0, f"{conf}: OK\n")


@pytest.mark.parametrize("drain_mode", [None, "ask"])
def test_slurm_check_asks_to_drain(slurm: Slurm, drain_mode: str | None) -> None:
    conf = write_state(slurm.dir, mode(sick(at=time.time()), drain_mode))
    said = f"gpuagent slurm-check: n1: draining: {REASON}\n"
    assert check(conf, "--node", "n1") == (0, said, "")
    assert slurm.calls() == ["show node n1 -o", f"update NodeName=n1 State=DRAIN Reason={REASON}"]


def test_slurm_check_reports_what_would_drain(slurm: Slurm, record: str) -> None:
    conf = write_state(slurm.dir, mode(sick(at=time.time()), "report"))
    env = {"SLURM_NODE_IS_HEALTHY": "yes"}
    assert check(conf, "--node", "n1", env=env) == (0, f"gpuagent slurm-check: n1: {WOULD}\n", "")
    assert slurm.calls() == [] and not os.path.exists(record)


def test_report_still_resumes_a_drain_of_its_own(slurm: Slurm) -> None:
    # Drained while it asked; the drop-in set "report" since: what it drained is its to end.
    conf = write_state(slurm.dir, sick(at=time.time()))
    assert check(conf, "--node", "n1")[0] == 0
    slurm.calls()
    slurm.show("IDLE+DRAIN", REASON)
    write_state(slurm.dir, mode(healthy(time.time()), "report"))
    code, out, _ = check(conf, "--node", "n1")
    assert code == 0 and "n1: resuming: no critical GPU problem" in out
    assert slurm.calls() == ["show node n1 -o", "update NodeName=n1 State=RESUME"]


@pytest.mark.parametrize(
    ("drain_mode", "out", "err"),
    [("ask", REASON + "\n", ""), ("report", "", WOULD + "\n")],
)
def test_reason_for_nhc(slurm: Slurm, drain_mode: str, out: str, err: str) -> None:
    # A hook that drains on anything printed on stdout must not: the report is on stderr.
    conf = write_state(slurm.dir, mode(sick(at=time.time()), drain_mode))
    assert check(conf, "--reason") == (0, out, err)
    write_state(slurm.dir, mode(healthy(time.time()), drain_mode))
    assert check(conf, "--reason") == (0, "", "")
    assert slurm.calls() == []


@pytest.mark.parametrize(
    ("drain_mode", "said"),
    [
        ("ask", f"die 1: {REASON}\nrc 1\n"),
        ("report", f"log: check_gpuagent: {WOULD}\nrc 0\n"),
    ],
)
def test_nhc_check(tmp_path: str, drain_mode: str, said: str) -> None:
    assert nhc(str(tmp_path), mode(sick(at=time.time()), drain_mode)).stdout == said
    assert nhc(str(tmp_path), mode(healthy(time.time()), drain_mode)).stdout == "rc 0\n"


@pytest.mark.parametrize(
    ("drain_mode", "condition", "event"),
    [
        ("ask", (1, f"critical: {NPD_SAID}\n"), (0, "ok: no warning\n")),
        ("report", (0, f"ok; would drain: {NPD_SAID}\n"), (1, f"would drain: {NPD_SAID}\n")),
    ],
)
def test_node_problem_detector(
    tmp_path: str, drain_mode: str, condition: tuple[int, str], event: tuple[int, str]
) -> None:
    # The permanent rule's exit 1 sets the GPUProblem condition a remedy system acts on; the
    # temporary rule's exit 1 is an event, which drains nothing.
    conf = write_state(str(tmp_path), mode(sick(at=time.time()), drain_mode))
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd"])
    assert (res.exit_code, res.stdout) == condition
    res = runner.invoke(main, ["--config", conf, "status", "--format=npd-warning"])
    assert (res.exit_code, res.stdout) == event


def test_npd_report_with_a_warning_and_nothing_critical_is_the_warning() -> None:
    st = mode(sick(severity="warning", at=time.time()), "report")
    assert drain.npd(st, "", time.time())[0] == 0
    assert drain.npd_warning(st, "", time.time()) == (1, f"warning: {NPD_SAID}")
    assert drain.would(st, time.time()) == ""
    stale = mode(sick(at=time.time() - 600), "report")
    assert drain.would(stale, time.time()) == ""
    assert drain.npd(stale, "", time.time())[0] == 2


@pytest.mark.parametrize("drain_mode", ["ask", "report"])
def test_status_keeps_its_verdict_and_says_report_only(tmp_path: str, drain_mode: str) -> None:
    conf = write_state(str(tmp_path), mode(sick(at=time.time()), drain_mode))
    runner = CliRunner(mix_stderr=False)
    res = runner.invoke(main, ["--config", conf, "status"])
    assert res.exit_code == 2  # critical either way
    shown = [line for line in res.stdout.splitlines() if line.startswith("    drain:")]
    assert [line.startswith(STATUS_LINE) for line in shown] == (
        [True] if drain_mode == "report" else []
    )
    res = runner.invoke(main, ["--config", conf, "status", "--json"])
    got = json.loads(res.stdout)
    assert (res.exit_code, got["health"], got["drain"]) == (2, "critical", drain_mode)


def test_a_state_with_another_drain_is_not_the_agent_s(tmp_path: str) -> None:
    conf = write_state(str(tmp_path), mode(sick(at=time.time()), "maybe"))
    res = CliRunner(mix_stderr=False).invoke(main, ["--config", conf, "status"])
    assert res.exit_code == 3 and "drain" in res.stdout + res.stderr


def test_the_agent_writes_it_and_a_reload_applies_it(host: Host) -> None:
    agent = host.make_agent()
    st = host.tick().state
    assert st["drain"] == "ask"
    standing = agent.configure(agent.config._replace(drain="report"))
    assert standing.state["drain"] == "report"
    after = host.tick().state
    assert after["drain"] == "report"
    # The verdict is the same in both: only the hooks read the setting.
    assert after["status"] == st["status"]
    assert [g["health"] for g in after["gpus"]] == [g["health"] for g in st["gpus"]]
