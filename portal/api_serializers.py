"""Serializers of the REST API's hot paths that make their fields once per class instead of once per request."""

from __future__ import annotations

from typing import Any

from rest_framework import serializers
from rest_framework.utils.serializer_helpers import BindingDict


# A serializer whose fields are made and bound once per class, and then serve every instance.
#
# DRF deep-copies every declared field for each serializer it makes, a nested one's too: for a job submission
# that was a fifth of its CPU. Validating or rendering only reads the fields, so one set can serve every
# request, as long as none of them reads the context or the root's `partial` (they see an instance of their
# own, made here, which holds no request's data). Subclasses must keep to that. (No docstring: drf-spectacular
# would show it as the description of every serializer that has none of its own.)
class FieldsBoundOnce(serializers.Serializer[Any]):
    @property
    def fields(self) -> BindingDict:
        bound = _BOUND_FIELDS.get(type(self))
        if bound is None:
            bound = _BOUND_FIELDS.setdefault(type(self), super(FieldsBoundOnce, type(self)()).fields)
        return bound


_BOUND_FIELDS: dict[type[FieldsBoundOnce], BindingDict] = {}
