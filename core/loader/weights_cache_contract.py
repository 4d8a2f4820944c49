"""The contract check of :mod:`.weights_cache`: what loading a model changed besides its parameters and buffers.

Why its own module: the cache may store a model only when restoring its tensors restores everything loading did;
``weights_cache.save`` compares the attribute state recorded by :func:`snapshot` before the weights stream in with
the state afterwards (:func:`_changed`), and caches nothing when another attribute changed.
"""

from __future__ import annotations

from typing import Any

from octavo.core.loader.weights_cache_key import _SIMPLE


def _same(a: Any, b: Any) -> bool:
    """Shallow equality of two recorded attribute values: the same object, or equal plain data, or containers
    holding the same objects."""
    if isinstance(a, (list, tuple)) and isinstance(b, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, set) and isinstance(b, set):
        return a == b
    if a is b:
        return True
    return isinstance(a, _SIMPLE) and type(a) is type(b) and a == b


def _copy(value: Any) -> Any:
    if isinstance(value, (list, tuple)):
        return type(value)(_copy(v) for v in value) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _copy(v) for k, v in value.items()}
    if isinstance(value, set):
        return set(value)
    return value


_TENSOR_SLOTS = ("_parameters", "_buffers", "_non_persistent_buffers_set", "_modules")


def _attr_state(model: Any) -> dict:
    """Every module's plain attributes, and those of the objects it holds (one level: quantization methods,
    configs), plus each parameter's own attributes; tensors held as plain attributes are compared by value."""
    import torch

    state: dict = {}
    for name, module in model.named_modules():
        attrs = {}
        for key, value in vars(module).items():
            if key in _TENSOR_SLOTS or key.startswith("_forward") or key.startswith("_backward") or \
                    key.endswith("_hooks") or key.startswith("_state_dict") or key.startswith("_load_state_dict"):
                continue
            if isinstance(value, torch.Tensor):
                attrs[key] = ("tensor", value, value.detach().clone())
                continue
            attrs[key] = _copy(value)
            if not isinstance(value, (_SIMPLE, torch.nn.Module, list, tuple, dict, set)) and hasattr(value, "__dict__"):
                attrs[f"{key}.__dict__"] = {k: _copy(v) for k, v in vars(value).items()}
        for pname, param in module._parameters.items():
            if param is not None:
                attrs[f"param {pname}"] = {k: _copy(v) for k, v in vars(param).items()}
        state[name] = attrs
    return state


def _changed(before: dict, after: dict) -> str | None:
    """The first attribute loading changed other than through parameters and buffers (None: none)."""
    import torch

    for name in before.keys() | after.keys():
        a, b = before.get(name), after.get(name)
        if a is None or b is None:
            return f"module {name!r} appeared or disappeared"
        for key in a.keys() | b.keys():
            if key.startswith("param ") and (key not in a or key not in b):
                continue  # a parameter deleted or made by processing: the restore recreates exactly that
            if key not in a or key not in b:
                return f"{name}.{key} was added or removed"
            x, y = a[key], b[key]
            if isinstance(x, tuple) and len(x) == 3 and x[0] == "tensor":
                if not (isinstance(y, tuple) and len(y) == 3 and y[1] is x[1] and torch.equal(x[2], y[2])):
                    return f"{name}.{key} (a tensor attribute) changed"
            elif not _same(x, y):
                return f"{name}.{key} changed"
    return None


def snapshot(model: Any) -> dict:
    """The attribute state before the weights load (compared by ``save``)."""
    return _attr_state(model)
