"""gpuagent.sources.driver.driver: why the nvidia module is absent, and whether the driver is
not the one installed (and a reboot can help), from the real kernel lines of
tests/data/corpus/host and the reports each test names."""

from __future__ import annotations

import os
import re

import pytest

from gpuagent.health import CRITICAL, WARNING
from gpuagent.logs import Event
from gpuagent.sources.driver import driver
from gpuagent.sources.driver.driver import (
    KEY_REJECTED,
    LOCKDOWN,
    MODULE_INIT_FAILED,
    MODULE_NOT_FOUND,
    NO_GPU_FOUND,
    OPEN_MODULE_UNSUPPORTED,
    OTHER_DRIVER,
    PROBE_FAILED,
    ModuleAbsence,
    NvmlLibrary,
    absence_reason,
    api_mismatch,
    boot_time,
    driver_mismatch,
    library_dirs,
    loaded_version,
    loader_reason,
    mismatch_evidence,
    version_of,
)
from gpuagent.views import ApiMismatch, Finding

HOST = os.path.join(os.path.dirname(os.path.abspath(__file__)), "data", "corpus", "host")
# dmesg "[  7.6]", dmesg -T, journalctl's "Apr 19 12:34:42 host kernel: ", Talos' "host:
# kern:  notice: [2023-…Z]: ": what the kernel's MESSAGE does not hold.
_PREFIX = re.compile(
    r"^(?:\S+: (?:kern|user): +\w+: \[[^\]]*\]: |"
    r"[A-Z][a-z]{2} [ \d]\d \d\d:\d\d:\d\d \S+ kernel: |"
    r"\[[^\]]*\] )"
)


def records(name: str) -> list[str]:
    """The file's records as journald keeps their MESSAGE: prefixes gone, a printk's
    continuation lines (indented, or repeating its timestamp) joined with newlines."""
    out: list[str] = []
    last_stamp = None
    with open(os.path.join(HOST, name + ".txt"), encoding="utf-8") as f:
        for line in f.read().splitlines():
            stamp = re.match(r"^\[[^\]]*\]", line)
            if line[:1].isspace() and out:
                out[-1] += "\n" + line.strip()
            elif stamp and stamp.group() == last_stamp and out:
                out[-1] += "\n" + _PREFIX.sub("", line, count=1)
            elif line.strip():
                out.append(_PREFIX.sub("", line, count=1))
            last_stamp = stamp.group() if stamp else None
    return out


def names() -> list[str]:
    return sorted(f[:-4] for f in os.listdir(HOST) if f.endswith(".txt") and ".source" not in f)


