"""debian/gpuagent.preinst and postrm: the main file of a package that had it as a conffile,
moved aside before the unpack (and back when the upgrade fails), in a fake root.

The scripts take their root from $DPKG_ROOT as dpkg gives it, and ask dpkg-query, here a fake
on $PATH, what the installed package's conffiles are. postinst's half (and purge) run under
a booted systemd in tests/system/test_upgrade.py: both touch the host's systemd state.
"""

from __future__ import annotations

import hashlib
import os
import subprocess

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PREINST = os.path.join(REPO, "debian", "gpuagent.preinst")
POSTRM = os.path.join(REPO, "debian", "gpuagent.postrm")
MAIN = "etc/gpuagent/gpuagent.toml"
SHIPPED = "# every key, commented out\n#interval = 10\n"
EDITED = "# every key, commented out\ninterval = 3\n"


def md5(text: str) -> str:
    return hashlib.md5(text.encode(), usedforsecurity=False).hexdigest()


REGISTERED = f" /{MAIN} {md5(SHIPPED)}\n"


def run(tmp_path: str, script: str, *args: str, conffiles: str | None) -> None:
    """Run ``script`` with ``args`` in the fake root; ``conffiles``: what dpkg-query says of
    the installed package's (None: no package installed)."""
    bin_dir = os.path.join(tmp_path, "bin")
    os.makedirs(bin_dir, exist_ok=True)
    fake = os.path.join(bin_dir, "dpkg-query")
    with open(fake, "w", encoding="utf-8") as f:
        if conffiles is None:
            f.write(
                "#!/bin/sh\necho 'dpkg-query: no packages found matching gpuagent' >&2\nexit 1\n"
            )
        else:
            f.write(f"#!/bin/sh\nprintf '%s' '{conffiles}'\n")
    os.chmod(fake, 0o700)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "DPKG_ROOT": os.path.join(tmp_path, "root")}
    proc = subprocess.run(
        ["sh", script, *args], env=env, capture_output=True, text=True, check=False, timeout=30
    )
    assert (proc.returncode, proc.stderr) == (0, "")


def root(tmp_path: str, main: str | None) -> str:
    """The fake root's /etc/gpuagent with ``main`` as its main file (None: none)."""
    etc = os.path.join(tmp_path, "root", "etc", "gpuagent")
    os.makedirs(os.path.join(etc, "gpuagent.toml.d"))
    if main is not None:
        with open(os.path.join(etc, "gpuagent.toml"), "w", encoding="utf-8") as f:
            f.write(main)
    return etc


def listing(etc: str) -> dict[str, str]:
    """The files beside the drop-in directory, and their text (a link: '-> TARGET')."""
    found = {}
    for name in sorted(os.listdir(etc)):
        path = os.path.join(etc, name)
        if os.path.islink(path):
            found[name] = f"-> {os.readlink(path)}"
        elif os.path.isfile(path):
            with open(path, encoding="utf-8") as f:
                found[name] = f.read()
    return found


@pytest.mark.parametrize(
    ("main", "conffiles", "left"),
    [
        # The old package's copy as shipped: set nothing, goes (postinst deletes it).
        (SHIPPED, REGISTERED, {"gpuagent.toml.dpkg-remove": SHIPPED}),
        # Edited: the operator's, kept aside for postinst to put back under its own name.
        (EDITED, REGISTERED, {"gpuagent.toml.dpkg-backup": EDITED}),
        # The operator deleted it: nothing to carry.
        (None, REGISTERED, {}),
        # The installed package ships none (an upgrade from this version on): not dpkg's.
        (EDITED, "", {"gpuagent.toml": EDITED}),
        (SHIPPED, "", {"gpuagent.toml": SHIPPED}),
        # dpkg already keeps it as obsolete: it is not the installed package's conffile.
        (SHIPPED, f" /{MAIN} {md5(SHIPPED)} obsolete\n", {"gpuagent.toml": SHIPPED}),
        # Another conffile of the package, not this one.
        (SHIPPED, f" /etc/other.toml {md5(SHIPPED)}\n", {"gpuagent.toml": SHIPPED}),
    ],
)
def test_an_upgrade_moves_the_old_conffile_aside(
    tmp_path: str, main: str | None, conffiles: str, left: dict[str, str]
) -> None:
    etc = root(str(tmp_path), main)
    run(str(tmp_path), PREINST, "upgrade", "0.7.0", conffiles=conffiles)
    assert listing(etc) == left


