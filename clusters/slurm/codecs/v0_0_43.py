"""Codec for slurmrestd API v0.0.43 (Slurm 25.05; still served by 25.11)."""

from __future__ import annotations

from clusters.slurm.codecs.data_parser import DataParserCodec


class V0043Codec(DataParserCodec):
    """Changed from v0.0.42: job info gains `stdout_expanded`, `stderr_expanded` and `stdin_expanded`.

    With them `standard_output` turns into the pattern as submitted ("slurm-%j.out", relative to the
    working directory) where v0.0.41/42 gave the resolved path, so the expanded fields come first.
    """

    version = "0.0.43"
    stdout_fields = ("stdout_expanded", "standard_output")
    stderr_fields = ("stderr_expanded", "standard_error")


CODEC = V0043Codec()
