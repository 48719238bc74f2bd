"""TFRA's Redis configuration (``RedisTableConfig``'s JSON file) as the core's ``redis`` config.

TFRA reads a JSON file whose members are documented in its ``RedisBackend.md``; this module checks
each member's type and value, names the member that is wrong or unknown, and translates the
members that mean something to dualemb into the core's ``"redis"`` table config (docs/redis.md).
Members about redis-plus-plus' connection pool, TFRA's model library and hash-tag tables are
accepted (so TFRA files load unchanged) and have no effect; docs/redis.md lists them.
"""

from __future__ import annotations

import json
import os

_MODES = {0: "cluster", 1: "sentinel", 2: "standalone"}

# name -> (type check, description). bool is not an int here.
def _is_int(v):
    return isinstance(v, int) and not isinstance(v, bool)


def _is_str_list(v):
    return isinstance(v, list) and all(isinstance(x, str) for x in v)


def _is_int_list(v):
    return isinstance(v, list) and all(_is_int(x) for x in v)


_TYPES = {
    "redis_connection_mode": (_is_int, "0 (cluster), 1 (sentinel) or 2 (standalone)"),
    "redis_master_name": (lambda v: isinstance(v, str), "a string"),
    "redis_host_ip": (_is_str_list, "a list of strings"),
    "redis_host_port": (_is_int_list, "a list of integers"),
    "redis_user": (lambda v: isinstance(v, str), "a string"),
    "redis_password": (lambda v: isinstance(v, str), "a string"),
    "redis_db": (_is_int, "an integer >= 0"),
    "redis_connect_timeout": (_is_int, "an integer (milliseconds) >= 1"),
    "redis_socket_timeout": (_is_int, "an integer (milliseconds) >= 1"),
    "storage_slice": (_is_int, "an integer in [1, 65536]"),
    "keys_sending_size": (_is_int, "an integer >= 1"),
    "model_tag_import": (lambda v: isinstance(v, str), "a string"),
    "model_tag_runtime": (lambda v: isinstance(v, str), "a string"),
    # Accepted for compatibility, no effect (docs/redis.md says why).
    "redis_read_access_slave": (lambda v: isinstance(v, bool), "true or false"),
    "redis_connect_keep_alive": (lambda v: isinstance(v, bool), "true or false"),
    "redis_conn_pool_size": (_is_int, "an integer"),
    "redis_wait_timeout": (_is_int, "an integer"),
    "redis_connection_lifetime": (_is_int, "an integer"),
    "redis_sentinel_connect_timeout": (_is_int, "an integer"),
    "redis_sentinel_socket_timeout": (_is_int, "an integer"),
    "storage_slice_import": (_is_int, "an integer"),
    "using_md5_prefix_name": (lambda v: isinstance(v, bool), "true or false"),
    "redis_hash_tags_import": (_is_str_list, "a list of strings"),
    "redis_hash_tags_runtime": (_is_str_list, "a list of strings"),
    "expire_model_tag_in_seconds": (_is_int, "an integer"),
    "table_store_mode": (_is_int, "an integer"),
    "model_lib_abs_dir": (lambda v: isinstance(v, str), "a string"),
    "using_model_lib": (lambda v: isinstance(v, bool), "true or false"),
}


def from_tfra(params: dict, where: str = "redis config") -> dict:
    """The core ``redis`` config (without ``name``/``shard``) for TFRA's JSON members."""
    if not isinstance(params, dict):
        raise ValueError(f"{where}: must be a JSON object, got {type(params).__name__}")
    for key, value in params.items():
        if key not in _TYPES:
            raise ValueError(f"{where}: unknown member {key!r} (known: {', '.join(sorted(_TYPES))})")
        check, want = _TYPES[key]
        if not check(value):
            raise ValueError(f"{where}: {key!r} must be {want}, got {value!r}")
    mode = params.get("redis_connection_mode", 2)
    if mode not in _MODES:
        raise ValueError(f"{where}: 'redis_connection_mode' must be 0 (cluster), 1 (sentinel) "
                         f"or 2 (standalone), got {mode!r}")
    hosts = params.get("redis_host_ip", ["127.0.0.1"])
    ports = params.get("redis_host_port", [6379])
    if not hosts:
        raise ValueError(f"{where}: 'redis_host_ip' lists no host")
    if len(ports) == 1 and len(hosts) > 1:
        ports = ports * len(hosts)
    if len(ports) != len(hosts):
        raise ValueError(f"{where}: 'redis_host_port' has {len(ports)} ports for "
                         f"{len(hosts)} hosts in 'redis_host_ip'")
    for p in ports:
        if not 0 < p < 65536:
            raise ValueError(f"{where}: 'redis_host_port' has port {p} out of range")
    runtime = params.get("model_tag_runtime", "test")
    imported = params.get("model_tag_import", runtime)
    if imported != runtime:
        raise ValueError(f"{where}: 'model_tag_import' ({imported!r}) differs from "
                         f"'model_tag_runtime' ({runtime!r}); copying another model tag's rows "
                         "is not supported: save the old table with dualemb's checkpoint and "
                         "load it into the new one")
    core = {"mode": _MODES[mode], "addresses": [f"{h}:{p}" for h, p in zip(hosts, ports)],
            "model_tag": runtime}
    for src, dst in (("redis_master_name", "master_name"), ("redis_password", "password"),
                     ("redis_db", "db"), ("storage_slice", "storage_slice"),
                     ("keys_sending_size", "keys_sending_size"),
                     ("redis_connect_timeout", "connect_timeout_ms"),
                     ("redis_socket_timeout", "command_timeout_ms")):
        if src in params:
            core[dst] = params[src]
    user = params.get("redis_user", "")
    if user and user != "default":
        core["user"] = user
    if core["mode"] == "sentinel" and not core.get("master_name"):
        raise ValueError(f"{where}: sentinel mode (redis_connection_mode 1) needs "
                         "'redis_master_name'")
    return core


def find_config_file(redis_config_abs_dir=None, redis_config_abs_dir_env=None) -> str:
    """TFRA's lookup order: the file named by the environment variable
    ``redis_config_abs_dir_env``, then by ``TFRA_REDIS_CONFIG_PATH``, then
    ``redis_config_abs_dir``. Raises ValueError naming what was tried when none exists."""
    tried = []
    for var in dict.fromkeys((redis_config_abs_dir_env, "TFRA_REDIS_CONFIG_PATH")):
        if not var:
            continue
        path = os.environ.get(var)
        if path and os.path.isfile(path):
            return path
        tried.append(f"${var} = {path!r}" if path else f"${var} (not set)")
    if redis_config_abs_dir:
        if os.path.isfile(redis_config_abs_dir):
            return redis_config_abs_dir
        tried.append(f"redis_config_abs_dir = {redis_config_abs_dir!r} (no such file)")
    raise ValueError("no Redis config file found; tried " + "; ".join(tried or ["nothing"]) +
                     " (set redis_config_abs_dir, or the environment variable)")


def load_config_file(path: str) -> dict:
    """The core ``redis`` config from a TFRA JSON config file."""
    try:
        with open(path, encoding="utf-8") as f:
            params = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"Redis config file {path!r} is not valid JSON: {e}") from e
    return from_tfra(params, where=f"Redis config file {path!r}")
