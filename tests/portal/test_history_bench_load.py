"""bench/history.py's bulk load writes every table by hand (one `INSERT ... SELECT` each, no ORM), so a column
added to the schema without a default breaks it only when someone runs the benchmark (it happened twice). Here
it loads a few jobs into the test database, which holds every migration of the checkout."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
from django.core.management import call_command
from django.db import models

from billing.efficiency import efficiency_sums_mismatches
from billing.models import UsageRecord
from billing.usage import usage_daily_mismatches
from jobs.models import Job, JobEfficiency, JobTransition
from quotas.models import LedgerEntry
from quotas.usage import ledger_daily_mismatches

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import history

pytestmark = pytest.mark.django_db(transaction=True)


def test_the_history_benchmark_loads_into_the_current_schema(tmp_path: Path, settings: Any) -> None:
    settings.DEMO_CLUSTER_REGISTRY = str(tmp_path)  # the local cluster only
    call_command("seed_demo", verbosity=0)
    history._year_of_rates_and_allocations()

    history._history_insert(jobs=40)

    assert Job.objects.count() == 40
    assert JobTransition.objects.count() == 160
    assert LedgerEntry.objects.filter(kind="charge").count() == 40
    assert UsageRecord.objects.count() == 40
    assert JobEfficiency.objects.filter(idle_gpu_seconds__lte=models.F("observed_gpu_seconds")).count() == 40
    assert usage_daily_mismatches() == []
    assert efficiency_sums_mismatches() == []
    assert JobEfficiency.objects.filter(summed=True).count() > 30  # those that ended an hour ago and more
    assert ledger_daily_mismatches() == []
    assert set(Job.objects.values_list("state", flat=True)) <= {"completed", "failed", "cancelled", "timeout"}
