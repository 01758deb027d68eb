"""``gpuagent clear SLOT [KIND] [--all]``: an operator's clear, sent to the system journal
(thin; what a clear may end is :mod:`gpuagent.sources.kernel.clears`').

The running agent reads the entry in order with the kernel's records and honours it only
from ``_UID=0``, which journald sets from the sender's credentials; the person behind it is
the login uid journald stamps beside it, else ``SUDO_USER``.
"""

from __future__ import annotations

import os
import sys
from typing import Any, NoReturn

import click

from gpuagent import config

__all__ = ["EX_NOPERM", "clear", "send"]

EX_NOPERM = 77  # sysexits.h: only root's clears count


def send(**fields: Any) -> None:
    """Send one structured entry to the system journal."""
    from systemd import journal  # noqa: PLC0415

    journal.send(**fields)


def _held(state_file: str, slot: str) -> tuple[dict[str, bool] | None, str]:
    """The kinds of the problems the GPU in ``slot`` (:data:`clears.HOST`: the host) has now,
    each with whether it is held
    unread (its source cannot look), or None without a state, and then the note for the
    clear's line: the agent is not running, or its state could not be read (a refused read is
    said, not taken for a stopped agent)."""
    from gpuagent.commands.slurmcheck import state_reason  # noqa: PLC0415
    from gpuagent.sources.kernel import clears  # noqa: PLC0415

    st, why = state_reason(state_file)
    if st is not None:
        if slot == clears.HOST:
            mine = list(st["host_problems"])
        else:
            mine = [p for g in st["gpus"] if g["pci_slot"] == slot for p in g["problems"]]
        return {p["kind"]: "unread_since" in p for p in mine}, ""
    if not os.path.lexists(state_file):
        return None, " (gpuagent is not running: it applies the clear when it starts)"
    return None, f" ({why}: the agent applies the clear as it reads the journal)"


def _refuse_host(ctx: click.Context, kind: str) -> NoReturn:
    """``gpuagent clear host KIND`` of a host problem that takes no clear (read live, and
    not held unread): say how it ends (the state's ``ends``), exit 1."""
    from gpuagent.commands.slurmcheck import state_reason  # noqa: PLC0415
    from gpuagent.sources.kernel import clears  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    st, _ = state_reason(config.salvage(path, required=required)[0].state_file)
    held = {p["kind"]: p.get("ends") for p in st["host_problems"]} if st is not None else {}
    refused = clears.host_refusal(kind, held.get(kind))
    if st is not None and kind not in held and kind != clears.ALL:
        refused = f"the host has no {kind} problem; {refused}"
    click.echo(f"gpuagent: cannot clear host {kind}: {refused}", err=True)
    sys.exit(1)


@click.command("clear")
@click.argument("slot")
@click.argument("kind", required=False)
@click.option("--all", "every", is_flag=True, help="Every problem of the GPU that latches.")
@click.pass_context
def clear(ctx: click.Context, slot: str, kind: str | None, every: bool) -> None:
    """After a repair, end the GPU's problems that hold until the next boot (xid,
    init_failed, pcie_error), or forget a GPU gone from the bus for good (gone_from_bus); root
    only.  SLOT host: the host's fabricmanager_restarted, after the GPUs' reset.  A
    problem read live is refused (exit 1), saying how it ends, unless it is held unread (its
    source cannot look: the nvidia module unloaded, nvidia-smi missing, the system bus)."""
    import pwd  # noqa: PLC0415

    from gpuagent.logs import Event  # noqa: PLC0415
    from gpuagent.sources.kernel import clears  # noqa: PLC0415

    path, required = ctx.obj["config_file"]
    state_file = config.salvage(path, required=required)[0].state_file
    if slot.lower() == clears.HOST:
        where, what = clears.HOST, kind or clears.ALL
        held, later = _held(state_file, where)
        # The host's latching kinds, and a live one held unread, take a clear by name.
        if every or not (what in clears.HOST_LATCHING or (held or {}).get(what)):
            _refuse_host(ctx, what)
        refused = None
    else:
        found = clears.slot_of(slot)
        if found is None:
            raise click.BadParameter(
                f"{slot!r} is not a PCI slot (0000:3b:00.0)", param_hint="SLOT"
            )
        if every == (kind is not None):
            raise click.UsageError("name one KIND, or --all")
        where, what = found, clears.ALL if every else str(kind)
        held, later = _held(state_file, where)
        refused = clears.refusal(what)
    # A live problem held unread (no read can end it now) is ended by its own name.
    if refused is not None and not (held or {}).get(what):
        click.echo(f"gpuagent: cannot clear {where} {what}: {refused}", err=True)
        sys.exit(1)
    if os.geteuid() != 0:
        click.echo("gpuagent: clear: only root's clears count; run it as root", err=True)
        sys.exit(EX_NOPERM)
    if held is not None and refused is None:
        live = sorted({k for k in held if clears.refusal(k) is not None})
        ends = [k for k in held if clears.covers(what, k) or (held[k] and k == what)]
        if not ends:
            said = f"; {', '.join(live)} read live: it ends with its cause" if live else ""
            click.echo(f"gpuagent: {where} has no {what} problem to clear{said}", err=True)
            sys.exit(1)
    by = pwd.getpwuid(os.getuid()).pw_name
    # The person sudo ran it for; journald adds the login uid (_AUDIT_LOGINUID) itself.
    person = os.environ.get("SUDO_USER") or None
    who = f"{person} (as {by})" if person and person != by else by
    said = "host" if where == clears.HOST else f"GPU {where}"
    try:
        send(
            MESSAGE=f"{said}: {what} cleared by {who}",
            MESSAGE_ID=Event.OPERATOR_CLEAR.value,
            PRIORITY="5",
            SYSLOG_IDENTIFIER="gpuagent",
            **clears.fields(where, what, by, person),
        )
    except OSError as e:
        click.echo(f"gpuagent: cannot send the clear to the journal: {e.strerror or e}", err=True)
        sys.exit(1)
    click.echo(f"{where}: {what} cleared by {who}{later}")
