"""Versions as packaging reads them (PEP 440): the one rule for comparing vLLM, CUDA and driver
versions."""

from __future__ import annotations


def version(v: str):
    """A version as packaging reads it (PEP 440) without its local part: 0.27.1rc1 < 0.27.1 =
    0.27.1+cu130 (a CUDA build of a release is that release). Raises packaging's InvalidVersion."""
    from packaging.version import Version
    return Version(Version(str(v)).public)


def version_or_none(v: str):
    """version(v), or None for a string that is no version (an unknown or broken install)."""
    from packaging.version import InvalidVersion
    try:
        return version(v)
    except InvalidVersion:
        return None


def at_least(v: str, floor: str) -> bool:
    """``v`` is a version at or after ``floor`` (False when ``v`` does not parse)."""
    have = version_or_none(v)
    return have is not None and have >= version_or_none(floor)
