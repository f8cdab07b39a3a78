"""Codec for slurmrestd API v0.0.40 (Slurm 23.11; still served by 24.05, 24.11 and 25.05)."""

from __future__ import annotations

from clusters.slurm.codecs.v0_0_41 import V0041Codec


class V0040Codec(V0041Codec):
    """Reads and writes as v0.0.41 for everything the portal uses.

    No v0.0.40 spec is in slurm-openapi/; this was checked against the v0.0.40 schemas that 24.05, 24.11 and
    25.05 serve in their /openapi/v3 (slurmrestd-recorded/*/openapi-v3.json, identical for these fields, and
    24.11.5's own daemon here). Slurm 23.11's own generation of the plugin was not seen.

    Like v0.0.41: a ping says only `pinged: "UP"`; association query flags are snake_case (`with_deleted`);
    the submit reply carries `result` beside `job_id`; `job_state`, `exit_code`, times and limits, the
    tres/gres fields, `standard_output`, accounts, associations and `errors[]`/`warnings[]` have the same
    shapes, and POST /accounts_association/ exists.
    Changed in v0.0.41, none of it read or written here: the top-level `script` became deprecated (this
    codec sends `job.script`, valid in both); job descriptions gained `segment_size` and `resv_mpi_ports`
    and lost `cores_per_socket`; an association's `id` went from an object to an integer; job info's
    `job_resources` was reshaped; slurmdbd jobs gained `stdout`/`stderr`(`_expanded`); nodes gained `gpu_spec`.
    """

    version = "0.0.40"


CODEC = V0040Codec()
