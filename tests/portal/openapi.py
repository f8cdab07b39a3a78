"""Check one answer of the Django test client against the OpenAPI schema the portal serves, with schemathesis:
the regression tests of schema fixes the API fuzz (tests/portal/test_api_fuzz.py) found use it."""

from __future__ import annotations

from functools import cache
from typing import Any

import requests
import schemathesis
from django.test import Client


@cache
def api_schema() -> schemathesis.BaseSchema:
    served = Client().get("/api/schema/", {"format": "json"})
    assert served.status_code == 200
    return schemathesis.openapi.from_dict(served.json())


def assert_matches_schema(response: Any, *, method: str, path_template: str) -> None:
    """Fail with schemathesis's report unless the status code and the body are what the schema documents.

    `response` is the Django test client's. (schemathesis validates the body of a documented status only.)
    """
    operation = api_schema()[path_template][method]
    documented = set(operation.definition.raw["responses"])
    assert str(response.status_code) in documented, f"{response.status_code} is not documented: {sorted(documented)}"
    request = requests.Request(method, f"http://testserver{response.wsgi_request.get_full_path()}").prepare()
    answer = schemathesis.Response(
        status_code=response.status_code,
        headers={name: [value] for name, value in response.headers.items()},
        content=response.content,
        request=request,
        elapsed=0.0,
        verify=False,
    )
    operation.validate_response(answer)
