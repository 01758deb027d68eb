"""The NVLink links up this boot, remembered under $STATE_DIRECTORY: ``nvlink_down`` for a
link that went down while the agent was away (a restart), forgotten after a reboot."""

from __future__ import annotations

import json
import logging
import os

from gpuagent.edges import bootid
from gpuagent.logs import EventLog
from gpuagent.sources.nvlink.linksup import FILE, LinksUp
from tests.conftest import Host
from tests.test_nvidia_scenarios import nvlink


def remembered(directory: str) -> dict[str, object]:
    with open(os.path.join(directory, FILE), encoding="utf-8") as f:
        data: dict[str, object] = json.load(f)
    return data


def kinds(host: Host) -> dict[str, list[str]]:
    st = host.state
    return {g["pci_slot"]: [p["kind"] for p in g["problems"]] for g in st["gpus"] if g["problems"]}


def recorder() -> tuple[EventLog, list[logging.LogRecord]]:
    records: list[logging.LogRecord] = []

    class Keep(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            records.append(record)

    logger = logging.getLogger(f"test.linksup.{id(records)}")
    logger.handlers[:] = [Keep()]
    logger.propagate = False
    return EventLog(logger), records


def test_a_link_down_while_the_agent_was_away_is_nvlink_down(host: Host, tmp_path: str) -> None:
    directory = os.path.join(str(tmp_path), "lib")
    os.mkdir(directory)
    nvlink(host)
    host.make_agent(state_directory=directory, nvlink_interval=10.0)
    host.tick(2)
    data = remembered(directory)
    assert data["boot_id"] == bootid.current() != ""
    links_up = data["links_up"]
    assert isinstance(links_up, dict) and len(links_up) == 8
    assert all(v == list(range(18)) for v in links_up.values())
    # The agent restarts (an upgrade); meanwhile link 14 of every GPU went down: no GPU has
    # fewer links than the others, and only the memory of this boot says they were up.
    nvlink(host, override={slot: {"14": "<inactive>"} for slot in host.slots})
    host.make_agent(state_directory=directory, nvlink_interval=10.0)
    host.tick()
    assert kinds(host) == {slot: ["nvlink_down"] for slot in host.slots}
    assert (
        "link 14 down, up earlier in this boot" in host.state["gpus"][0]["problems"][0]["message"]
    )
    # What the file holds stays what was up this boot: down now is not forgotten.
    assert remembered(directory)["links_up"] == links_up


def test_another_boots_file_is_forgotten(host: Host, tmp_path: str) -> None:
    directory = str(tmp_path)
    nvlink(host)
    host.make_agent(state_directory=directory, nvlink_interval=10.0)
    host.tick()
    data = remembered(directory)
    # The host rebooted: the same file, another boot's id.
    with open(os.path.join(directory, FILE), "w", encoding="utf-8") as f:
        json.dump({**data, "boot_id": "another-boot"}, f)
    nvlink(host, override={slot: {"14": "<inactive>"} for slot in host.slots})
    host.make_agent(state_directory=directory, nvlink_interval=10.0)
    host.tick()
    assert kinds(host) == {}
    assert remembered(directory)["boot_id"] == bootid.current()
    assert remembered(directory)["links_up"] == {
        k: [n for n in range(18) if n != 14]
        for k in data["links_up"]  # type: ignore[attr-defined]
    }


def test_the_boot_is_the_one_the_agent_is_given(host: Host, tmp_path: str) -> None:
    directory = str(tmp_path)
    nvlink(host)
    asked: list[str] = []

    def boot() -> str:
        asked.append("a" * 32)
        return asked[-1]

    host.make_agent(state_directory=directory, nvlink_interval=10.0, boot=boot)
    host.tick()
    assert remembered(directory)["boot_id"] == "a" * 32
    assert len(asked) == 1  # read once, for the known GPUs and the links alike
    # Another boot, as the agent is told: what was up in the first is forgotten.
    nvlink(host, override={slot: {"14": "<inactive>"} for slot in host.slots})
    host.make_agent(state_directory=directory, nvlink_interval=10.0, boot=lambda: "b" * 32)
    host.tick()
    assert kinds(host) == {}
    assert remembered(directory)["boot_id"] == "b" * 32


def test_without_a_state_directory_nothing_is_remembered(tmp_path: str) -> None:
    log, records = recorder()
    links = LinksUp(None, log, boot="b")
    links.update({"GPU-1": {0, 1}})
    assert links.links == {"GPU-1": {0, 1}}
    assert os.listdir(tmp_path) == [] and records == []
    # Nor without a boot id: the file could not say which boot it is of.
    LinksUp(str(tmp_path), log, boot="").update({"GPU-1": {0}})
    assert os.listdir(tmp_path) == []


def test_a_bad_file_is_one_warning_and_nothing_remembered(tmp_path: str) -> None:
    path = os.path.join(tmp_path, FILE)
    for text in ("{not json", '{"boot_id": "b", "links_up": {"GPU-1": [0, "x"]}}', "[]", "{}"):
        with open(path, "w", encoding="utf-8") as f:
            f.write(text)
        log, records = recorder()
        links = LinksUp(str(tmp_path), log, boot="b")
        assert links.links == {}
        assert [r.levelno for r in records] == [logging.WARNING], text
        message = records[0].getMessage()
        assert message.startswith(f"{path}: cannot read the NVLink links up this boot: ")
        assert "\n" not in message


def test_an_unwritable_directory_is_one_warning_and_a_problem(tmp_path: str) -> None:
    directory = os.path.join(tmp_path, "not-a-directory")
    with open(directory, "w", encoding="utf-8"):
        pass  # even root cannot write below a file
    log, records = recorder()
    links = LinksUp(directory, log, boot="b")
    assert links.error is None
    links.update({"GPU-1": {0}})
    links.update({"GPU-1": {0, 1}})
    assert [r.levelno for r in records] == [logging.WARNING]
    assert "cannot remember the NVLink links up this boot" in records[0].getMessage()
    assert links.error is not None and links.error.startswith(f"{directory}/{FILE}: ")
    assert links.links == {"GPU-1": {0, 1}}  # still remembered in memory