# What each capture's records give: the reasons, in order, and the API mismatches.
REASONS = {
    "kernel-api-mismatch-dmesg-client-name-pid-driver595.84-vs-595.80": [],
    "kernel-api-mismatch-dmesg-old-format-driver515.48.07-vs-510.73.05": [],
    "kernel-api-mismatch-dmesg-repeated-timestamps-vgpu-driver570.148.08-vs-570.148.06": [],
    "kernel-api-mismatch-journal-nvidia-powerd-driver570.133.07-vs-575.51.02": [],
    "kernel-api-mismatch-journal-old-format-driver367.44-vs-367.35": [],
    # "signature and/or required key missing - tainting kernel": the module loads anyway.
    "kernel-module-verification-failed-taint-not-fatal-driver525.147.05": [],
    "kernel-nouveau-ad107-gsp-ctor-failed-probe-failed": [],
    "kernel-nouveau-bound-mmio-read-fault": [],
    # "PKCS#7 signature not signed with a trusted key" is no reason; the open module's
    # refusal of a V100 (no GSP) is.
    "kernel-pkcs7-untrusted-key-and-open-module-gsp-unsupported-v100-TRIMMED": [
        OPEN_MODULE_UNSUPPORTED
    ],
    # The eGPU's BAR0: "The NVIDIA probe routine failed" and "None of the NVIDIA devices
    # were initialized", twice.
    "kernel-probe-routine-failed-bar0-invalid-egpu-loop-TRIMMED": [PROBE_FAILED] * 4,
    # The kernel's "Loading of module with unavailable key is rejected" (Talos' own "load
    # nvidia failed: key was rejected by service" is a loader's words: LOADER_REASONS).
    "kernel-talos-module-unavailable-key-rejected-nvidia-TRIMMED": [KEY_REJECTED],
    # The fabric manager's refusal by the driver is its own journal's (test_fmjournal), no
    # reason for an absent module.
    "fabricmanager-journal-hgx-h200-driver580.126.09-fm590.48.01-version-mismatch": [],
    "fabricmanager-systemctl-status-driver550.120-fm550.127.05-version-mismatch-doesnt": [],
}
# What the same records give read as a module loader's (loader_reason): only the loaders'
# own words, never the kernel's.
LOADER_REASONS = {"kernel-talos-module-unavailable-key-rejected-nvidia-TRIMMED": [KEY_REJECTED]}
MISMATCHES = {
    "kernel-api-mismatch-dmesg-client-name-pid-driver595.84-vs-595.80": ApiMismatch(
        "595.84", "595.80", "kwin_wayland"
    ),
    "kernel-api-mismatch-dmesg-old-format-driver515.48.07-vs-510.73.05": ApiMismatch(
        "515.48.07", "510.73.05"
    ),
    "kernel-api-mismatch-dmesg-repeated-timestamps-vgpu-driver570.148.08-vs-570.148.06": (
        ApiMismatch("570.148.08", "570.148.06")
    ),
    "kernel-api-mismatch-journal-nvidia-powerd-driver570.133.07-vs-575.51.02": ApiMismatch(
        "570.133.07", "575.51.02", "nvidia-powerd"
    ),
    "kernel-api-mismatch-journal-old-format-driver367.44-vs-367.35": ApiMismatch(
        "367.44", "367.35"
    ),
}


def test_every_host_capture_is_listed() -> None:
    assert names() == sorted(REASONS)


@pytest.mark.parametrize("name", names())
def test_each_capture_classifies_as_expected(name: str) -> None:
    got = [r for m in records(name) if (r := absence_reason(m)) is not None]
    assert got == REASONS[name]
    loaders = [r for m in records(name) if (r := loader_reason(m)) is not None]
    assert loaders == LOADER_REASONS.get(name, [])
    mismatches = [m for r in records(name) if (m := api_mismatch(r)) is not None]
    assert mismatches == ([MISMATCHES[name]] if name in MISMATCHES else [])


def test_the_multi_line_records_are_joined_as_the_journal_keeps_them() -> None:
    (record,) = records("kernel-api-mismatch-journal-old-format-driver367.44-vs-367.35")
    assert record == (
        "NVRM: API mismatch: the client has the version 367.44, but\n"
        "NVRM: this kernel module has the version 367.35.  Please\n"
        "NVRM: make sure that this kernel module and all NVIDIA driver\n"
        "NVRM: components have the same version."
    )
    vgpu = records(
        "kernel-api-mismatch-dmesg-repeated-timestamps-vgpu-driver570.148.08-vs-570.148.06"
    )
    assert len(vgpu) == 4 and vgpu[3].count("\n") == 3


