"""PCI classification and the sysfs scan, on trees built from real lspci listings."""

from __future__ import annotations

import os

import pytest

from gpuagent.sources.bus import pci
from tests import fakesysfs
from tests.replay import CORPUS

# Expected NVIDIA GPU counts per listing, from each capture's source note.
LISTINGS = {
    "asrockrack-altrad8ud-ampere-altra-aspeed-only-no-nvidia.lspci-nn.txt": 0,
    "asus-zenbook-ux535-gtx1650ti-vga0300-audio-unnamed.lspci-nn.txt": 1,
    "azure-nd-a100-v4-8x-a100-sxm4-80gb-6x-nvswitch-bridge0680.lspci-nn.txt": 8,
    "dell-precision-5570-rtx-a1000-3d-controller0302-optimus.lspci-nn.txt": 1,
    "dell-precision-7520-quadro-m2200-vga0300-hdmi-audio0403.lspci-nn.txt": 1,
    "gb200-nvl-compute-tray-4x-gpu-aspeed-ast2600.lspci.txt": 4,
    "hgx-h100-8x-sxm5-4x-nvswitch22a3-matrox-bmc.lspci-vvv.txt": 8,
    "hp-omen-15-gtx1060-mobile-vga0300-hdmi-audio0403-no-igpu.lspci-nn.txt": 1,
    "kvm-vm-1x-a10-3d-controller0302-virtio-vga.lspci-nn.txt": 1,
    "slimbook-hero-rtx4060-laptop-vga0300-audio-unnamed.lspci-nn.txt": 1,
}


def test_every_listing_in_the_corpus_is_covered() -> None:
    listed = {n for n in os.listdir(os.path.join(CORPUS, "pci")) if not n.endswith(".source.txt")}
    assert listed == set(LISTINGS)


@pytest.mark.parametrize(("listing", "expected"), sorted(LISTINGS.items()))
def test_gpu_count_from_real_listings(tmp_path: str, listing: str, expected: int) -> None:
    root = str(tmp_path)
    made = fakesysfs.from_lspci(root, os.path.join(CORPUS, "pci", listing))
    assert made > 0
    gpus, problems = pci.scan(root)
    assert problems == []
    assert len(gpus) == expected
    assert all(g.driver == "nvidia" for g in gpus)
    assert all(g.pci_class.startswith(("0x0300", "0x0302")) for g in gpus)


def test_azure_a100_ignores_the_nvswitch_bridges(tmp_path: str) -> None:
    root = str(tmp_path)
    name = "azure-nd-a100-v4-8x-a100-sxm4-80gb-6x-nvswitch-bridge0680.lspci-nn.txt"
    fakesysfs.from_lspci(root, os.path.join(CORPUS, "pci", name))
    gpus, _ = pci.scan(root)
    assert [g.slot for g in gpus] == [f"000{d}:00:00.0" for d in "1234bcde"]
    assert {g.device_id for g in gpus} == {"0x20b2"}
    bridges = [
        s
        for s in os.listdir(os.path.join(root, "bus/pci/devices"))
        if open(os.path.join(root, "bus/pci/devices", s, "class")).read().startswith("0x0680")
    ]
    assert len(bridges) == 6


@pytest.mark.parametrize(
    ("vendor", "cls", "gpu"),
    [
        (0x10DE, 0x030000, True),  # VGA
        (0x10DE, 0x030200, True),  # 3D controller (A100, H100, H200, T4, L40S, Optimus)
        (0x10DE, 0x030001, True),  # a prog-if does not matter
        (0x10DE, 0x040300, False),  # HD audio
        (0x10DE, 0x0C0330, False),  # USB
        (0x10DE, 0x0C8000, False),  # UCSI
        (0x10DE, 0x068000, False),  # NVSwitch bridge
        (0x10DE, 0x038000, False),  # display controller (not a GPU class we sample)
        (0x1A03, 0x030000, False),  # ASPEED BMC
        (0x102B, 0x030000, False),  # Matrox BMC
        (0x8086, 0x030200, False),  # another vendor's 3D controller
    ],
)
def test_classification(vendor: int, cls: int, gpu: bool) -> None:
    assert pci.is_nvidia_gpu(vendor, cls) is gpu


def test_driver_binding_is_recorded(tmp_path: str) -> None:
    root = str(tmp_path)
    for i, driver in enumerate(["nvidia", "nouveau", "vfio-pci", None]):
        fakesysfs.add_device(root, f"0000:0{i}:00.0", 0x10DE, 0x2335, 0x030200, driver)
    gpus, _ = pci.scan(root)
    assert [g.driver for g in gpus] == ["nvidia", "nouveau", "vfio-pci", None]
    assert [g.probeable for g in gpus] == [True, False, False, True]


def test_device_vanishing_mid_read_is_not_an_error(tmp_path: str) -> None:
    root = str(tmp_path)
    fakesysfs.gpu_host(root, 2)
    # Listed but its files already gone, the way a hot-unplug looks between listdir and open.
    os.makedirs(os.path.join(root, "bus/pci/devices/0000:77:00.0"))
    half = os.path.join(root, "bus/pci/devices/0000:78:00.0")
    os.makedirs(half)
    with open(os.path.join(half, "vendor"), "w") as f:
        f.write("0x10de\n")
    gpus, problems = pci.scan(root)
    assert len(gpus) == 2
    assert problems == []


