"""The table of configuration keys: one entry per Config field, its default Config's, each
with a one-line doc; the cross-key rules; config's vocabulary below the sources."""

from __future__ import annotations

import ast
import os
from types import MappingProxyType

import pytest

from gpuagent import config, configkeys
from gpuagent.config import RULES, Config, ConfigError, load, load_sources, salvage
from gpuagent.configkeys import KEYS, OVERRIDE_SEVERITIES, Override, check_key
from gpuagent.health import CRITICAL, WARNING
from gpuagent.sources.kernel.xidcatalog import NONE


def write(path: str, text: str) -> str:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)
    return path


def test_every_field_has_exactly_one_entry_in_its_order() -> None:
    assert [k.name for k in KEYS] == list(Config._fields)


def test_every_default_is_the_config_default() -> None:
    cfg = Config()
    for key in KEYS:
        assert getattr(cfg, key.name) == key.default, key.name
        # A table's is read-only: every Config shares it.
        kind = MappingProxyType if isinstance(key.default, dict) else type(key.default)
        assert type(getattr(cfg, key.name)) is kind, key.name


def test_a_table_default_cannot_be_changed_through_a_config() -> None:
    with pytest.raises(TypeError):
        Config().xid[79] = Override(severity="none")  # type: ignore[index]
    assert Config().xid == {}


def test_every_entry_has_a_one_line_doc() -> None:
    for key in KEYS:
        assert key.doc and key.doc == key.doc.strip(), key.name
        assert "\n" not in key.doc and len(key.doc) <= 80, key.name


def test_every_default_that_a_file_can_write_passes_its_check() -> None:
    # None (unset) cannot be written in TOML; every other default can, and stays as it is.
    for key in KEYS:
        if key.default is not None:
            assert key.check(f"f: {key.name}", key.default) == key.default, key.name


def test_an_unknown_key_names_the_key_it_was_likely_meant_to_be() -> None:
    for typo, meant in [
        ("intervall", "interval"),
        ("probe-timeout", "probe_timeout"),
        ("Interval", "interval"),
        ("xids", "xid"),
    ]:
        with pytest.raises(ConfigError) as err:
            check_key("f.toml", typo, 10)
        assert str(err.value) == f"f.toml: unknown key {typo!r} (did you mean {meant!r}?)"
    # Nothing close: where the keys are, not a list of 26 of them.
    with pytest.raises(ConfigError) as err:
        check_key("f.toml", "colour", 10)
    assert str(err.value) == "f.toml: unknown key 'colour' (the keys are in gpuagent.toml(5))"
    with pytest.raises(ConfigError) as err:
        check_key("f.toml", "k" * 5000, 10)
    assert len(str(err.value)) < 120


def test_the_rules_refuse_no_default() -> None:
    # A rule refuses only a key the files set: salvage drops it and tries again.
    cfg = Config()
    for rule in RULES:
        assert rule(cfg, ()) == cfg


def test_a_refused_key_is_named_with_the_file_that_set_it(tmp_path: str) -> None:
    main_file = write(os.path.join(tmp_path, "gpuagent.toml"), "nvlink_interval = 5\n")
    dropin = write(f"{config.dropin_dir(main_file)}/10-slow.toml", "interval = 30\n")
    with pytest.raises(ConfigError) as err:
        load_sources(main_file, required=True)
    assert str(err.value) == (
        f"{main_file}: nvlink_interval: expected at least one tick (interval 30 s), got 5"
    )
    write(dropin, "interval = 30\nnvlink_interval = 20\n")
    with pytest.raises(ConfigError, match=f"^{dropin}: nvlink_interval: "):
        load(main_file, required=True)


def test_salvage_drops_the_refused_key_and_keeps_the_rest(tmp_path: str) -> None:
    path = write(os.path.join(tmp_path, "gpuagent.toml"), "interval = 30\nnvlink_interval = 20\n")
    cfg, error = salvage(path, required=True)
    assert cfg == Config(interval=30.0)
    assert error is not None and "nvlink_interval: expected at least one tick" in str(error)


def test_the_xid_severities_are_the_catalogs() -> None:
    assert OVERRIDE_SEVERITIES == (NONE, WARNING, CRITICAL)


@pytest.mark.parametrize("module", [config, configkeys])
def test_config_imports_nothing_from_the_sources(module: object) -> None:
    path = getattr(module, "__file__", "")
    with open(path, encoding="utf-8") as f:
        tree = ast.parse(f.read())
    imported = [n.module or "" for n in ast.walk(tree) if isinstance(n, ast.ImportFrom)] + [
        a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names
    ]
    assert not [m for m in imported if m.startswith("gpuagent.sources")]