@pytest.mark.parametrize(
    ("line", "reason"),
    [
        # canonical/nvidia-graphics-drivers#61 (535.113.01, Secure Boot on).
        ("modprobe: ERROR: could not insert 'nvidia': Key was rejected by service", KEY_REJECTED),
        # kernel/module/signing.c's other two words for it.
        ("Loading of unsigned module is rejected", KEY_REJECTED),
        ("Loading of module with unsupported crypto is rejected", KEY_REJECTED),
        # RinCat/RTL88x2BU-Linux-Driver#114 and fastoe/RTL8812BU#27 (lockdown=integrity).
        (
            "Lockdown: modprobe: unsigned module loading is restricted; see man kernel_lockdown.7",
            LOCKDOWN,
        ),
        (
            "Lockdown: systemd-udevd: unsigned module loading is restricted; see man "
            "kernel_lockdown.7",
            LOCKDOWN,
        ),
        # NVIDIA/nvidia-docker#291 and #365 (nvidia-smi's own output), #481.
        ("modprobe: FATAL: Module nvidia not found.", MODULE_NOT_FOUND),
        (
            "modprobe: FATAL: Module nvidia_uvm not found in directory "
            "/lib/modules/4.4.0-83-generic",
            MODULE_NOT_FOUND,
        ),
        ("Failed to find module 'nvidia'", MODULE_NOT_FOUND),
        # mattshma/bigdata#133: three V100s that nouveau had taken.
        ("NVRM: The NVIDIA probe routine was not called for 3 device(s).", OTHER_DRIVER),
        ("NVRM: No NVIDIA graphics adapter probed!", PROBE_FAILED),
        # The module's own words for a load that failed (kernel-open/nvidia/nv.c).
        ("NVRM: No NVIDIA GPU found.", NO_GPU_FOUND),
        ("NVRM: register_chrdev_region() failed for nvidia!", MODULE_INIT_FAILED),
        # Not reasons: the module loads on a kernel that does not enforce signatures.
        (
            "nvidia: module verification failed: signature and/or required key missing - "
            "tainting kernel",
            None,
        ),
        ("PKCS#7 signature not signed with a trusted key", None),
        ("modprobe: FATAL: Module nouveau not found.", None),
        ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.148.06", None),
    ],
)
def test_reason_lines_of_the_reports(line: str, reason: str | None) -> None:
    # modprobe's and systemd-modules-load's lines are the loaders', the others the kernel's.
    loaders = line.startswith(("modprobe: ", "Failed to find module"))
    assert (loader_reason if loaders else absence_reason)(line) == reason
    # Each is its reader's only: the kernel's records never give a loader's reason.
    assert (absence_reason if loaders else loader_reason)(line) is None


def test_every_reason_is_explained() -> None:
    assert set(driver.REASONS) == {
        KEY_REJECTED,
        LOCKDOWN,
        MODULE_NOT_FOUND,
        OTHER_DRIVER,
        OPEN_MODULE_UNSUPPORTED,
        PROBE_FAILED,
        NO_GPU_FOUND,
        MODULE_INIT_FAILED,
    }
    assert Event.problem("no_driver_module").name == "PROBLEM_NO_DRIVER_MODULE"
    assert Event.problem("driver_mismatch").name == "PROBLEM_DRIVER_MISMATCH"
    assert Event.PROBLEM_DRIVER_MISMATCH.value == "c989acf6585f4f64b25a3d9eacc8e748"


def test_an_absent_module_is_a_problem_after_the_grace() -> None:
    # canonical/nvidia-graphics-drivers#61: Secure Boot rejects the DKMS-built 535 module.
    absent = ModuleAbsence(grace=600.0)
    reason = loader_reason(
        "modprobe: ERROR: could not insert 'nvidia': Key was rejected by service"
    )
    f = absent.update(100.0, loaded=False, wanted=True, reasons=[reason or ""])
    # Within the grace a warning (status exits 1 for it), said by the writer, not a reader.
    assert f is not None and (f.severity, f.action) == (WARNING, "check_host")
    assert f.message.startswith(
        "the nvidia kernel module is not loaded (critical after driver_absent_grace, 600 s): "
        "the kernel rejected the module's signature"
    )
    assert absent.update(699.9, loaded=False, wanted=True) == f
    f = absent.update(700.0, loaded=False, wanted=True)
    assert f is not None
    assert (f.kind, f.severity, f.action, f.extra) == (
        "no_driver_module",
        CRITICAL,
        "check_host",
        (),
    )
    assert f.message == (
        "the nvidia kernel module has not been loaded for 600 s: the kernel rejected the "
        "module's signature (Secure Boot or module.sig_enforce): sign the module or enroll "
        "its key with mokutil"
    )
    # The module comes: the wait and its reasons are over.
    assert absent.update(701.0, loaded=True, wanted=True) is None
    assert absent.update(702.0, loaded=False, wanted=True).severity == WARNING  # type: ignore[union-attr]
    f = absent.update(1302.0, loaded=False, wanted=True)
    assert f is not None and f.message.endswith(": nothing in the journal says why")


