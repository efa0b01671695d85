"""Property-based fuzzing of the live service from its own `/openapi.json` (schemathesis
generates requests per operation, hypothesis drives them): whatever the request, the answer
is never a 5xx, and every error is JSON with a message."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings

schemathesis = pytest.importorskip("schemathesis", reason="schemathesis is not installed (pip install schemathesis)")
EXAMPLES_PER_OPERATION = 12


def test_no_server_errors(server: Any) -> None:
    schema = schemathesis.openapi.from_url(server.url + "/openapi.json")
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 14
    seen: list[str] = []
    for operation in operations:

        @given(case=operation.as_strategy())
        @settings(max_examples=EXAMPLES_PER_OPERATION, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case: Any) -> None:
            response = case.call(base_url=server.url, timeout=30)
            where = f"{case.method} {case.formatted_path}"
            assert response.status_code < 500, f"{where}: {response.status_code} {response.text[:300]}"
            if response.status_code >= 400:
                body = response.json()
                assert isinstance(body.get("detail"), str) and body["detail"], (where, body)
            seen.append(where)

        check()
    assert len(seen) >= len(operations)
