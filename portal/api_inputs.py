"""Request bodies of the REST API: a field an operation does not know is refused by name, never dropped."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from rest_framework import serializers

from portal.api_serializers import FieldsBoundOnce


# The input serializer of a request body. A misspelt or unsupported field (`"gpu"` for `"gpus"`, `"array": "0-3"`
# on a plain submit) would otherwise be dropped silently and the request run without it; it is refused with a
# 400 that names it and lists the fields the operation takes. The schema says the same (`additionalProperties:
# false`, see `bodies_closed_in_schema`), so generated clients know. (No docstring: drf-spectacular would show
# it as the description of every body that has none of its own.)
# Its fields are made once per class (`FieldsBoundOnce`): no body input validates with the context.
class BodyInput(FieldsBoundOnce):
    def to_internal_value(self, data: Any) -> Any:
        if isinstance(data, Mapping):
            unknown = sorted(str(name) for name in data if name not in self.fields)
            if unknown:
                known = ", ".join(name for name, field in self.fields.items() if not field.read_only)
                raise serializers.ValidationError(
                    {
                        name: [f"This operation has no field '{name}'; it takes: {known} (see /api/docs/)."]
                        for name in unknown
                    }
                )
        return super().to_internal_value(data)


def bodies_closed_in_schema(result: dict[str, Any], **kwargs: Any) -> dict[str, Any]:
    """drf-spectacular postprocessing hook: the request components of `BodyInput` serializers admit no other
    properties, as the serializers enforce."""
    names = {cls.__name__ for cls in _subclasses(BodyInput)}
    for name, component in result.get("components", {}).get("schemas", {}).items():
        if name.removesuffix("Request") in names and component.get("type") == "object":
            component["additionalProperties"] = False
    return result


def _subclasses(cls: type) -> set[type]:
    found = set(cls.__subclasses__())
    for sub in list(found):
        found |= _subclasses(sub)
    return found