def test_a_driver_upgrade_within_the_grace_is_a_warning_only() -> None:
    absent = ModuleAbsence()
    for t in range(0, 80, 10):  # about 80 s without the module
        f = absent.update(float(t), loaded=False, wanted=True)
        assert f is not None and f.severity == WARNING
    assert absent.update(90.0, loaded=True, wanted=True) is None
    assert absent.update(2000.0, loaded=True, wanted=True) is None


def test_gpus_that_want_no_module_never_wait() -> None:
    absent = ModuleAbsence(grace=1.0)
    assert absent.update(0.0, loaded=False, wanted=False) is None
    assert absent.update(100.0, loaded=False, wanted=False) is None
    assert absent.since is None


def test_reasons_are_named_strongest_first_and_once() -> None:
    absent = ModuleAbsence(grace=0.001)
    absent.update(0.0, loaded=False, wanted=True, reasons=[PROBE_FAILED, PROBE_FAILED])
    f = absent.update(1.0, loaded=False, wanted=True, reasons=[LOCKDOWN, "made_up"])
    assert f is not None
    assert f.message.count("lockdown") == 1 and f.message.count("initialise") == 1
    assert f.message.index("lockdown") < f.message.index("initialise")


def pending(
    installed: str | None,
    loaded: str | None,
    mismatch: ApiMismatch | None = None,
    *,
    refused: bool = False,
    after_boot: bool | None = True,
) -> Finding | None:
    evidence = mismatch_evidence(installed, loaded, mismatch, refused=refused)
    return driver_mismatch(evidence, after_boot)


def test_the_api_mismatch_of_the_reports() -> None:
    # NVIDIA/nvidia-docker#182: "NVRM: API mismatch: the client has the version 367.44, but
    # NVRM: this kernel module has the version 367.35."; a reboot fixed it.
    (record,) = records("kernel-api-mismatch-journal-old-format-driver367.44-vs-367.35")
    mismatch = api_mismatch(record)
    assert mismatch == ApiMismatch("367.44", "367.35")
    # With the installed version unknown the record alone proves nothing (anyone may send
    # one); nvidia-smi's own exit 18 does.
    assert pending(None, "367.35", mismatch) is None
    f = pending(None, "367.35", mismatch, refused=True)
    assert f is not None
    assert (f.kind, f.severity, f.action) == ("driver_mismatch", CRITICAL, "reboot")
    assert f.message == (
        "nvidia-smi: Driver/library version mismatch (exit 18): no new CUDA job can start; "
        "the driver was installed after this boot: reboot the host (or reload the nvidia "
        "modules) to finish the upgrade"
    )
    # Frogging-Family/nvidia-all#394: 595.84 user space, 595.80 module, kwin_wayland refused.
    record = records("kernel-api-mismatch-dmesg-client-name-pid-driver595.84-vs-595.80")[1]
    f = pending("595.84", "595.80", api_mismatch(record))
    assert f is not None
    assert f.message == (
        "driver 595.84 is installed but kernel module 595.80 is loaded; the kernel refused a "
        "client 'kwin_wayland' of version 595.84 (NVRM: API mismatch with kernel module "
        "595.80): no new CUDA job can start; the driver was installed after this boot: "
        "reboot the host (or reload the nvidia modules) to finish the upgrade"
    )
    # After the reboot the module is the one the record refused no more.
    assert pending("595.84", "595.84", api_mismatch(record)) is None
    assert api_mismatch("NVRM: API mismatch: the client has the version 1.2, but") is None


