"""Why the nvidia kernel module is not there, or not the driver that is installed.

Two host-level problems, each a :class:`~gpuagent.views.Finding` for slot ``""``:

* ``no_driver_module`` (``check_host``): NVIDIA GPUs wait for the nvidia module, a warning
  until ``driver_absent_grace`` is over, then critical.  :func:`absence_reason` reads one
  kernel record's ``MESSAGE`` for a reason, :func:`loader_reason` one module loader's;
  :class:`ModuleAbsence` keeps the clock and the reasons and says how bad the wait is.
* ``driver_mismatch`` (critical, ``reboot`` or ``check_host``): the installed driver
  (:class:`NvmlLibrary`, the version in the NVML library's file name) is not the loaded one
  (:func:`loaded_version`, ``/sys/module/nvidia/version``), nvidia-smi says so (exit 18), or
  the kernel refused a client of the installed version (:func:`api_mismatch`);
  :func:`driver_mismatch` decides, and whether a reboot can help (the library newer than
  this boot, :meth:`NvmlLibrary.mtime` and :func:`boot_time`).

The decisions are pure; :class:`NvmlLibrary` and :func:`loaded_version` are the I/O at the
edge (a few stats and one small read, never a spawn), with the root injectable for tests.
"""

from __future__ import annotations

import glob
import os
import re
import sys
from collections.abc import Iterable

from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.kernel import drivercatalog, driverrecord
from gpuagent.views import ApiMismatch, Finding

__all__ = [
    "KEY_REJECTED",
    "LOCKDOWN",
    "MODULE_INIT_FAILED",
    "MODULE_NOT_FOUND",
    "NO_GPU_FOUND",
    "OPEN_MODULE_UNSUPPORTED",
    "OTHER_DRIVER",
    "PROBE_FAILED",
    "REASONS",
    "ModuleAbsence",
    "NvmlLibrary",
    "absence_reason",
    "api_mismatch",
    "boot_time",
    "driver_mismatch",
    "library_dirs",
    "loaded_version",
    "loader_reason",
    "mismatch_evidence",
    "version_of",
]

# Why the module is absent, strongest first: what each reason's record means.
KEY_REJECTED = "key_rejected"
LOCKDOWN = "lockdown"
MODULE_NOT_FOUND = "module_not_found"
OTHER_DRIVER = "other_driver"
OPEN_MODULE_UNSUPPORTED = "open_module_unsupported"
PROBE_FAILED = "probe_failed"
NO_GPU_FOUND = "no_gpu_found"
MODULE_INIT_FAILED = "module_init_failed"
REASONS: dict[str, str] = {
    KEY_REJECTED: "the kernel rejected the module's signature (Secure Boot or "
    "module.sig_enforce): sign the module or enroll its key with mokutil",
    LOCKDOWN: "the kernel's lockdown refused an unsigned module (Secure Boot): sign the "
    "module or enroll its key with mokutil",
    MODULE_NOT_FOUND: "modprobe found no nvidia module for the running kernel: install the "
    "driver for it (DKMS)",
    OTHER_DRIVER: "another driver (nouveau, nvidiafb …) obtained the GPUs first: blacklist it",
    OPEN_MODULE_UNSUPPORTED: "the open kernel module does not support these GPUs (no GSP): "
    "install the proprietary one",
    PROBE_FAILED: "the module found no GPU it could initialise and unloaded (dmesg says why "
    "for each GPU)",
    NO_GPU_FOUND: "the module found no NVIDIA GPU it can drive and refused to load: check "
    "lspci -d 10de: and NVreg_RegisterPCIDriver",
    MODULE_INIT_FAILED: "the module's own initialisation failed (most often another nvidia "
    "module holds its device numbers or PCI driver): unload it, keep one nvidia.ko for this "
    "kernel",
}

# The kernel's own records that say why, one pattern per reason, each matched at the record's
# start: the kernel's words there are its own, while a later line may be a user's
# (gpuagent.sources.kernel.driverrecord).  The kernel's are single-line records; the driver's
# are its catalog's entries (gpuagent.sources.kernel.drivermessages: each names its reason).
_KERNEL_REASONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # kernel/module/signing.c, with module.sig_enforce or Secure Boot: "Loading of module
    # with unavailable key is rejected" (also "of unsigned module", "of module with
    # unsupported crypto"; older kernels put the module's name first).
    (
        KEY_REJECTED,
        re.compile(
            r"(?:[\w-]{1,56}: )?Loading of (?:unsigned )?module(?: with [\w ]+)? is rejected"
        ),
    ),
    # security/lockdown/lockdown.c: "Lockdown: modprobe: unsigned module loading is
    # restricted; see man kernel_lockdown.7".
    (LOCKDOWN, re.compile(r"Lockdown: [^:\n]+: unsigned module loading is restricted")),
)
# The module loaders' words (their records are told apart by the fields journald sets, see
# gpuagent.sources.kernel.kernmatch.LOADERS), anywhere in a record: a modprobe error comes
# wrapped in its caller's words.
_LOADER_REASONS: tuple[tuple[str, re.Pattern[str]], ...] = (
    # modprobe's EKEYREJECTED: "Key was rejected by service".
    (KEY_REJECTED, re.compile(r"\bkey was rejected by service\b", re.IGNORECASE)),
    # modprobe: "modprobe: FATAL: Module nvidia not found." (or "... not found in directory
    # /lib/modules/<release>"); systemd-modules-load: "Failed to find module 'nvidia'".
    (MODULE_NOT_FOUND, re.compile(r"\bModule nvidia[\w-]* not found\b")),
    (MODULE_NOT_FOUND, re.compile(r"Failed to find module 'nvidia[\w-]*'")),
)


