"""Codec for slurmrestd API v0.0.44 (Slurm 25.11)."""

from __future__ import annotations

from clusters.slurm.codecs.v0_0_43 import V0043Codec


class V0044Codec(V0043Codec):
    """Reads as v0.0.43 for everything the portal uses.

    Changed from v0.0.43, none of it needed here: job info adds `step_id` and `submit_line`, job
    descriptions accept `step_id`, slurmdbd gains POST /jobs/ and /job/{id}, and /util/ hostlist routes
    appear.
    """

    version = "0.0.44"


CODEC = V0044Codec()
