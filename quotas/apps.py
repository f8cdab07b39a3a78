from django.apps import AppConfig


class QuotasConfig(AppConfig):
    name = "quotas"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        # The Slurm account sync (clusters/, below quotas) creates accounts with, and repairs, the GPU-minute limit
        # that the projects' allocations give: it asks this policy, so that clusters/ never imports quotas/.
        from clusters.accounts import account_limits_register
        from quotas.slurm_limits import QuotaAccountLimits

        account_limits_register(QuotaAccountLimits())