def absence_reason(message: str) -> str | None:
    """The reason (:data:`REASONS`) one kernel record's ``MESSAGE`` (``_TRANSPORT=kernel``)
    gives for the nvidia module not being loaded, or ``None``: the signature and lockdown
    reasons of a one-line record of the kernel's, the driver's of a record it wrote whole
    (the reason its :mod:`~gpuagent.sources.kernel.drivercatalog` entry names), each at the
    record's start.  "module verification failed: signature and/or
    required key missing - tainting kernel" and "PKCS#7 signature not signed with a trusted
    key" are no reason: a kernel that does not enforce signatures loads the module anyway.
    """
    if "\n" not in message.rstrip("\n"):
        for reason, pattern in _KERNEL_REASONS:
            if pattern.match(message):
                return reason
    found = drivercatalog.parse(message)
    return (found[1].reason or None) if found is not None else None


def loader_reason(message: str) -> str | None:
    """The reason (:data:`REASONS`) one module loader's record
    (:data:`gpuagent.sources.kernel.kernmatch.LOADERS`: root's ``modprobe`` or
    ``systemd-modules-load``) gives for the nvidia module not being loaded ("Module nvidia not
    found", "Key was rejected by service"), or ``None``."""
    for reason, pattern in _LOADER_REASONS:
        if pattern.search(message):
            return reason
    return None


class ModuleAbsence:
    """How long NVIDIA GPUs have waited for the nvidia module, and why (pure).

    Call :meth:`update` every tick with the monotonic time, whether the module is loaded,
    whether any GPU on the bus waits for it (bound to ``nvidia`` or to no driver: GPUs all
    handed to ``vfio-pci`` need no module), and the reasons (:func:`absence_reason`) of the
    journal records read since the last call.  It returns ``no_driver_module``: a warning
    while the module has been absent for less than ``grace`` seconds
    (``Config.driver_absent_grace``), critical after, ``None`` while no GPU waits; a loaded
    module, or no GPU waiting, ends the wait and forgets its reasons.
    """

    def __init__(self, grace: float = 600.0) -> None:
        self.grace = grace
        self.since: float | None = None
        self.reasons: set[str] = set()

    def resume(self, now: float, held_for: float) -> None:
        """At monotonic time ``now`` (s), after a restart: ``no_driver_module`` had held for
        ``held_for`` s (it holds from the wait's start, the grace's warning included); the
        wait counts from its first start, not from the restart, until the module is seen
        loaded."""
        self.since = now - held_for

    def update(
        self,
        now: float,
        *,
        loaded: bool,
        wanted: bool,
        reasons: Iterable[str] = (),
        told: bool = False,
    ) -> Finding | None:
        """The ``no_driver_module`` finding at monotonic time ``now`` (s), or ``None``;
        ``told``: the probe's gate says the module is not loaded (nvidia-smi is found), so
        the warning's start and end are that line's (:attr:`Finding.told`)."""
        if loaded or not wanted:
            self.since = None
            self.reasons.clear()
            return None
        if self.since is None:
            self.since = now
        self.reasons.update(r for r in reasons if r in REASONS)
        why = [REASONS[r] for r in REASONS if r in self.reasons]
        text = "; ".join(why) if why else "nothing in the journal says why"
        if now - self.since < self.grace:
            # A driver upgrade unloads it for a while: a warning until the grace is over.
            return Finding(
                "no_driver_module",
                WARNING,
                "check_host",
                f"the nvidia kernel module is not loaded (critical after "
                f"driver_absent_grace, {self.grace:g} s): {text}",
                ends="when the nvidia module is loaded",
                told=told,
            )
        return Finding(
            "no_driver_module",
            CRITICAL,
            "check_host",
            f"the nvidia kernel module has not been loaded for {self.grace:g} s: {text}",
            ends="when the nvidia module is loaded",
        )


