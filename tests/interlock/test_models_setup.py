"""Choosing and configuring a model: names without a provider, the INTERLOCK_MODEL_*
settings, and what a retry logs (a model on a closed local port: real connections
refused, nothing mocked)."""

from __future__ import annotations

import importlib.util
import logging
from collections.abc import Callable

import pytest

from interlock import Interlock, Message, ModelRequest, Part, Status, StatusError
from interlock.models import Model, ModelError, RetryPolicy
from interlock.models import openai as openai_models
from tests.services import free_port

ENV_VARS = (
    "INTERLOCK_MODEL_MAX_ATTEMPTS",
    "INTERLOCK_MODEL_TIMEOUT",
    "OLLAMA_BASE_URL",
    "OLLAMA_API_KEY",
    "ANTHROPIC_API_KEY",
    "ANTHROPIC_BASE_URL",
)


@pytest.fixture(autouse=True)
def clean_env(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ENV_VARS:
        monkeypatch.delenv(name, raising=False)


def registry(registries: list[Interlock]) -> Interlock:
    ai = Interlock()
    registries.append(ai)
    return ai


def hello() -> ModelRequest:
    return ModelRequest(messages=[Message(role="user", content=[Part(text="Hi")])])


needs_anthropic = pytest.mark.skipif(
    importlib.util.find_spec("anthropic") is None, reason="the anthropic extra is not installed"
)

# The plugins that read the settings: the OpenAI-compatible presets and Anthropic.
PLUGINS = ["ollama/llama3.1", pytest.param("anthropic/claude-haiku-4-5", marks=needs_anthropic)]


# -- settings -----------------------------------------------------------------------------


@pytest.mark.parametrize("model", PLUGINS)
@pytest.mark.parametrize("value", ["-1", "0", "-0.5", "nan", "inf", "-inf", "soon"])
def test_a_model_timeout_must_be_a_finite_number_above_0(
    model: str, value: str, monkeypatch: pytest.MonkeyPatch, registries: list[Interlock]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("INTERLOCK_MODEL_TIMEOUT", value)
    with pytest.raises(StatusError) as info:
        registry(registries).lookup_model(model)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message == (
        f"INTERLOCK_MODEL_TIMEOUT must be a number of seconds greater than 0, got {value!r}"
    )
    monkeypatch.setenv("INTERLOCK_MODEL_TIMEOUT", "2.5")
    assert getattr(registry(registries).lookup_model(model), "timeout", None) == 2.5


@pytest.mark.parametrize("model", PLUGINS)
@pytest.mark.parametrize("value", ["0", "-2", "1.5", "abc"])
def test_model_max_attempts_must_be_a_whole_number_of_at_least_1(
    model: str, value: str, monkeypatch: pytest.MonkeyPatch, registries: list[Interlock]
) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("INTERLOCK_MODEL_MAX_ATTEMPTS", value)
    with pytest.raises(StatusError) as info:
        registry(registries).lookup_model(model)
    assert info.value.status is Status.INVALID_ARGUMENT
    assert info.value.message == (
        f"INTERLOCK_MODEL_MAX_ATTEMPTS must be a whole number of at least 1, got {value!r}"
    )
    monkeypatch.setenv("INTERLOCK_MODEL_MAX_ATTEMPTS", "1")
    found = registry(registries).lookup_model(model)
    assert getattr(found, "retry", None) == RetryPolicy(attempts=1)


# -- retry logs -----------------------------------------------------------------------------


def _ollama(ai: Interlock, url: str, monkeypatch: pytest.MonkeyPatch) -> Model:
    monkeypatch.setenv("OLLAMA_BASE_URL", url)
    return ai.lookup_model("ollama/llama3.1")


def _vllm(ai: Interlock, url: str, monkeypatch: pytest.MonkeyPatch) -> Model:
    ai.register_provider("vllm", openai_models.provider("vllm", base_url=f"{url}/v1"))
    return ai.lookup_model("vllm/Qwen2.5-7B-Instruct")


def _anthropic(ai: Interlock, url: str, monkeypatch: pytest.MonkeyPatch) -> Model:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-test")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    return ai.lookup_model("anthropic/claude-haiku-4-5")


@pytest.mark.parametrize(
    "build",
    [
        pytest.param(_ollama, id="ollama"),
        pytest.param(_vllm, id="vllm"),
        pytest.param(_anthropic, id="anthropic", marks=needs_anthropic),
    ],
)
def test_a_retry_log_line_names_the_model_once(
    build: Callable[[Interlock, str, pytest.MonkeyPatch], Model],
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
    registries: list[Interlock],
) -> None:
    monkeypatch.setenv("INTERLOCK_MODEL_MAX_ATTEMPTS", "2")
    model = build(registry(registries), f"http://127.0.0.1:{free_port()}", monkeypatch)
    with (
        caplog.at_level(logging.WARNING, logger="interlock.models"),
        pytest.raises(ModelError) as info,
    ):
        model.generate(hello())
    assert info.value.status is Status.UNAVAILABLE
    assert info.value.message.count(model.name) == 1, info.value.message
    [line] = [r.getMessage() for r in caplog.records if r.name == "interlock.models"]
    assert line.startswith(f"{model.name}: cannot reach "), line
    assert line.count(model.name) == 1, line
    assert "retrying in" in line and "(attempt 2 of 2)" in line


def test_a_provider_refuses_an_option_its_models_do_not_take_when_made() -> None:
    """A misspelled option of `openai.provider` is a TypeError where the provider is
    made, not at the first lookup of one of its models; the options it takes pass on."""
    with pytest.raises(TypeError, match="timout"):
        openai_models.provider("vllm", base_url="http://gpu:8000/v1", timout=3)
    factory = openai_models.provider("vllm", base_url="http://gpu:8000/v1", timeout=3)
    model = factory("llama")
    assert model.name == "vllm/llama"
    assert model.timeout == 3


# -- names -------------------------------------------------------------------------------


def test_a_model_name_without_its_provider_says_how_names_read(
    registries: list[Interlock],
) -> None:
    ai = registry(registries)
    ai.register_provider("vllm", openai_models.provider("vllm", base_url="http://gpu:8000/v1"))
    with pytest.raises(StatusError) as info:
        ai.lookup_model("gpt-4o-mini")
    assert info.value.status is Status.NOT_FOUND
    assert info.value.message == (
        "model 'gpt-4o-mini' is not defined: define it with ai.define_model under that "
        "name, or name a provider's model as provider/model (e.g. openai/gpt-4o-mini); "
        "registered providers: anthropic, googleai, ollama, "
        "openai, scripted, vllm"
    )
    # An unknown provider keeps its own hint.
    with pytest.raises(StatusError) as other:
        ai.lookup_model("nowhere/gpt-4o-mini")
    assert other.value.message == (
        "model 'nowhere/gpt-4o-mini' is not defined: define it with ai.define_model, or "
        "register a provider for 'nowhere' (registered providers: anthropic, googleai, "
        "ollama, openai, scripted, vllm)"
    )
