"""The Redis channel layer's connections wait longer than channels-redis's blocking receive, whatever
redis-py's defaults are; the settings use that configuration for REDIS_URL."""

from __future__ import annotations

import json

import pytest
from channels_redis.core import RedisChannelLayer
from channels_redis.utils import create_pool, decode_hosts

from chatflow_site.layers import redis_layer
from tests.processes import run_manage, site_env

SHOW_POOL = """
from channels_redis.utils import create_pool, decode_hosts
from django.conf import settings
config = settings.CHANNEL_LAYERS["default"]
(host,) = decode_hosts(config["CONFIG"]["hosts"])
kwargs = create_pool(host).connection_kwargs
print(json.dumps([config["BACKEND"], kwargs.get("socket_timeout"),
                  kwargs.get("socket_connect_timeout"), kwargs.get("db")]))
"""


def pool_options(url: str) -> dict:
    (host,) = decode_hosts(redis_layer(url)["CONFIG"]["hosts"])
    return create_pool(host).connection_kwargs


def test_a_read_outlasts_the_blocking_receive_and_a_connect_is_bounded():
    options = pool_options("redis://127.0.0.1:6379/4")
    assert options["socket_timeout"] > RedisChannelLayer.brpop_timeout
    assert options["socket_connect_timeout"] is not None and options["db"] == 4


def test_options_in_the_url_win():
    assert pool_options("redis://127.0.0.1:6379/4?socket_timeout=60")["socket_timeout"] == 60


@pytest.mark.slow
def test_redis_url_configures_that_layer():
    done = run_manage("shell", "-c", "import json\n" + SHOW_POOL, env=site_env(REDIS_URL="redis://127.0.0.1:6379/4"))
    assert done.returncode == 0, done.stderr
    backend, read, connect, db = json.loads(done.stdout.strip().splitlines()[-1])
    assert backend == "channels_redis.core.RedisChannelLayer" and db == 4
    assert read is not None and read > RedisChannelLayer.brpop_timeout and connect is not None