@pytest.mark.parametrize("after_boot", [False, None])
def test_a_mismatch_the_reboot_did_not_end_is_no_reboot(after_boot: bool | None) -> None:
    # illinois-scicomp/machine-shop-maintenance#70: after the reboot the mismatch is still
    # there (the module built for another kernel): saying "reboot" again would loop.
    f = pending("595.84", "595.80", refused=True, after_boot=after_boot)
    assert f is not None
    assert (f.kind, f.severity, f.action) == ("driver_mismatch", CRITICAL, "check_host")
    assert "reboot" not in f.message
    older = ", and is older than this boot" if after_boot is False else ""
    assert f.message.endswith(
        "no new CUDA job can start; the installed driver does not match the module this "
        f"kernel loads{older}: reinstall the driver, or rebuild its module (DKMS) for this "
        "kernel"
    )
    assert f.ends == "when the loaded module is the installed driver's"


@pytest.mark.parametrize(
    ("installed", "loaded", "found"),
    [
        ("595.84", "595.80", True),
        ("570.148.08", "570.148.08", False),
        (None, "595.80", False),
        ("595.84", None, False),
        (None, None, False),
    ],
)
def test_a_mismatch_of_the_versions_needs_both(
    installed: str | None, loaded: str | None, found: bool
) -> None:
    f = pending(installed, loaded)
    assert (f is not None) == found
    if f is not None:
        assert f.message.startswith(f"driver {installed} is installed but kernel module {loaded}")


def test_boot_time(tmp_path: str) -> None:
    proc = str(tmp_path)
    assert boot_time(proc) is None
    with open(os.path.join(proc, "stat"), "w") as f:
        f.write("cpu  1 2 3\nintr 5\nctxt 7\nbtime 1764650000\nprocesses 9\n")
    assert boot_time(proc) == 1764650000.0
    with open(os.path.join(proc, "stat"), "w") as f:
        f.write("cpu  1 2 3\nbtime x\n")
    assert boot_time(proc) is None
    assert boot_time("/proc") is not None  # the live host's


def test_the_library_mtime_is_the_file_it_resolves_to(tmp_path: str) -> None:
    root = str(tmp_path)
    real = os.path.join(root, "libnvidia-ml.so.595.80")
    touch(real)
    os.utime(real, (1000.0, 1000.0))
    path = os.path.join(root, "libnvidia-ml.so.1")
    os.symlink(real, path)
    assert NvmlLibrary(path).mtime() == 1000.0
    assert NvmlLibrary(os.path.join(root, "absent.so.1")).mtime() is None


@pytest.mark.parametrize(
    ("name", "version"),
    [
        ("libnvidia-ml.so.595.80", "595.80"),
        ("/usr/lib/x86_64-linux-gnu/libnvidia-ml.so.570.148.08", "570.148.08"),
        ("libnvidia-ml.so.1", None),
        ("libnvidia-ml.so", None),
        ("libnvidia-ml.so.595.80.bak", None),
        ("libcuda.so.595.80", None),
    ],
)
def test_version_of(name: str, version: str | None) -> None:
    assert version_of(name) == version


