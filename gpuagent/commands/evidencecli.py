"""``gpuagent evidence``: root's bundles of what a reboot destroys (:mod:`gpuagent.evidence`).

``gpuagent evidence SLOT`` makes one by hand; the units run ``--requests`` (the path unit's
dispatcher: it admits the agent's requests and starts ``gpuagent-evidence@SLOT.service``) and
``--requested SLOT`` (that instance); ``--purge`` removes every bundle.
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
import time
from collections.abc import Callable

import click

from gpuagent import config
from gpuagent.edges import bootid
from gpuagent.edges.runner import Outcome, Runner
from gpuagent.evidence import bundle, plan, requests
from gpuagent.evidence.gather import PATH, Gatherer, Limits
from gpuagent.evidence.store import DEFAULT, Store, StoreError
from gpuagent.logs import Event, EventLog, setup
from gpuagent.sources.bus import pci

__all__ = ["dispatch", "evidence", "gather"]

EX_NOPERM = 77  # sysexits.h, as `gpuagent clear`
_SYSTEMCTL_TIMEOUT = 30.0


def _start_unit(slot: str) -> str | None:
    """Start the slot's instance without waiting for it; why not, None if started."""
    unit = f"gpuagent-evidence@{slot}.service"
    result = Runner(timeout=_SYSTEMCTL_TIMEOUT).run(
        ["systemctl", "start", "--no-block", unit], {"PATH": PATH, "LC_ALL": "C"}
    )
    if result.outcome is Outcome.EXITED and result.exit_code == 0:
        return None
    return f"systemctl start {unit}: {result.stdout.strip() or result.outcome}"[:300]


def dispatch(
    cfg: config.Config,
    log: EventLog,
    *,
    directory: str = requests.DIRECTORY,
    store: Callable[[], Store] = Store,
    boot: str,
    now: float,
    start: Callable[[str], str | None] = _start_unit,
) -> int:
    """Take every request in ``directory``, admit the NVIDIA GPUs' slots under the rate
    limit and ``start`` each one's instance; returns the exit status (1: the requests or the
    evidence directory could not be used)."""
    try:
        names = requests.take(directory)
    except OSError as e:
        log(logging.ERROR, None, f"{directory}: cannot take the requests: {e.strerror or e}")
        return 1
    slots, refused = requests.choose(names, lambda slot: pci.is_gpu(cfg.sysfs_root, slot))
    for line in refused:
        log(logging.WARNING, None, f"evidence request {line}; ignored")
    if not slots:
        return 0
    try:
        opened = store()
    except StoreError as e:
        log(logging.ERROR, None, str(e))
        return 1
    try:
        admitted, said = requests.admit(opened, slots, boot, now, cfg.evidence_per_hour)
    finally:
        opened.close()
    for line in said:
        log(logging.INFO, None, f"evidence request {line}; no bundle")
    status = 0
    for slot in admitted:
        why = start(slot)
        if why is not None:
            log(logging.ERROR, None, why)
            status = 1
    return status


def gather(
    cfg: config.Config,
    log: EventLog,
    slot: str,
    *,
    trigger: str,
    store: Callable[[], Store] = Store,
    gatherer: Gatherer | None = None,
    boot: str,
    wall: Callable[[], float] = time.time,
) -> bundle.Made | None:
    """Make a bundle of the NVIDIA GPU at ``slot`` (``trigger`` ``hand`` or ``request``) and
    log where it is; None (said) when ``slot`` is no GPU or the directory cannot be used."""
    if not pci.is_gpu(cfg.sysfs_root, slot):
        log(logging.ERROR, None, f"{slot}: not an NVIDIA GPU on the bus; no bundle")
        return None
    try:
        opened = store()
    except StoreError as e:
        log(logging.ERROR, None, str(e))
        return None
    gatherer = gatherer or Gatherer(
        nvidia_smi=cfg.nvidia_smi,
        bug_report=shutil.which("nvidia-bug-report.sh", path=PATH),
        state_directory=os.path.dirname(DEFAULT),
        state_file=cfg.state_file,
        limits=Limits(report=cfg.evidence_report_timeout, total=cfg.evidence_max_bytes),
    )
    try:
        made = bundle.make(
            opened,
            gatherer,
            slot,
            trigger=trigger,
            boot=boot,
            caps=(cfg.evidence_max_bundles, cfg.evidence_max_bytes),
            wall=wall,
        )
    except OSError as e:
        log(
            logging.ERROR,
            None,
            f"{opened.path}: cannot write a bundle of {slot}: {e.strerror or e}",
        )
        return None
    finally:
        opened.close()
    failed = [
        f"{p.what} {p.outcome}" for p in made.parts if p.outcome not in ("exited", "read", "absent")
    ]
    failed += [f"{p.what} exit {p.exit_code}" for p in made.parts if p.exit_code not in (None, 0)]
    said = f"; {', '.join(failed)}" if failed else ""
    dropped = f"; dropped {len(made.dropped)} older" if made.dropped else ""
    log(
        logging.WARNING,
        Event.EVIDENCE_BUNDLE,
        f"GPU {slot}: evidence gathered in {made.path}{said}{dropped}",
        pci_slot=slot,
        evidence_bundle=made.path,
        evidence_trigger=trigger,
    )
    return made


@click.command()
@click.argument("slot", required=False)
@click.option(
    "--requests",
    "from_requests",
    is_flag=True,
    help="Take the agent's requests and start a unit for each one admitted "
    "(gpuagent-evidence.service).",
)
@click.option(
    "--requested",
    is_flag=True,
    help="Make SLOT's bundle for the agent's request (gpuagent-evidence@SLOT.service).",
)
@click.option("--purge", is_flag=True, help="Remove every bundle.")
@click.pass_context
def evidence(
    ctx: click.Context, slot: str | None, from_requests: bool, requested: bool, purge: bool
) -> None:
    """Gather SLOT's evidence bundle now (root): nvidia-smi -q, the kernel's and the agent's
    journal, the agent's state and nvidia-bug-report.sh, each under a timeout; prints the
    bundle's path.  Exit 1 on failure, 77 when not root."""
    if (slot is not None) + from_requests + purge != 1:
        raise click.UsageError("name one SLOT, or --requests, or --purge")
    if slot is not None and not plan.is_slot(slot):
        raise click.BadParameter(f"{slot!r} is not a PCI slot (0000:3b:00.0)", param_hint="SLOT")
    if os.geteuid() != 0:
        click.echo("gpuagent: evidence: root gathers evidence; run it as root", err=True)
        sys.exit(EX_NOPERM)
    path, required = ctx.obj["config_file"]
    cfg, error = config.salvage(path, required=required)
    setup(cfg.log_level)
    log = EventLog()
    if error is not None:
        log(logging.WARNING, Event.CONFIG_ERROR, f"{error}; using its valid settings only")
    if purge:
        try:
            store = Store()
            gone = store.remove_all()
        except (StoreError, OSError) as e:
            click.echo(f"gpuagent: {e}", err=True)
            sys.exit(1)
        click.echo(f"{DEFAULT}: {len(gone)} bundles removed")
        return
    if slot is None:
        sys.exit(dispatch(cfg, log, boot=bootid.current(), now=time.time()))
    made = gather(cfg, log, slot, trigger="request" if requested else "hand", boot=bootid.current())
    if made is None:
        sys.exit(1)
    click.echo(made.path)
