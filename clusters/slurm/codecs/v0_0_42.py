"""Codec for slurmrestd API v0.0.42 (Slurm 24.11; still served by 25.05 and 25.11)."""

from __future__ import annotations

from clusters.slurm.codecs.data_parser import DataParserCodec


class V0042Codec(DataParserCodec):
    """The shapes `DataParserCodec` decodes by default.

    Changed from v0.0.41: the association/QOS query flags are named by their descriptions ("Include
    deleted associations"), a ping says `responding: true`, the submit reply lost `result`, and schemas
    are emitted as `$ref`s (prefer_refs became the default). Job and node replies read the same.
    """

    version = "0.0.42"


CODEC = V0042Codec()
