from django.apps import AppConfig


class ClustersConfig(AppConfig):
    """Slurm clusters: registration, health, inventory, the slurmrestd client, and projects' Slurm accounts."""

    name = "clusters"
    default_auto_field = "django.db.models.BigAutoField"
