"""Codec for slurmrestd API v0.0.41 (Slurm 24.05; still served by 24.11, 25.05 and 25.11)."""

from __future__ import annotations

from clusters.slurm.codecs.base import Json
from clusters.slurm.codecs.data_parser import DataParserCodec


class V0041Codec(DataParserCodec):
    """What v0.0.41 still spells the old way; v0.0.42 changed all of it.

    - The association query flags are snake_case names (`with_deleted`); v0.0.42 renamed them.
    - A ping has no `responding` (nor `primary`); only `pinged: "UP"` says the controller answered.
    - The submit reply repeats the job id in a deprecated `result`; the top-level `job_id` is read, as later.
    """

    version = "0.0.41"
    include_deleted_associations_parameter = "with_deleted"

    def _ping_responding(self, ping: Json) -> bool:
        return ping.get("pinged") == "UP"


CODEC = V0041Codec()