def test_malformed_files_are_named(tmp_path: str) -> None:
    root = str(tmp_path)
    fakesysfs.gpu_host(root, 1)
    dev = fakesysfs.add_device(root, "0000:79:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    with open(os.path.join(dev, "class"), "w") as f:
        f.write("garbage\n")
    other = fakesysfs.add_device(root, "0000:7a:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    os.remove(os.path.join(other, "class"))
    os.mkdir(os.path.join(other, "class"))
    gpus, problems = pci.scan(root)
    assert len(gpus) == 1
    assert len(problems) == 2
    assert any("0000:79:00.0/class: not a hex number: 'garbage'" in p for p in problems)
    assert any("0000:7a:00.0" in p and "cannot read" in p for p in problems)


def test_non_utf8_vendor_is_a_problem_not_a_crash(tmp_path: str) -> None:
    root = str(tmp_path)
    dev = fakesysfs.add_device(root, "0000:01:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    with open(os.path.join(dev, "vendor"), "wb") as f:
        f.write(b"\xff\xfe\n")
    gpus, problems = pci.scan(root)
    assert gpus == []
    assert len(problems) == 1


def test_missing_pci_directory_is_one_problem(tmp_path: str) -> None:
    gpus, problems = pci.scan(str(tmp_path))
    assert gpus == []
    assert len(problems) == 1
    assert "cannot list PCI devices" in problems[0]


def test_module_loaded(tmp_path: str) -> None:
    root = str(tmp_path)
    assert not pci.module_loaded(root)
    fakesysfs.set_module(root, True)
    assert pci.module_loaded(root)


def test_scanner_rereads_a_slot_whose_device_was_replaced(tmp_path: str) -> None:
    root = str(tmp_path)
    fakesysfs.add_device(root, "0000:18:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    scanner = pci.Scanner(root)
    assert [g.slot for g in scanner.scan()[0]] == ["0000:18:00.0"]
    # Hot-plug: the GPU leaves and a NIC takes its slot (ext4 even reuses the inode).
    fakesysfs.remove_device(root, "0000:18:00.0")
    fakesysfs.add_device(root, "0000:18:00.0", 0x15B3, 0x1021, 0x020000, "mlx5_core")
    assert scanner.scan() == ([], [])
    fakesysfs.remove_device(root, "0000:18:00.0")
    fakesysfs.add_device(root, "0000:18:00.0", 0x10DE, 0x2330, 0x030200, None)
    (gpu,) = scanner.scan()[0]
    assert (gpu.device_id, gpu.driver) == ("0x2330", None)


def test_scanner_rereads_the_driver_every_time(tmp_path: str) -> None:
    root = str(tmp_path)
    fakesysfs.add_device(root, "0000:18:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    scanner = pci.Scanner(root)
    assert scanner.scan()[0][0].driver == "nvidia"
    fakesysfs.bind(root, "0000:18:00.0", "vfio-pci")
    assert scanner.scan()[0][0].driver == "vfio-pci"


def test_scanner_reports_a_problem_on_every_scan(tmp_path: str) -> None:
    root = str(tmp_path)
    dev = fakesysfs.add_device(root, "0000:18:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    with open(os.path.join(dev, "class"), "w") as f:
        f.write("zz\n")
    scanner = pci.Scanner(root)
    assert len(scanner.scan()[1]) == 1
    assert len(scanner.scan()[1]) == 1


def test_scanner_reads_no_file_while_the_listing_is_the_same(
    tmp_path: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    root = str(tmp_path)
    fakesysfs.gpu_host(root, 2)
    read: list[str] = []
    real = pci._read

    def counted(path: str) -> str | None:
        read.append(os.path.relpath(path, os.path.join(root, "bus/pci/devices")))
        return real(path)

    monkeypatch.setattr(pci, "_read", counted)
    scanner = pci.Scanner(root)
    assert len(scanner.scan()[0]) == 2
    assert len(read) == 2 * 3 + 2  # each GPU's vendor, class, device; the others' vendor
    read.clear()
    gpus, problems = scanner.scan()
    assert (len(gpus), problems, read) == (2, [], [])  # the listing alone, and the links
    fakesysfs.add_device(root, "0000:9a:00.0", 0x10DE, 0x2335, 0x030200, "nvidia")
    assert [g.slot for g in scanner.scan()[0]][-1] == "0000:9a:00.0"
    assert read == ["0000:9a:00.0/vendor", "0000:9a:00.0/class", "0000:9a:00.0/device"]


def test_scanner_follows_an_entry_linked_elsewhere(tmp_path: str) -> None:
    # sysfs's shape: bus/pci/devices/<slot> is a link into /sys/devices.  A device replaced
    # in its slot is a new link, even where the old one's target is still there.
    root = str(tmp_path)
    devices = os.path.join(root, "devices", "pci0000:17")
    for name, vendor, cls in (("gpu", "0x10de", "0x030200"), ("nic", "0x15b3", "0x020000")):
        os.makedirs(os.path.join(devices, name))
        for f, value in (("vendor", vendor), ("device", "0x2335"), ("class", cls)):
            with open(os.path.join(devices, name, f), "w") as out:
                out.write(value + "\n")
    base = os.path.join(root, "bus", "pci", "devices")
    os.makedirs(base)
    entry = os.path.join(base, "0000:18:00.0")
    os.symlink(os.path.join(devices, "gpu"), entry)
    scanner = pci.Scanner(root)
    assert [g.slot for g in scanner.scan()[0]] == ["0000:18:00.0"]
    os.symlink(os.path.join(devices, "nic"), entry + ".new")
    os.replace(entry + ".new", entry)
    assert scanner.scan() == ([], [])
    # A link whose device is gone is hot-plug under way: skipped, and read again later.
    os.symlink(os.path.join(devices, "gone"), entry + ".new")
    os.replace(entry + ".new", entry)
    assert scanner.scan() == ([], [])
    os.rename(os.path.join(devices, "gpu"), os.path.join(devices, "gone"))
    assert [g.device_id for g in scanner.scan()[0]] == ["0x2335"]
