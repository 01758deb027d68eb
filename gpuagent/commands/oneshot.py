"""The one-shot commands: ``gpuagent detect`` (one PCI scan) and ``gpuagent probe`` (one
nvidia-smi run: a table of what it says about each GPU, :mod:`gpuagent.commands.probetable`),
each printing what the agent would see and returning an exit status."""

from __future__ import annotations

import json
import shutil
import sys
from collections.abc import Callable
from dataclasses import asdict
from typing import Any

import click

from gpuagent import config
from gpuagent.commands import probetable
from gpuagent.commands.status import clean
from gpuagent.edges.runner import Runner
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.bus import pci
from gpuagent.sources.probe.probe import Prober, lookup
from gpuagent.sources.probe.probing import gate
from gpuagent.views import BusView, Gate, PciGpu

__all__ = ["detect", "probe"]

# The exit status of a probe that could not tell (Nagios's UNKNOWN, as `status`'s).
_UNKNOWN = 3

# What each gate says to whoever ran ``gpuagent probe``.
_HELD: dict[Gate, Callable[[config.Config, list[PciGpu]], str]] = {
    # A module that is not loaded is no news on a host without a GPU nvidia-smi could answer for.
    Gate.NO_GPU: lambda cfg, gpus: (
        "no NVIDIA GPU on the PCI bus "
        f"{'is bound to nvidia or unbound' if gpus else 'at all'}; nothing to probe"
    ),
    Gate.NVIDIA_SMI_MISSING: lambda cfg, gpus: f"nvidia-smi not found ({cfg.nvidia_smi!r})",
    # nvidia-smi would load the module mid driver upgrade.
    Gate.DRIVER_NOT_LOADED: lambda cfg, gpus: (
        "the nvidia kernel module is not loaded; not running nvidia-smi, which would load it "
        "(load_driver = true probes anyway)"
    ),
}


def detect(cfg: config.Config, as_json: bool) -> int:
    """Scan the PCI bus once and print its NVIDIA GPUs; returns the exit status."""
    gpus, problems = pci.scan(cfg.sysfs_root)
    for problem in problems:
        click.echo(f"gpuagent: {problem}", err=True)
    loaded = pci.module_loaded(cfg.sysfs_root)
    if as_json:
        out: dict[str, Any] = {"gpus": [asdict(g) for g in gpus], "module_loaded": loaded}
        click.echo(json.dumps(out, indent=2))
    else:
        if not gpus:
            click.echo("no NVIDIA GPU on the PCI bus")
        for g in gpus:
            driver = g.driver or "-"
            click.echo(f"{g.slot}  device {g.device_id}  class {g.pci_class}  driver {driver}")
        click.echo(f"nvidia kernel module: {'loaded' if loaded else 'not loaded'}")
    return 1 if problems else 0


def probe(cfg: config.Config, as_json: bool) -> int:
    """Run nvidia-smi once and print what the agent parses from it; returns the exit status."""
    gpus, problems = pci.scan(cfg.sysfs_root)
    for problem in problems:
        click.echo(f"gpuagent: {problem}", err=True)
    if problems and not gpus:
        return _UNKNOWN  # a bus it could not read: "no GPU" would be a guess
    bus = BusView(tuple(gpus), module_loaded=pci.module_loaded(cfg.sysfs_root))
    binary = lookup(cfg.nvidia_smi) if bus.probeable else None
    held = gate(bus, binary, cfg.load_driver)  # the agent's own gates, in its order
    if held is not None or binary is None:
        click.echo(f"gpuagent: {_HELD[held or Gate.NVIDIA_SMI_MISSING](cfg, gpus)}", err=True)
        return _UNKNOWN
    result = Prober(Runner(timeout=cfg.probe_timeout)).probe(binary)
    if result.rows is None:
        click.echo(f"gpuagent: probe failed ({result.failure}): {clean(result.error)}", err=True)
        return _UNKNOWN
    found = probetable.findings(result, gpus)
    if as_json:
        click.echo(json.dumps(probetable.full(result, gpus), indent=2))
    else:
        # On a terminal each line fits it (the finding cut, ending in …); a pipe gets all.
        width = shutil.get_terminal_size().columns if sys.stdout.isatty() else None
        for line in probetable.table(result, gpus, width):
            click.echo(line)
    for warning in result.warnings:
        click.echo(f"gpuagent: nvidia-smi: {clean(warning)}", err=True)
    # A GPU nvidia-smi names in an error line instead of a row is lost: the probe failed for it.
    for slot, error in sorted(result.gpu_errors.items()):
        click.echo(f"gpuagent: GPU {slot}: {clean(error)}", err=True)
    # As `status` exits: the worst finding's severity (a GPU named in an error line is lost).
    worst = {f.severity for fs in found.values() for f in fs}
    return 2 if CRITICAL in worst else 1 if WARNING in worst else 0
