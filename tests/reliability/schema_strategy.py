"""A hypothesis strategy from an OpenAPI (JSON Schema subset) request schema, as FastAPI emits it.

hypothesis-jsonschema does not run against this hypothesis release, and FastAPI's schemas use a small
subset: ``$ref`` into ``components``, ``anyOf``, ``type`` (object, array, string, integer, number,
boolean, null), ``properties`` / ``required`` / ``additionalProperties``, ``items``, ``enum``, ``const``,
numeric bounds and ``minItems``. Values are drawn inside the declared bounds most of the time and just
outside them sometimes, so both the accepted and the refused edges are exercised.
"""

from __future__ import annotations

from hypothesis import strategies as st

_ANY = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False, allow_infinity=False)
                    | st.text(max_size=16),
                    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
                    max_leaves=8)


def from_schema(schema: dict, components: dict, depth: int = 0) -> st.SearchStrategy:
    """A strategy for values of ``schema`` (``components``: the OpenAPI ``components.schemas``)."""
    if "$ref" in schema:
        return st.deferred(lambda: from_schema(components[schema["$ref"].rsplit("/", 1)[-1]], components, depth))
    if "const" in schema:
        return st.just(schema["const"])
    if "enum" in schema:
        return st.sampled_from(schema["enum"])
    for key in ("anyOf", "oneOf"):
        if key in schema:
            return st.one_of([from_schema(s, components, depth) for s in schema[key]])
    kind = schema.get("type")
    if isinstance(kind, list):
        return st.one_of([from_schema({**schema, "type": k}, components, depth) for k in kind])
    if kind == "null":
        return st.none()
    if kind == "boolean":
        return st.booleans()
    if kind == "integer":
        lo, hi = schema.get("minimum"), schema.get("maximum")
        inside = st.integers(lo, hi if hi is None or lo is None or hi - lo < 2**20 else lo + 2**20)
        edges = st.sampled_from([v for v in (lo, hi, None if lo is None else lo - 1, None if hi is None else hi + 1)
                                 if v is not None] or [0])
        return st.one_of(inside, inside, inside, edges)
    if kind == "number":
        return st.floats(schema.get("minimum"), schema.get("maximum"), allow_nan=False, allow_infinity=False)
    if kind == "string":
        return st.text(max_size=40)
    if kind == "array":
        items = from_schema(schema.get("items", {}), components, depth + 1) if depth < 4 else _ANY
        return st.lists(items, min_size=schema.get("minItems", 0), max_size=min(schema.get("maxItems", 4), 4))
    if kind == "object" or "properties" in schema:
        props = schema.get("properties", {})
        required = set(schema.get("required", ()))
        fixed = {k: from_schema(v, components, depth + 1) for k, v in props.items() if k in required}
        optional = {k: from_schema(v, components, depth + 1) for k, v in props.items() if k not in required}
        base = st.fixed_dictionaries(fixed, optional=optional)
        if schema.get("additionalProperties") not in (None, False) and depth > 0:
            extra = st.dictionaries(st.text(max_size=8), _ANY, max_size=2)
            return st.builds(lambda a, b: {**b, **a}, base, extra)
        return base
    return _ANY
