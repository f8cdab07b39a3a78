"""Codec for slurmrestd API v0.0.45 (Slurm 26.05)."""

from __future__ import annotations

from clusters.slurm.codecs.v0_0_44 import V0044Codec


class V0045Codec(V0044Codec):
    """Reads and writes as v0.0.44 for everything the portal uses.

    Changed from v0.0.44 (diff of the specs, checked against 26.05.5's own /openapi/v3):
    - A partition gains top-level `flags`; the default partition says `["DEFAULT"]`, so `is_default` is
      known from this version on (the shared decoder already read that field).
    - A ping loses the deprecated `pinged` and `mode` and gains `status`; `responding` is read, as from v0.0.42.
    - The top-level `script` of a submission is no longer deprecated; `job.script` stays valid and is sent.
    - GET /associations/ and /jobs/ of slurmdbd drop the `format` parameter, which the portal never sends.
    - Added or removed, none of it read or written here: job descriptions gain `container_type`,
      `cores_per_socket` and `memory_update_delay`/`margin` and lose `power_flags`; job info loses `power`;
      slurmdbd jobs gain `sluid`, `exclusive` and `oversubscribe`; nodes gain `suspend_time` and lose
      `power`, `external_sensors` and `tres_weighted`; partitions change `cpus.task_binding` to a flag list.
    Unchanged: the submit reply, `exit_code`, `job_state`, the tres/gres and stdout fields, accounts,
    associations (query flags included), errors and warnings.
    """

    version = "0.0.45"


CODEC = V0045Codec()
