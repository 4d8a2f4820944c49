"""JSON schemas the structured-output tests share: nested objects, arrays, enums, required fields, bounded
numbers, anyOf (strings bounded so the small model finishes within the token budget)."""

NAME = {"type": "string", "minLength": 1, "maxLength": 12}

SCHEMAS = {
    "nested": {"type": "object", "properties": {
        "person": {"type": "object", "properties": {"name": NAME, "age": {"type": "integer", "minimum": 0,
                                                                           "maximum": 120}},
                   "required": ["name", "age"], "additionalProperties": False}},
        "required": ["person"], "additionalProperties": False},
    "array_enum": {"type": "object", "properties": {
        "colors": {"type": "array", "items": {"type": "string", "enum": ["red", "green", "blue"]},
                   "minItems": 1, "maxItems": 3},
        "size": {"enum": ["S", "M", "L"]}},
        "required": ["colors", "size"], "additionalProperties": False},
    "bounded_numbers": {"type": "object", "properties": {
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "count": {"type": "integer", "minimum": 3, "maximum": 9}},
        "required": ["score", "count"], "additionalProperties": False},
    "any_of": {"type": "object", "properties": {
        "id": {"anyOf": [{"type": "integer", "minimum": 0, "maximum": 1000}, NAME]},
        "ok": {"type": "boolean"}},
        "required": ["id", "ok"], "additionalProperties": False},
}
