"""The lines of ``nvidia-smi -q`` text, each with the GPU it is under (pure).

``-q`` prints each GPU as a ``GPU 00000000:18:00.0`` line at the margin and its keys indented
under it (``Key : Value``, a section a line of its own).  Its readers (a vGPU guest's licence,
:mod:`gpuagent.sources.vgpu.licence`; a board's RMA gates, :mod:`gpuagent.rma.smiq`) take
the lines from here.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from gpuagent.sources.bus.pciaddr import sysfs_slot

__all__ = ["gpu_lines"]

_GPU = re.compile(r"GPU ([0-9A-Fa-f]{1,8}:[0-9A-Fa-f]{2}:[0-9A-Fa-f]{2}\.[0-7])")


def gpu_lines(text: str) -> Iterator[tuple[str, int, str]]:
    """Each line of ``text`` that is not blank and not a GPU's own line: ``(slot, indent,
    stripped)``, ``slot`` the GPU's it is under in sysfs form (``""`` before the first GPU)
    and ``indent`` its leading blanks."""
    slot = ""
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        indent = len(line) - len(line.lstrip())
        gpu = _GPU.fullmatch(stripped)
        if gpu is not None and indent == 0:
            slot = sysfs_slot(gpu[1])
            continue
        yield slot, indent, stripped
