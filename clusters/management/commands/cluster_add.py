"""`manage.py cluster_add NAME --url URL --key-file PATH`: register a Slurm cluster, after checking it answers.

Run it where the Celery workers run: it reads the cluster's JWT key, as they do. It connects to slurmrestd,
negotiates the newest API version both sides know, reads the partitions, nodes and GPU types, and stores the
cluster with that inventory; or it says exactly what is wrong and stores nothing (unless --no-check).
"""

from __future__ import annotations

from typing import Any

from django.core.exceptions import ValidationError
from django.core.management.base import BaseCommand, CommandError, CommandParser

from clusters.services import ClusterProbe, cluster_probe, cluster_register
from clusters.slurm import SlurmError


class Command(BaseCommand):
    help = (
        "Register a Slurm cluster reached through its slurmrestd (JWT auth): checks the connection, negotiates the "
        "API version and reads the inventory first. Run it again to change a cluster's connection."
    )

    def add_arguments(self, parser: CommandParser) -> None:
        parser.add_argument("name", help="The portal's name for the cluster (a slug, e.g. 'north'); users see it")
        parser.add_argument("--url", required=True, help="slurmrestd's base URL, e.g. http://slurm-head:6820")
        parser.add_argument(
            "--key-file",
            required=True,
            help="Path, on the workers, of the cluster's JWT key (AuthAltParameters=jwt_key=... in slurm.conf)",
        )
        parser.add_argument(
            "--admin-user", default="root", help="Slurm operator/admin account for reads and account management"
        )
        parser.add_argument(
            "--log-root",
            required=True,
            help="Directory on the shared filesystem (same path on the cluster and the portal) for job output",
        )
        parser.add_argument("--no-check", action="store_true", help="Store the cluster even if it does not answer now")

    def handle(self, *args: Any, **options: Any) -> None:
        connection = {
            "slurmrestd_url": options["url"],
            "jwt_key_file": options["key_file"],
            "admin_user": options["admin_user"],
            "log_root": options["log_root"],
        }
        name = options["name"]
        try:
            probe = cluster_probe(**connection)
        except (SlurmError, OSError) as error:
            message = f"Cluster {name!r} at {options['url']} could not be checked: {error}"
            if not options["no_check"]:
                raise CommandError(f"{message}\nNothing was stored. Fix the above, or pass --no-check.") from error
            self.stderr.write(self.style.WARNING(message))
            probe = None
        try:
            cluster, created = cluster_register(name=name, probe=probe, **connection)
        except ValidationError as error:
            raise CommandError(f"Cluster {name!r} was not stored: {' '.join(error.messages)}") from error
        verb = "Registered" if created else "Updated"
        self.stdout.write(self.style.SUCCESS(f"{verb} cluster {cluster.name!r} ({cluster.slurmrestd_url})."))
        if probe is not None:
            self.stdout.write(_describe(probe))


def _describe(probe: ClusterProbe) -> str:
    gpu_types = ", ".join(f"{count}x {name}" for name, count in sorted(probe.gpus_by_type.items())) or "none"
    lines = [
        f"  Slurm {probe.ping.slurm_release or '(release not reported)'}, ClusterName "
        f"{probe.ping.cluster_name or '(not reported)'}",
        f"  slurmrestd serves API {', '.join(probe.served_versions) or '(not listed)'}; the portal uses "
        f"{probe.ping.api_version}",
        f"  partitions: {', '.join(partition.name for partition in probe.partitions) or 'none'}",
        f"  nodes: {len(probe.nodes)}; GPUs: {gpu_types}",
    ]
    if not probe.ping.responding:
        lines.append("  WARNING: slurmrestd answers but reports slurmctld not responding")
    return "\n".join(lines)
