"""The "name=value;name=value" spec strings the C ABI takes, to and from Python dicts."""

from __future__ import annotations

from typing import Any, Mapping


def _format_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (list, tuple)):
        return ",".join(_format_value(v) for v in value)
    if isinstance(value, float):
        return repr(value)
    if hasattr(value, "tolist"):  # numpy scalar or array
        return _format_value(value.tolist())
    text = str(value)
    if ";" in text or "=" in text or "|" in text:
        raise ValueError(f"spec value {text!r} may not contain ';', '=' or '|'")
    return text


def to_spec(entries: Mapping[str, Any]) -> str:
    """{"name": "adam", "beta_1": 0.9} -> "name=adam;beta_1=0.9" (None values are left out)."""
    return ";".join(f"{k}={_format_value(v)}" for k, v in entries.items() if v is not None)


def _parse_value(text: str) -> Any:
    if text in ("true", "false"):
        return text == "true"
    try:
        return int(text)
    except ValueError:
        pass
    if "," in text:
        return [float(t) for t in text.split(",")]
    try:
        return float(text)
    except ValueError:
        return text


def from_spec(text: str) -> dict:
    """Inverse of to_spec (numbers come back as int or float, lists of numbers as lists)."""
    out: dict = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        name, _, value = item.partition("=")
        out[name.strip()] = _parse_value(value.strip())
    return out
