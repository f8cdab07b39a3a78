"""The load test's researchers, for locust (run by `bench/load.py`, which prepares the world they log in to).

Each simulated user is one researcher of the world file (`LOAD_WORLD`): they sign in through the login form as
a browser does (CSRF cookie and form field), then browse pages, list and read jobs over the REST API with their
token, and now and then submit a one-second job with an Idempotency-Key. Routes are named by their template
(`/jobs/[id]/`) so the statistics group per route. Never imported by Django or pytest: locust patches the
standard library with gevent when it starts.
"""

from __future__ import annotations

import itertools
import json
import os
import random
import re
import time
import uuid
from pathlib import Path
from typing import Any

from locust import HttpUser, between, events, task

WORLD: dict[str, Any] = json.loads(Path(os.environ["LOAD_WORLD"]).read_text())
_RESEARCHERS = itertools.cycle(WORLD["researchers"])
_CSRF_FIELD = re.compile(r'name="csrfmiddlewaretoken" value="([^"]+)"')
# Pages an API list client looks at before it stops following `next`.
API_PAGES_FOLLOWED = 3
JOB_SCRIPT = "#!/bin/bash\nsleep 1\n"
# A 503 with Retry-After (the portal shedding load, portal/overload.py) is waited out and the request sent again,
# as a polite client does, up to this many times; each such answer is listed under "503, retried: <route>", apart
# from the route's own figures, and is not an error. A 503 that comes again after that is one.
RETRIES_AFTER_503 = 2
RETRIED_PREFIX = "503, retried: "
# Ids of the jobs the portal accepted (202), written to LOAD_ACCEPTED when locust quits: bench/load.py checks
# that each of them reached Slurm, and tells them from jobs whose answer never arrived.
ACCEPTED: list[str] = []


def accepted_write(**_: Any) -> None:
    Path(os.environ["LOAD_ACCEPTED"]).write_text(json.dumps(ACCEPTED))


events.quitting.add_listener(accepted_write)  # type: ignore[no-untyped-call]


class SignedIn(HttpUser):
    """One researcher of the world file, signed in through the login form; the mixes below say what they do."""

    abstract = True
    wait_time = between(1, 3)

    def on_start(self) -> None:
        self.me = next(_RESEARCHERS)
        self.job_ids: list[str] = list(self.me["job_ids"])
        self.submitted = 0
        self.log_in()

    def send(self, method: str, path: str, *, name: str, check: Any = None, **kwargs: Any) -> Any:
        """One request, sent again after the wait a 503's Retry-After asks for; `check(response)` may mark the
        final answer a failure (else any status >= 400 is one)."""
        for attempt in range(RETRIES_AFTER_503 + 1):
            with self.client.request(method, path, name=name, catch_response=True, **kwargs) as response:
                retry_after = response.headers.get("Retry-After") if response.status_code == 503 else None
                retrying = retry_after is not None and attempt < RETRIES_AFTER_503
                if retrying:
                    response.request_meta["name"] = RETRIED_PREFIX + name
                    response.success()
                elif check is not None:
                    check(response)
            if not retrying:
                return response
            time.sleep(float(retry_after or 1))  # gevent's sleep under locust: the other users go on
        return response

    def log_in(self) -> None:
        form = self.send("GET", "/login/", name="/login/")
        found = _CSRF_FIELD.search(form.text)
        if not form.ok or found is None:
            return  # no form to fill in (that answer is already counted): a browser would not post one either

        def signed_in(response: Any) -> None:
            # A refused login answers 200 with the form again; a good one redirects to the dashboard.
            if response.url is None or response.url.rstrip("/").endswith("/login"):
                response.failure(f"{self.me['username']} could not sign in (HTTP {response.status_code})")

        self.send(
            "POST",
            "/login/",
            name="/login/ (sign in)",
            data={
                "username": self.me["username"],
                "password": self.me["password"],
                "csrfmiddlewaretoken": found.group(1),
            },
            headers={"Referer": f"{self.host}/login/"},
            check=signed_in,
        )

    def api(self, method: str, path: str, *, name: str, **kwargs: Any) -> Any:
        headers = {"Authorization": f"Bearer {self.me['token']}", **kwargs.pop("headers", {})}
        return self.send(method, path, name=name, headers=headers, **kwargs)


class Researcher(SignedIn):
    """The load test's mix (`LOAD_MIX=portal`, the default): pages, the REST API, and now and then a job."""

    # Pages ---------------------------------------------------------------------------------------------

    @task(3)
    def dashboard(self) -> None:
        self.send("GET", "/", name="/")

    @task(3)
    def job_list_page(self) -> None:
        page = random.choice((1, 1, 1, 2, 3))
        self.send("GET", f"/jobs/?page={page}", name="/jobs/?page=[n]")

    @task(3)
    def job_page(self) -> None:
        self.send("GET", f"/jobs/{random.choice(self.job_ids)}/", name="/jobs/[id]/")

    @task(1)
    def project_list_page(self) -> None:
        self.send("GET", "/projects/", name="/projects/")

    @task(2)
    def project_page(self) -> None:
        self.send("GET", f"/projects/{self.me['project']}/", name="/projects/[tenant]/[project]/")

    @task(1)
    def cluster_list_page(self) -> None:
        self.send("GET", "/clusters/", name="/clusters/")

    @task(1)
    def billing_page(self) -> None:
        if self.me["is_manager"]:  # billing shows spend to managers and tenant admins only
            self.send("GET", "/billing/", name="/billing/")

    # REST API ------------------------------------------------------------------------------------------

    @task(4)
    def api_job_list(self) -> None:
        """Page through the project's jobs the way a script does: follow `next` for a few pages."""
        path: str | None = f"/api/v1/jobs/?project={self.me['project']}"
        for _ in range(API_PAGES_FOLLOWED):
            if path is None:
                return
            response = self.api("GET", path, name="/api/v1/jobs/?project=[project]&page=[n]")
            if not response.ok:
                return
            path = response.json()["next"]

    @task(3)
    def api_job_detail(self) -> None:
        self.api("GET", f"/api/v1/jobs/{random.choice(self.job_ids)}/", name="/api/v1/jobs/[id]/")

    @task(1)
    def api_job_submit(self) -> None:
        self.submitted += 1
        body = {
            "project": self.me["project"],
            "cluster": WORLD["cluster"],
            "partition": WORLD["partition"],
            "gpus": 1,
            "time_limit_minutes": 1,
            "name": f"{WORLD['job_name_prefix']}{self.me['username']}-{self.submitted}",
            "script": JOB_SCRIPT,
        }

        def accepted(response: Any) -> None:
            if response.status_code != 202:
                response.failure(f"submit answered {response.status_code}: {response.text[:300]}")
                return
            job_id = response.json()["id"]
            ACCEPTED.append(job_id)
            self.job_ids.append(job_id)

        # The same Idempotency-Key on a retry after a 503: the job is created once however often it is sent.
        self.api(
            "POST",
            "/api/v1/jobs/",
            name="/api/v1/jobs/",
            json=body,
            headers={"Idempotency-Key": str(uuid.uuid4())},
            check=accepted,
        )


class ProfileOnly(SignedIn):
    """The web tier's floor (`LOAD_MIX=floor`): the same people sign in the same way and think as long, then only
    ever ask for the cheapest page a signed-in person has, their profile (the session, the person, the navigation
    and the layout, next to no content). The latency this gets is the best any page could get on the machine."""

    @task
    def profile_page(self) -> None:
        self.send("GET", "/account/profile/", name="/account/profile/")
