"""gpuagent: a systemd-native host agent for machines with NVIDIA GPUs."""

# The latest release, the top entry of debian/changelog (tests/test_version.py checks that).
# A build's or a checkout's own version is __version__: see gpuagent.version.
RELEASE = "0.9.0"


def __getattr__(name: str) -> str:
    # Lazily: a checkout asks git, which `gpuagent status` need not wait for.
    if name == "__version__":
        from gpuagent.version import version  # noqa: PLC0415

        return version()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
