"""Shared fixtures: real Redis and PostgreSQL (see services.py). Skip locally, fail in CI."""

from __future__ import annotations

import os
from collections.abc import Iterator

import pytest
from sqlalchemy.engine import make_url

from interlock import Interlock
from tests.services import (
    RedisServer,
    create_pg_database,
    drop_pg_database,
    pg_admin_url,
    service_unavailable,
    start_redis,
)


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A private redis-server for the whole session (always private, so fault tests may
    stop and restart it)."""
    server = start_redis(tmp_path_factory.mktemp("redis"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def redis_url(request: pytest.FixtureRequest) -> str:
    """`INTERLOCK_TEST_REDIS_URL`, else the URL of a private redis-server (db 0)."""
    env = os.environ.get("INTERLOCK_TEST_REDIS_URL")
    if env:
        import redis

        client = redis.Redis.from_url(env, socket_connect_timeout=2)
        try:
            client.ping()
        except redis.RedisError as exc:
            service_unavailable(f"INTERLOCK_TEST_REDIS_URL={env} does not answer: {exc}")
        finally:
            client.close()
        return env
    server: RedisServer = request.getfixturevalue("redis_server")
    return server.url


@pytest.fixture(scope="session")
def pg_admin() -> str:
    """A PostgreSQL URL that may create databases (`INTERLOCK_TEST_PG_URL` or local)."""
    return pg_admin_url()


@pytest.fixture
def pg_url(pg_admin: str) -> Iterator[str]:
    """A fresh, empty database `interlock_test_<hex>` (`postgresql+psycopg://...`),
    dropped WITH (FORCE) after the test."""
    url = create_pg_database(pg_admin)
    try:
        yield url
    finally:
        drop_pg_database(pg_admin, url)


def pytest_report_header(config: pytest.Config) -> list[str]:
    pg = os.environ.get("INTERLOCK_TEST_PG_URL")
    shown = make_url(pg).render_as_string(hide_password=True) if pg else "local server"
    return [f"interlock services: postgresql={shown}, CI={'yes' if os.environ.get('CI') else 'no'}"]


@pytest.fixture
def registries() -> Iterator[list[Interlock]]:
    """Registries made by a test; their models' HTTP clients are closed after it."""
    made: list[Interlock] = []
    yield made
    for ai in made:
        for model in ai.models.values():
            close = getattr(model, "close", None)
            if close is not None:
                close()
