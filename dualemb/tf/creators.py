"""Table backends ("KV creators"), TFRA's ``kv_creator=`` argument.

Every creator yields the core's CPU hash table; the creator only contributes table options:

- ``CuckooHashTableCreator(config=CuckooHashTableConfig())`` — the default: an unbounded table that
  grows by rehash (TFRA's libcuckoo table; the name is kept so TFRA code runs).
- ``HkvHashTableCreator(config=HkvHashTableConfig(max_capacity=..., evict_strategy=...))`` — a
  bounded table: a write that grows a shard past ``max_capacity / num_shards`` rows evicts the
  lowest-scored keys (``HkvEvictStrategy.LRU`` -> least recently updated, ``LFU`` -> least
  frequently updated), and reports how many. Other HKV options (HBM sizes, epochs, custom score
  functions) have no meaning for a host table and must be left at their defaults.
- ``RedisTableCreator(RedisTableConfig(redis_config_abs_dir=..., redis_config_abs_dir_env=...))`` —
  rows kept in Redis (standalone, Sentinel or Cluster) through the core's Redis backend; the JSON
  file takes TFRA's members (``dualemb.core.redis_config``, docs/redis.md). Shard ``i`` of a
  Variable is the Redis table (Variable name, model tag, shard ``i``): shards hold disjoint keys.

``saver=`` (TFRA's FileSystemSaver) is accepted for compatibility and ignored: dualemb tables are
always saved in the common checkpoint format with the TF checkpoint.
"""

from __future__ import annotations

import enum


class KVCreator:
    """Base class of creators: ``create(...)`` is not used by dualemb; ``table_options(n)`` gives
    the core config entries for one of ``n`` shards."""

    def __init__(self, config=None, saver=None):
        self.config = config
        self.saver = saver

    def table_options(self, num_shards: int) -> dict:
        return {}

    def shard_options(self, table_name: str, shard: int, num_shards: int) -> dict:
        """Config entries for shard ``shard`` of the table named ``table_name`` (merged over
        ``table_options``); only backends that name their shards need them."""
        return {}

    def create(self, *args, **kwargs):
        raise NotImplementedError(
            "dualemb creates its tables in the core; KVCreator.create is not used")

    def get_config(self) -> dict:
        return {"class_name": type(self).__name__,
                "config": vars(self.config) if self.config is not None else None}


class CuckooHashTableConfig:
    """TFRA's (empty) configuration of the default table."""

    def __init__(self):
        pass


class CuckooHashTableCreator(KVCreator):
    """The default creator: an unbounded core table."""


class HkvEvictStrategy(enum.IntEnum):
    LRU = 0
    LFU = 1
    EPOCHLRU = 2
    EPOCHLFU = 3
    CUSTOMIZED = 4


class HkvHashTableConfig:
    def __init__(self, init_capacity=1 << 20, max_capacity=1 << 20, max_hbm_for_values=1 << 30,
                 evict_strategy=HkvEvictStrategy.LRU, step_per_epoch=0, gen_scores_fn=None,
                 reserved_key_start_bit=0):
        self.init_capacity = init_capacity
        self.max_capacity = max_capacity
        self.max_hbm_for_values = max_hbm_for_values
        self.evict_strategy = evict_strategy
        self.step_per_epoch = step_per_epoch
        self.gen_scores_fn = gen_scores_fn
        self.reserved_key_start_bit = reserved_key_start_bit


class HkvHashTableCreator(KVCreator):
    """A bounded, evicting core table configured like TFRA's HKV table (see module docstring)."""

    def table_options(self, num_shards: int) -> dict:
        cfg = self.config or HkvHashTableConfig()
        strategy = HkvEvictStrategy(cfg.evict_strategy)
        if strategy not in (HkvEvictStrategy.LRU, HkvEvictStrategy.LFU):
            raise NotImplementedError(
                f"HKV evict strategy {strategy.name} is not supported by the core table "
                "(supported: LRU, LFU)")
        if cfg.gen_scores_fn is not None or cfg.step_per_epoch:
            raise NotImplementedError("HKV custom scores and epochs are not supported")
        capacity = int(cfg.max_capacity)
        if capacity <= 0:
            raise ValueError(f"max_capacity must be positive, got {capacity}")
        per_shard = max(1, capacity // max(1, num_shards))
        return {"capacity": per_shard,
                "evict_policy": "recency" if strategy == HkvEvictStrategy.LRU else "frequency"}


class RedisTableConfig:
    """Where TFRA's Redis JSON config file is: the file named by the environment variable
    ``redis_config_abs_dir_env`` (default ``TFRA_REDIS_CONFIG_PATH``), then by
    ``TFRA_REDIS_CONFIG_PATH``, then ``redis_config_abs_dir``."""

    def __init__(self, redis_config_abs_dir=None, redis_config_abs_dir_env=None):
        self.redis_config_abs_dir = redis_config_abs_dir
        self.redis_config_abs_dir_env = redis_config_abs_dir_env or "TFRA_REDIS_CONFIG_PATH"


class RedisTableCreator(KVCreator):
    """Tables in Redis. The config file is read when the Variable is created (a missing file or
    variable raises ValueError, a wrong member names itself)."""

    def _redis(self) -> dict:
        from dualemb.core import redis_config
        cfg = self.config if self.config is not None else RedisTableConfig()
        if not isinstance(cfg, RedisTableConfig):
            raise TypeError(f"RedisTableCreator needs a RedisTableConfig, got {cfg!r}")
        path = redis_config.find_config_file(cfg.redis_config_abs_dir,
                                             cfg.redis_config_abs_dir_env)
        return redis_config.load_config_file(path)

    def table_options(self, num_shards: int) -> dict:
        return {"backend": "redis"}

    def shard_options(self, table_name: str, shard: int, num_shards: int) -> dict:
        return {"redis": {**self._redis(), "name": table_name, "shard": int(shard)}}


class FileSystemSaver:
    """Accepted for compatibility (``CuckooHashTableCreator(saver=FileSystemSaver())``); dualemb
    always saves tables in its common format with the checkpoint, so this has no effect."""

    def __init__(self, proc_size=None, proc_rank=None, save_path=None, buffer_size=4096):
        self.proc_size = proc_size
        self.proc_rank = proc_rank
        self.save_path = save_path
        self.buffer_size = buffer_size

    def set_upsert_restore(self, value: bool) -> None:
        self.upsert_restore = bool(value)
