"""The node_exporter link: made only where it can stay valid, removed only when it is ours."""

from __future__ import annotations

import os

from click.testing import CliRunner

from gpuagent.commands.cli import main
from gpuagent.edges import textlink


def dirs(tmp_path: str) -> tuple[str, str, str]:
    exporter = os.path.join(tmp_path, "node-exporter")
    run = os.path.join(tmp_path, "run")
    os.makedirs(exporter)
    os.makedirs(run)
    return os.path.join(exporter, "gpuagent.prom"), os.path.join(run, "gpuagent.prom"), exporter


def test_link_points_at_an_existing_target(tmp_path: str) -> None:
    path, target, _ = dirs(tmp_path)
    assert textlink.link(path, [], target) == path
    assert os.readlink(path) == target
    assert os.path.isfile(path)  # the empty target exists: never a dangling link
    with open(target, "w") as f:
        f.write("kept\n")
    assert textlink.link(path, [], target) == path
    with open(path) as f:
        assert f.read() == "kept\n"  # relinking does not truncate the agent's file


def test_no_node_exporter_no_link(tmp_path: str) -> None:
    path = os.path.join(tmp_path, "absent", "gpuagent.prom")
    assert textlink.link(path, [], os.path.join(tmp_path, "t.prom")) is None
    assert not os.path.lexists(path)


def test_an_operators_file_is_left_alone(tmp_path: str) -> None:
    path, target, _ = dirs(tmp_path)
    with open(path, "w") as f:
        f.write("mine\n")
    assert textlink.link(path, [], target) is None
    assert textlink.unlink([path], target) == []
    with open(path) as f:
        assert f.read() == "mine\n"


def test_disabled_or_moved_textfile_drops_the_default_link(tmp_path: str) -> None:
    path, target, exporter = dirs(tmp_path)
    textlink.link(path, [], target)
    assert textlink.link("", [path], target) is None
    assert not os.path.lexists(path)
    textlink.link(path, [], target)
    moved = os.path.join(exporter, "other.prom")
    assert textlink.link(moved, [path], target) == moved
    assert not os.path.lexists(path)
    assert os.readlink(moved) == target


def test_unlink_removes_only_our_links(tmp_path: str) -> None:
    path, target, exporter = dirs(tmp_path)
    textlink.link(path, [], target)
    theirs = os.path.join(exporter, "theirs.prom")
    os.symlink("/somewhere/else.prom", theirs)
    assert textlink.unlink([path, theirs, path, ""], target) == [path]
    assert not os.path.lexists(path)
    assert os.path.islink(theirs)


def linked_by_the_command(tmp_path: str) -> tuple[str, str, CliRunner]:
    """The link made by ``gpuagent link-textfile``: its path, the config file, the runner."""
    path, _, _ = dirs(tmp_path)
    conf = os.path.join(tmp_path, "c.toml")
    with open(conf, "w") as f:
        f.write(f'textfile = "{path}"\n')
    runner = CliRunner(mix_stderr=False)
    assert runner.invoke(main, ["--config", conf, "link-textfile"]).exit_code == 0
    assert os.readlink(path) == textlink.RUN_FILE
    return path, conf, runner


def test_the_command_links_and_removes(tmp_path: str) -> None:
    path, conf, runner = linked_by_the_command(tmp_path)
    assert runner.invoke(main, ["--config", conf, "link-textfile", "--remove"]).exit_code == 0
    assert not os.path.lexists(path)


def test_the_link_made_is_removed_whatever_the_config_says_since(tmp_path: str) -> None:
    path, target, exporter = dirs(tmp_path)
    moved = os.path.join(exporter, "custom.prom")
    assert textlink.link(moved, [], target) == moved
    # The config now names another textfile, or cannot be read: the record still finds it.
    assert textlink.unlink([path], target) == [moved]
    assert not os.path.lexists(moved)


def test_a_planted_record_cannot_make_root_write_or_remove_elsewhere(tmp_path: str) -> None:
    path, target, _ = dirs(tmp_path)
    victim = os.path.join(tmp_path, "victim")
    with open(victim, "w") as f:
        f.write("precious\n")
    os.symlink(victim, target + ".link")
    assert textlink.unlink([], target) == []  # a symlinked record is not read
    assert textlink.link(path, [], target) == path
    with open(victim) as f:
        assert f.read() == "precious\n"  # nor written through
    os.unlink(target + ".link")
    os.mkfifo(target + ".link")
    assert textlink.unlink([], target) == []  # a FIFO does not hang the clean-up
    os.unlink(target + ".link")
    with open(target + ".link", "w") as f:
        f.write(victim + "\n")
    assert textlink.unlink([], target) == []  # names a file, not a link to ours
    assert os.path.exists(victim)


def test_a_bad_file_is_linked_and_unlinked_all_the_same(tmp_path: str) -> None:
    path, conf, runner = linked_by_the_command(tmp_path)
    with open(conf, "a") as f:
        f.write("intervall = 5\n")
    # Quiet: the agent reports a bad file itself, once per attempt.
    res = runner.invoke(main, ["--config", conf, "link-textfile", "--remove"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "", "")
    assert not os.path.lexists(path)
    res = runner.invoke(main, ["--config", conf, "link-textfile"])
    assert (res.exit_code, res.stdout, res.stderr) == (0, "", "")
    # The service runs on the file's valid settings, and says so: node_exporter must see it.
    assert os.readlink(path) == textlink.RUN_FILE