def link(path: str, target: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    os.symlink(target, path)


def touch(path: str) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb"):
        pass


def test_the_installed_version_as_the_run_installer_leaves_it(tmp_path: str) -> None:
    root = str(tmp_path)
    lib = os.path.join(root, "usr/lib/x86_64-linux-gnu")
    touch(os.path.join(lib, "libnvidia-ml.so.595.84"))
    link(os.path.join(lib, "libnvidia-ml.so.1"), "libnvidia-ml.so.595.84")
    nvml = NvmlLibrary("libnvidia-ml.so.1", root=root)
    assert nvml.version() == "595.84"
    # An upgrade moves the link: seen without building the library again.
    touch(os.path.join(lib, "libnvidia-ml.so.595.86"))
    os.remove(os.path.join(lib, "libnvidia-ml.so.1"))
    link(os.path.join(lib, "libnvidia-ml.so.1"), "libnvidia-ml.so.595.86")
    assert nvml.version() == "595.86"


def test_the_installed_version_as_debian_packages_it(tmp_path: str) -> None:
    # Debian's libnvidia-ml1: a link into nvidia/current (through /etc/alternatives), and
    # there the versioned file.
    root = str(tmp_path)
    current = os.path.join(root, "usr/lib/x86_64-linux-gnu/nvidia/current")
    touch(os.path.join(current, "libnvidia-ml.so.535.216.01"))
    link(os.path.join(current, "libnvidia-ml.so.1"), "libnvidia-ml.so.535.216.01")
    link(
        os.path.join(root, "etc/alternatives/nvidia--libnvidia-ml.so.1"),
        os.path.join(current, "libnvidia-ml.so.1"),
    )
    link(
        os.path.join(root, "usr/lib/x86_64-linux-gnu/libnvidia-ml.so.1"),
        os.path.join(root, "etc/alternatives/nvidia--libnvidia-ml.so.1"),
    )
    assert NvmlLibrary(root=root).version() == "535.216.01"


def test_ld_so_conf_directories_come_first(tmp_path: str) -> None:
    root = str(tmp_path)
    os.makedirs(os.path.join(root, "etc/ld.so.conf.d"))
    with open(os.path.join(root, "etc/ld.so.conf"), "w") as f:
        f.write("# comment\ninclude /etc/ld.so.conf.d/*.conf\n")
    with open(os.path.join(root, "etc/ld.so.conf.d/nvidia.conf"), "w") as f:
        f.write("/usr/local/nvidia/lib64\n")
    dirs = library_dirs(root)
    assert dirs[0] == os.path.join(root, "usr/local/nvidia/lib64")
    assert os.path.join(root, "usr/lib/x86_64-linux-gnu") in dirs
    assert len(dirs) == len(set(dirs))
    touch(os.path.join(root, "usr/local/nvidia/lib64/libnvidia-ml.so.580.65.06"))
    link(
        os.path.join(root, "usr/local/nvidia/lib64/libnvidia-ml.so.1"), "libnvidia-ml.so.580.65.06"
    )
    assert NvmlLibrary(root=root).version() == "580.65.06"


def test_no_library_or_no_version_leaves_it_unknown(tmp_path: str) -> None:
    root = str(tmp_path)
    assert NvmlLibrary(root=root).version() is None
    # Installed by hand without the versioned name: unknown, not an error.
    touch(os.path.join(root, "usr/lib/libnvidia-ml.so.1"))
    assert NvmlLibrary(root=root).version() is None
    # A path names the file itself, as tests point at a fake one.
    fake = os.path.join(root, "opt/libnvidia-ml.so.595.80")
    touch(fake)
    assert NvmlLibrary(fake).version() == "595.80"
    assert NvmlLibrary(os.path.join(root, "absent/libnvidia-ml.so.1")).version() is None
    dangling = os.path.join(root, "opt/libnvidia-ml.so.1")
    link(dangling, "libnvidia-ml.so.999.99")
    assert NvmlLibrary(dangling).version() is None


def test_loaded_version(tmp_path: str) -> None:
    sysfs = str(tmp_path)
    assert loaded_version(sysfs) is None
    os.makedirs(os.path.join(sysfs, "module/nvidia"))
    path = os.path.join(sysfs, "module/nvidia/version")
    with open(path, "w") as f:
        f.write("595.80\n")
    assert loaded_version(sysfs) == "595.80"
    with open(path, "w") as f:
        f.write("\n")
    assert loaded_version(sysfs) is None
