"""Priced usage for the spend overview's tests, made as the workers make it: finished jobs charged in the quota
ledger, then imported (which builds the drafts of the months it touches)."""

from __future__ import annotations

from datetime import date, timedelta
from decimal import Decimal

from django.contrib.auth.models import User
from django.utils import timezone

from billing.rates import rate_create
from billing.usage import usage_import
from tests.billing.usage_factories import at, charged_job, previous_month
from tests.factories import add_project_member, make_matrix_cluster, make_project, make_tenant, make_user


class ArithmeticWorld:
    """Whole GPU-hours at 2 EUR in March 2025, so every figure can be checked by hand. The period is March 11-20,
    the previous one March 1-10 (equal length):

    acme/vision (north, h100): 1 GPU-hour before (2.00), 3 in the period (6.00)
    acme/speech (south, a100): only in the period, 1 GPU-hour (2.00): new, no percentage
    globex/lab  (north, h100): only before, 2 GPU-hours (4.00): -100%
    """

    start, end = date(2025, 3, 11), date(2025, 3, 20)

    def __init__(self) -> None:
        self.staff = make_user("spendroot", is_staff=True)
        self.acme_admin, self.globex_admin = make_user("acmeadmin"), make_user("globexadmin")
        self.acme = make_tenant("acme", admin=self.acme_admin)
        self.globex = make_tenant("globex", admin=self.globex_admin)
        self.vision, self.speech = make_project(self.acme, "vision"), make_project(self.acme, "speech")
        self.lab = make_project(self.globex, "lab")
        self.member, self.manager = make_user("ann"), make_user("mgr")
        add_project_member(self.vision, self.member)
        add_project_member(self.vision, self.manager, "manager")
        north, south = make_matrix_cluster("north"), make_matrix_cluster("south")
        for cluster in (north, south):
            rate_create(
                actor=None,
                cluster=cluster,
                gpu_type="",
                price_per_gpu_hour=Decimal(2),
                currency="EUR",
                valid_from=at(date(2025, 1, 1)),
            )
        charged_job(self.vision, north, start=at(date(2025, 3, 2), 9), end=at(date(2025, 3, 2), 10))
        charged_job(self.vision, north, start=at(date(2025, 3, 12), 9), end=at(date(2025, 3, 12), 10), gpus=3)
        charged_job(self.speech, south, start=at(date(2025, 3, 14), 9), end=at(date(2025, 3, 14), 10), gpu_type="a100")
        charged_job(self.lab, north, start=at(date(2025, 3, 5), 9), end=at(date(2025, 3, 5), 11))
        usage_import()


class InvoiceWorld:
    """Last month (closed) and the month before, two tenants, two clusters and three prices with four decimals,
    so that rounding per invoice line matters: jobs of odd lengths, several per line, and one across midnight."""

    def __init__(self) -> None:
        self.month = previous_month(timezone.now().date().replace(day=1))
        self.before = previous_month(self.month)
        self.staff = make_user("invoiceroot", is_staff=True)
        self.acme = make_tenant("acme", admin=make_user("acmeadmin"))
        self.globex = make_tenant("globex", admin=make_user("globexadmin"))
        vision, speech = make_project(self.acme, "vision"), make_project(self.acme, "speech")
        lab = make_project(self.globex, "lab")
        north, south = make_matrix_cluster("north"), make_matrix_cluster("south")
        prices = ((north, "h100", "2.3456"), (north, "", "0.9999"), (south, "a100", "1.1111"))
        for cluster, gpu_type, price in prices:
            rate_create(
                actor=None,
                cluster=cluster,
                gpu_type=gpu_type,
                price_per_gpu_hour=Decimal(price),
                currency="EUR",
                valid_from=at(self.before),
            )
        user: User = make_user("ann")
        for month in (self.before, self.month):
            for offset, minutes, gpus in ((1, 137, 1), (2, 41, 3), (6, 7, 2), (9, 613, 1)):
                day = month + timedelta(days=offset)
                start = at(day, 8, offset)
                charged_job(vision, north, start=start, end=start + timedelta(minutes=minutes), gpus=gpus, user=user)
                charged_job(
                    speech, south, start=start, end=start + timedelta(minutes=minutes + 3), gpu_type="a100", gpus=gpus
                )
                charged_job(lab, north, start=start, end=start + timedelta(minutes=minutes * 2 + 1), gpu_type="l4")
        # Across midnight into the month's second day.
        midnight = at(self.month + timedelta(days=1))
        charged_job(lab, north, start=midnight - timedelta(minutes=53), end=midnight + timedelta(minutes=71))
        usage_import()
