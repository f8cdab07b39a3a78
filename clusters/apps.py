from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Slurm clusters: registration, health, inventory, the slurmrestd client, and projects' Slurm accounts."""

    name = "clusters"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # A sign-in sets people's POSIX users from the provider's claims: tenants/ applies the claims and asks
        # this applier too, so that it never imports clusters/.
        from clusters.directory import directory_posix_usernames_apply
        from tenants.directory import directory_claims_applier_register

        directory_claims_applier_register(directory_posix_usernames_apply)
