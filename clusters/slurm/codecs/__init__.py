"""One codec per slurmrestd API version, behind the normalised types of `clusters.slurm.types`."""

from __future__ import annotations

import importlib

from clusters.slurm.codecs.base import Codec

# Probed in this order: the newest version a daemon serves wins.
SUPPORTED_VERSIONS_NEWEST_FIRST = ("0.0.45", "0.0.44", "0.0.43", "0.0.42", "0.0.41", "0.0.40", "0.0.38")


def codec_for(version: str) -> Codec:
    """The codec of an API version such as "0.0.38"; each module exposes its instance as `CODEC`."""
    if version not in SUPPORTED_VERSIONS_NEWEST_FIRST:
        supported = ", ".join(SUPPORTED_VERSIONS_NEWEST_FIRST)
        raise ValueError(f"slurmrestd API version {version!r} is not supported; supported: {supported}")
    module = importlib.import_module(f"clusters.slurm.codecs.v{version.replace('.', '_')}")
    codec: Codec = module.CODEC
    return codec