# Old drivers: "NVRM: API mismatch: the client has the version 515.48.07, but\nNVRM: this
# kernel module has the version 510.73.05.  Please ..."; current ones (osapi.c) name the
# client: "NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)\nNVRM: has the version
# 595.84, but this kernel module has\nNVRM: the version 595.80.  Please ...".  The client's
# version is whatever the client sent (/dev/nvidiactl is open to all, newlines included):
# only the driver's own shape counts, two or three numbers of one to three digits (367.44,
# 595.80, 515.48.07, 470.256.02), so that it cannot carry lines of its own.
_DRIVER_VERSION = r"\d{1,3}\.\d{1,3}(?:\.\d{1,3})?"
_API_MISMATCH = re.compile(
    r"[ \t]*NVRM: API mismatch: the client (?:'(?P<program>[^'\n]*)' \(pid \d+\)\s+(?:NVRM:\s+)?)?"
    rf"has the version (?P<client>{_DRIVER_VERSION}), but\s+(?:NVRM:\s+)?this kernel module "
    rf"has\s+(?:NVRM:\s+)?the version (?P<kernel>{_DRIVER_VERSION})\.(?:\s|$)"
)


def api_mismatch(message: str) -> ApiMismatch | None:
    """The client's and the kernel module's versions in one kernel record's ``MESSAGE`` (all
    its lines, as the journal keeps a multi-line printk), or ``None``: the record must be the
    driver's whole (:func:`gpuagent.sources.kernel.driverrecord.lines`), the mismatch its start, and
    both versions of the driver's shape."""
    m = _API_MISMATCH.match(message) if driverrecord.lines(message) else None
    if m is None:
        return None
    return ApiMismatch(m["client"], m["kernel"], m["program"])


# The versions root's files give (the NVML library's name, the loaded module's sysfs file).
_VERSION = r"\d+(?:\.\d+)+"
_LIBRARY_VERSION = re.compile(rf"^libnvidia-ml\.so\.(?P<version>{_VERSION})$")


def version_of(name: str) -> str | None:
    """The driver version an NVML library's file name carries (``libnvidia-ml.so.595.80`` ->
    ``595.80``); ``None`` for a name without one (``libnvidia-ml.so.1``)."""
    m = _LIBRARY_VERSION.match(os.path.basename(name))
    return m["version"] if m else None


# Debian's multiarch directories, then the classic ones; the dynamic loader's own list is
# /etc/ld.so.conf (read first).
_MULTIARCH = ("x86_64-linux-gnu", "aarch64-linux-gnu", "powerpc64le-linux-gnu")
_STANDARD = ("/lib64", "/usr/lib64", "/lib", "/usr/lib")


def library_dirs(root: str = "/") -> list[str]:
    """The directories the dynamic loader searches, as paths under ``root``: those
    ``root/etc/ld.so.conf`` lists (``include`` globs followed), then the standard multiarch
    and classic directories; each once, in order.  Reads a few small files; never raises."""
    seen: list[str] = []
    for d in _conf(os.path.join(root, "etc", "ld.so.conf"), root, depth=0):
        if d not in seen:
            seen.append(d)
    arches = [getattr(sys.implementation, "_multiarch", ""), *_MULTIARCH]
    for arch in filter(None, arches):
        for base in ("/lib", "/usr/lib"):
            seen.append(f"{base}/{arch}")
    seen.extend(_STANDARD)
    out: list[str] = []
    for d in seen:
        path = os.path.join(root, d.lstrip("/"))
        if path not in out:
            out.append(path)
    return out


def _conf(path: str, root: str, depth: int) -> list[str]:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            lines = f.read(64 * 1024).splitlines()
    except OSError:
        return []
    dirs: list[str] = []
    for line in lines:
        words = line.split("#", 1)[0].split()
        if not words:
            continue
        if words[0] == "include" and depth < 4:
            for pattern in words[1:]:
                full = os.path.join(root, pattern.lstrip("/"))
                if not pattern.startswith("/"):
                    full = os.path.join(os.path.dirname(path), pattern)
                for included in sorted(glob.glob(full)):
                    dirs.extend(_conf(included, root, depth + 1))
        elif words[0].startswith("/"):
            dirs.extend(w for w in words if w.startswith("/"))
    return dirs


