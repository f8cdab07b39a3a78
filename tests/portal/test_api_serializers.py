"""Serializers whose fields are made once per class serve every request alike, and none of their fields needs a
request of its own."""

from __future__ import annotations

from typing import Any

import pytest
from rest_framework import serializers

from billing.estimate_apis import EstimateOutput
from jobs.job_apis import JobSubmitInput
from portal.api_serializers import FieldsBoundOnce


def _subclasses(cls: type[FieldsBoundOnce]) -> set[type[FieldsBoundOnce]]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found


def _fields_within(serializer: serializers.Serializer[Any]) -> list[serializers.Field[Any, Any, Any, Any]]:
    found = []
    for field in serializer.fields.values():
        found.append(field)
        child = getattr(field, "child", None)
        for nested in (field, child):
            if isinstance(nested, serializers.Serializer):
                found += _fields_within(nested)
    return found


def test_the_fields_are_made_once_per_class() -> None:
    assert JobSubmitInput(data={}).fields is JobSubmitInput(data={}).fields
    assert EstimateOutput({}).fields is EstimateOutput({}).fields
    assert JobSubmitInput().fields is not EstimateOutput().fields


@pytest.mark.parametrize("cls", sorted(_subclasses(FieldsBoundOnce), key=str))
def test_no_shared_field_needs_the_request_it_serves(cls: type[FieldsBoundOnce]) -> None:
    # The shared fields see an instance of their own: a field that reads its serializer's context, methods or
    # defaults from the request would read that instance's, not the request's.
    for field in _fields_within(cls()):
        assert not isinstance(field, serializers.SerializerMethodField | serializers.HiddenField), field
        assert not isinstance(field, serializers.RelatedField | serializers.ManyRelatedField), field
        assert not getattr(field.default, "requires_context", False), field


def test_one_body_s_errors_do_not_reach_the_next() -> None:
    refused = JobSubmitInput(data={"project": "a/b", "cluster": "c", "gpus": -1, "gpu": 2})
    accepted = JobSubmitInput(data={"project": "a/b", "cluster": "c", "gpus": 2})

    assert not refused.is_valid()
    assert accepted.is_valid(), accepted.errors
    assert accepted.validated_data == {"project": "a/b", "cluster": "c", "gpus": 2}
    assert refused.errors["gpu"][0].startswith("This operation has no field 'gpu'")
