"""gpuagent: a systemd-native host agent for machines with NVIDIA GPUs."""

# The top entry of debian/changelog (tests/test_version.py checks that): the latest release,
# or the next one while it is untagged. A build's or a checkout's own version is __version__,
# and __pep440_version__ the same as Python's packaging spells it: see gpuagent.version.
RELEASE = "0.9.0"


def __getattr__(name: str) -> str:
    # Lazily: a checkout asks git, which `gpuagent status` need not wait for.
    if name == "__version__":
        from gpuagent.version import version  # noqa: PLC0415

        return version()
    if name == "__pep440_version__":
        from gpuagent.version import pep440, version  # noqa: PLC0415

        return pep440(version())
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