class NvmlLibrary:
    """The installed driver's version, from the NVML library's file name.

    ``setting`` is ``Config.nvml_library``: a name (``libnvidia-ml.so.1``) is looked for in
    :func:`library_dirs` of ``root``, found once at construction (build it again on a
    reload); a path (it has a ``/``) names the file itself.  :meth:`version` follows the
    symlinks each call (a driver upgrade moves them), a few stats and no spawn.
    """

    def __init__(self, setting: str = "libnvidia-ml.so.1", root: str = "/") -> None:
        if "/" in setting:
            self.candidates = [setting]
        else:
            self.candidates = [os.path.join(d, setting) for d in library_dirs(root)]
        self._found: str | None = None

    def version(self) -> str | None:
        """The version in the file name the library resolves to (``595.80``), or ``None``:
        no library found, or a file name without a version (installed outside the
        driver's own scheme)."""
        # The one found last time first: a tick costs a few stats, not one per directory;
        # a candidate is resolved only once the file is there (one stat follows its links).
        for path in sorted(self.candidates, key=lambda p: p != self._found):
            if os.path.isfile(path):
                self._found = path
                return version_of(os.path.realpath(path))
        return None

    def mtime(self) -> float | None:
        """When the file the library resolves to was last written (s since the epoch: the
        driver's install), or ``None`` without one."""
        for path in sorted(self.candidates, key=lambda p: p != self._found):
            try:
                return os.stat(path).st_mtime
            except OSError:
                continue
        return None


def loaded_version(sysfs_root: str = "/sys") -> str | None:
    """The loaded nvidia module's version (``<sysfs_root>/module/nvidia/version``, e.g.
    ``595.80``), or ``None`` when it is not loaded or says nothing readable."""
    try:
        with open(os.path.join(sysfs_root, "module", "nvidia", "version"), "rb") as f:
            text = f.read(64).decode("ascii", errors="replace").strip()
    except OSError:
        return None
    return text if re.fullmatch(_VERSION, text) else None


def boot_time(proc_root: str = "/proc") -> float | None:
    """When this boot began (``btime`` of ``<proc_root>/stat``, s since the epoch), or
    ``None`` where it says nothing readable."""
    try:
        with open(os.path.join(proc_root, "stat"), "rb") as f:
            text = f.read(64 * 1024).decode("ascii", errors="replace")
    except OSError:
        return None
    m = re.search(r"^btime (\d{1,12})$", text, re.MULTILINE)
    return float(m[1]) if m else None


def mismatch_evidence(
    installed: str | None,
    loaded: str | None,
    mismatch: ApiMismatch | None = None,
    *,
    refused: bool = False,
) -> list[str]:
    """What says the driver is not the one installed, in words (none: nothing does): the
    ``installed`` driver (:meth:`NvmlLibrary.version`) is not the ``loaded`` module
    (:func:`loaded_version`); the kernel's API-mismatch record (the boot's latest,
    :func:`api_mismatch`) still describes the loaded module and names a client of the
    installed version; nvidia-smi itself was ``refused`` ("Driver/library version mismatch",
    exit 18).  A version unknown says nothing, nor a record alone while the installed
    version is unknown: any user may send one."""
    # The client's version is what the client sent, and any user may open /dev/nvidiactl: a
    # refused client speaks for an upgrade only with the installed driver's version.
    record = (
        mismatch is not None
        and mismatch.client != mismatch.kernel
        and loaded == mismatch.kernel
        and installed == mismatch.client
    )
    said: list[str] = []
    if installed is not None and loaded is not None and installed != loaded:
        said.append(f"driver {installed} is installed but kernel module {loaded} is loaded")
    if record and mismatch is not None:
        who = f"'{mismatch.program}' " if mismatch.program else ""
        said.append(
            f"the kernel refused a client {who}of version {mismatch.client} (NVRM: API "
            f"mismatch with kernel module {mismatch.kernel})"
        )
    if refused:
        said.append("nvidia-smi: Driver/library version mismatch (exit 18)")
    return said


def driver_mismatch(evidence: list[str], installed_after_boot: bool | None) -> Finding | None:
    """``driver_mismatch`` (critical: no new CUDA job can start) from its ``evidence``
    (:func:`mismatch_evidence`; ``None`` without any).  Its action is ``reboot`` while the
    installed library is newer than this boot (``installed_after_boot``: an upgrade awaits
    its reboot); else (it predates the boot, so the reboot did not help, or that is unknown)
    ``check_host``: the installed driver does not match the module this kernel loads."""
    if not evidence:
        return None
    text = "; ".join(evidence) + ": no new CUDA job can start"
    ends = "when the loaded module is the installed driver's"
    if installed_after_boot:
        return Finding(
            "driver_mismatch",
            CRITICAL,
            "reboot",
            f"{text}; the driver was installed after this boot: reboot the host (or reload "
            "the nvidia modules) to finish the upgrade",
            ends=ends,
        )
    # Older than the boot: the reboot did not help; unknown (no library, no boot time): no
    # claim either way, and no reboot asked for that might not help.
    older = ", and is older than this boot" if installed_after_boot is False else ""
    return Finding(
        "driver_mismatch",
        CRITICAL,
        "check_host",
        f"{text}; the installed driver does not match the module this kernel loads{older}: "
        "reinstall the driver, or rebuild its module (DKMS) for this kernel",
        ends=ends,
    )