def test_a_link_is_the_operators_whatever_it_points_to(tmp_path: str) -> None:
    etc = root(str(tmp_path), None)
    with open(os.path.join(tmp_path, "managed.toml"), "w", encoding="utf-8") as f:
        f.write(SHIPPED)
    os.symlink(os.path.join(tmp_path, "managed.toml"), os.path.join(etc, "gpuagent.toml"))
    run(str(tmp_path), PREINST, "upgrade", "0.7.0", conffiles=REGISTERED)
    assert listing(etc) == {"gpuagent.toml.dpkg-backup": f"-> {tmp_path}/managed.toml"}


def test_an_install_over_a_removed_package_moves_it_too(tmp_path: str) -> None:
    # Removed, not purged: dpkg still has the conffile of the package in state "rc".
    etc = root(str(tmp_path), EDITED)
    run(str(tmp_path), PREINST, "install", "0.7.0", conffiles=REGISTERED)
    assert listing(etc) == {"gpuagent.toml.dpkg-backup": EDITED}


def test_a_first_install_leaves_a_file_already_there(tmp_path: str) -> None:
    etc = root(str(tmp_path), EDITED)  # written before the package, by configuration management
    run(str(tmp_path), PREINST, "install", conffiles=None)
    assert listing(etc) == {"gpuagent.toml": EDITED}


@pytest.mark.parametrize("main", [SHIPPED, EDITED])
def test_a_failed_upgrade_puts_the_file_back(tmp_path: str, main: str) -> None:
    etc = root(str(tmp_path), main)
    run(str(tmp_path), PREINST, "upgrade", "0.7.0", conffiles=REGISTERED)
    run(str(tmp_path), POSTRM, "abort-upgrade", "0.7.0", conffiles=REGISTERED)
    assert listing(etc) == {"gpuagent.toml": main}


def test_an_aborted_upgrade_without_a_file_aside_changes_nothing(tmp_path: str) -> None:
    etc = root(str(tmp_path), EDITED)
    run(str(tmp_path), POSTRM, "abort-upgrade", "0.7.0", conffiles="")
    assert listing(etc) == {"gpuagent.toml": EDITED}


POSTINST = os.path.join(REPO, "debian", "gpuagent.postinst")
# 0.7.0's shipped header (packaging/gpuagent.toml at 34ef91e), edited below it.
OLD_HEADER = (
    "# gpuagent configuration; see gpuagent(8).\n"
    "#\n"
    "# Do not edit this file: put changes in a drop-in, /etc/gpuagent/gpuagent.toml.d/NAME.toml\n"
    "# (read after this file in lexical order, a later key overriding an earlier one). This file\n"
    "# then stays as shipped, and an upgrade never asks about it. Check the result with\n"
    "# `gpuagent check-config`, apply it with `systemctl reload gpuagent`.\n"
)


def test_an_edited_070_file_kept_loses_its_do_not_edit_header(tmp_path: str) -> None:
    etc = root(tmp_path, None)
    with open(os.path.join(etc, "gpuagent.toml.dpkg-backup"), "w", encoding="utf-8") as f:
        f.write(OLD_HEADER + "interval = 3\n")
    run(tmp_path, POSTINST, "configure", "0.7.0", conffiles=None)
    assert listing(etc) == {
        "gpuagent.toml": (
            "# gpuagent configuration; see gpuagent(8).\n"
            "#\n"
            "# This file is yours: no package ships or changes it. Settings may also go in a "
            "drop-in,\n"
            "# /etc/gpuagent/gpuagent.toml.d/NAME.toml (read after this file in lexical order, "
            "a later\n"
            "# key overriding an earlier one). Check the result with\n"
            "# `gpuagent check-config`, apply it with `systemctl reload gpuagent`.\n"
            "interval = 3\n"
        )
    }
    # A file of the operator's own words is left as it is.
    etc = root(os.path.join(tmp_path, "other"), None)
    with open(os.path.join(etc, "gpuagent.toml.dpkg-backup"), "w", encoding="utf-8") as f:
        f.write(EDITED)
    run(os.path.join(tmp_path, "other"), POSTINST, "configure", "0.7.0", conffiles=None)
    assert listing(etc) == {"gpuagent.toml": EDITED}
