"""compose.yaml: every service is there, wired by the documented variables, and every
`interlock` command it runs exists in the CLI with the options it passes."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import click
import pytest
import yaml

from workers.cli import main

ROOT = Path(__file__).resolve().parent.parent
COMPOSE = yaml.safe_load((ROOT / "compose.yaml").read_text())


def _commands(value: Any) -> list[list[str]]:
    """The `interlock ...` invocations in a compose command or healthcheck."""
    if value is None:
        return []
    words = value if isinstance(value, list) else shlex.split(value)
    if words and words[0] == "CMD":
        words = words[1:]
    if words[:2] == ["sh", "-c"]:
        out = []
        for piece in words[2].split("&&"):
            out.extend(_commands(shlex.split(piece)))
        return out
    return [words] if words and words[0] == "interlock" else []


def _invocations() -> list[tuple[str, list[str]]]:
    found = []
    for name, service in COMPOSE["services"].items():
        for cmd in _commands(service.get("command")):
            found.append((name, cmd))
        for cmd in _commands((service.get("healthcheck") or {}).get("test")):
            found.append((name, cmd))
    return found


def test_services_present() -> None:
    services = COMPOSE["services"]
    assert {"redis", "postgres", "migrate", "worker", "resume-consumer"} <= set(services)
    redis_cmd = " ".join(services["redis"]["command"])
    assert "--appendonly yes" in redis_cmd
    assert "--appendfsync always" in redis_cmd, "docs/operations.md, Known limits"
    assert "--maxmemory-policy noeviction" in redis_cmd
    for name in ("redis", "postgres", "worker", "resume-consumer"):
        assert services[name].get("healthcheck"), f"{name} has no health check"
    env = services["worker"]["environment"]
    for var in ("INTERLOCK_APP", "INTERLOCK_BROKER_URL", "INTERLOCK_STORE_URL", "INTERLOCK_SECRET"):
        assert var in env
    assert env["INTERLOCK_SECRET"] == "${INTERLOCK_SECRET:-}", "no secret everyone knows"
    for name in ("worker", "resume-consumer"):  # alive, not only broker and store up
        check = services[name]["healthcheck"]["test"]
        beat = check[check.index("--heartbeat-file") + 1]
        assert f"--heartbeat-file {beat}" in " ".join(services[name]["command"]), name


def test_every_service_runs_interlock() -> None:
    names = {name for name, _ in _invocations()}
    assert {"migrate", "worker", "resume-consumer"} <= names


@pytest.mark.parametrize(("service", "argv"), _invocations(), ids=lambda v: str(v)[:40])
def test_command_exists_in_cli(service: str, argv: list[str]) -> None:
    assert isinstance(main, click.Group)
    sub = main.commands.get(argv[1])
    assert sub is not None, f"{service}: `interlock {argv[1]}` is not a command"
    known = {opt for p in sub.params for opt in getattr(p, "opts", [])}
    flags = [a for a in argv[2:] if a.startswith("--")]
    unknown = [f for f in flags if f.split("=")[0] not in known]
    assert not unknown, f"{service}: `interlock {argv[1]}` has no option {unknown}"
    ctx = sub.make_context(argv[1], list(argv[2:]), resilient_parsing=False)  # parses, or raises
    for flag in flags:  # each flag given is parsed into a value
        name = flag.split("=")[0]
        [param] = [p for p in sub.params if name in getattr(p, "opts", [])]
        assert param.name in ctx.params, f"{service}: {name} was not parsed"


def test_one_install_at_a_time_before_the_services_start() -> None:
    """Only the one-shot `migrate` installs the project, into the virtualenv on the
    `venv` volume; the worker and the resume consumer wait for it to finish and run from
    that virtualenv (two installs at once used to race on the mounted checkout)."""
    services = COMPOSE["services"]
    assert "venv" in COMPOSE["volumes"]
    installs = [n for n, s in services.items() if "pip install" in json.dumps(s.get("command"))]
    assert installs == ["migrate"], installs
    for name in ("migrate", "worker", "resume-consumer"):
        service = services[name]
        assert "venv:/venv" in service["volumes"], name
        assert service["environment"]["PATH"].startswith("/venv/bin:"), name
    for name in ("worker", "resume-consumer"):
        wait = services[name]["depends_on"]["migrate"]["condition"]
        assert wait == "service_completed_successfully", name


def test_long_running_services_start_again_and_wait_for_redis_and_postgres() -> None:
    """A service's own `depends_on` replaces the anchor's (YAML merges are shallow):
    the worker and the resume consumer name redis and postgres again. Every
    long-running service starts again when it stops; the one-shot migration does not."""
    services = COMPOSE["services"]
    for name in ("redis", "postgres", "worker", "resume-consumer"):
        assert services[name].get("restart") == "unless-stopped", name
    assert services["migrate"]["restart"] == "no"
    for name in ("worker", "resume-consumer"):
        deps = services[name]["depends_on"]
        for service in ("redis", "postgres"):
            assert deps[service]["condition"] == "service_healthy", (name, service)
