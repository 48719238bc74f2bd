"""Reader for the specs of checkpoints written before specs became JSON.

Until then, specs travelled as "name=value;name=value" text, and a table's description as
"<config>|<optimizer spec>". That text survives in two places only, and this module is used only
to read them:

* checkpoint manifests of format version 1, whose initializer and optimizer objects were parsed
  from that text and lost types on the way (a one-value vector initializer became a bare number,
  a float such as 0.0 an int);
* the metadata tensor of TF checkpoints written by ``dualemb.tf`` with description version 1
  (``"describe": "<config>|<optimizer spec>"``).

Every member's type is known from the schema of the old writer (the C++ core), so the specs come
back with the types today's specs have: nothing writes the old syntax any more.
"""

from __future__ import annotations

from typing import Any

# Members the old core wrote as integers, as names (strings), and as lists of floats; booleans
# were written true/false; every other member was a real number.
_INTS = frozenset({"dim", "seed", "capacity", "num_threads"})
_NAMES = frozenset({"key_dtype", "value_dtype", "initializer", "evict_policy", "name", "flavor"})
_LISTS = frozenset({"values"})


def _typed(name: str, value: Any) -> Any:
    """`value` (a string of the old text, or what the old reader made of it) with its type."""
    if name in _NAMES:
        return str(value)
    if name in _LISTS:
        if isinstance(value, str):
            value = value.split(",")
        elif not isinstance(value, (list, tuple)):
            value = [value]  # the old reader turned a one-value list into a bare number
        return [float(v) for v in value]
    if isinstance(value, bool) or value in ("true", "false"):
        return value is True or value == "true"
    if name in _INTS:
        return int(value)
    return float(value)


def parse_spec(text: str) -> dict:
    """'name=adam;flavor=keras;beta_1=0.9' -> {"name": "adam", "flavor": "keras", "beta_1": 0.9}."""
    out: dict = {}
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        name, sep, value = item.partition("=")
        name = name.strip()
        if not sep or not name:
            raise ValueError(f"malformed entry {item!r} in legacy spec {text!r}")
        try:
            out[name] = _typed(name, value.strip())
        except ValueError:
            raise ValueError(f"legacy spec {text!r}: bad value for {name!r}") from None
    return out


def parse_description(text: str) -> tuple[dict, dict | None]:
    """'<config>|<optimizer spec>' -> (config, optimizer spec or None)."""
    config, _, opt = text.partition("|")
    return parse_spec(config), (parse_spec(opt) if opt.strip() else None)


def upgrade_spec(spec: dict | None) -> dict | None:
    """An initializer or optimizer object of a version-1 manifest, with today's types."""
    if spec is None:
        return None
    try:
        return {k: _typed(k, v) for k, v in spec.items()}
    except (TypeError, ValueError):
        raise ValueError(f"malformed spec {spec!r}") from None
