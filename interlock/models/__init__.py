"""Models: the protocol, function models and the built-in providers.

Every `Interlock()` registry resolves these by name, lazily (nothing is imported or
connected until a model is looked up):

    openai/<model>      OpenAI Chat Completions          OPENAI_API_KEY, OPENAI_BASE_URL
    googleai/<model>    Gemini (OpenAI-compatible API)   GEMINI_API_KEY or GOOGLE_API_KEY
    ollama/<model>      a local Ollama server            OLLAMA_BASE_URL
    anthropic/<model>   Claude (Messages API)            ANTHROPIC_API_KEY, ANTHROPIC_BASE_URL

    scripted/banking    the banking example's scripted model (no network)

Other `scripted/<name>` models are defined with `scripted.define` (no network).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

from schemas import Status

from ..errors import StatusError
from . import banking, scripted
from ._http import ModelError, RetryPolicy
from .base import ChunkCallback, FunctionModel, Model

if TYPE_CHECKING:
    from ..registry import Interlock

__all__ = [
    "BUILTIN_PROVIDERS",
    "ChunkCallback",
    "FunctionModel",
    "Model",
    "ModelError",
    "RetryPolicy",
    "register_builtin_providers",
    "scripted",
]

BUILTIN_PROVIDERS = ("openai", "googleai", "ollama", "anthropic", "scripted")


def _factory(provider: str) -> Callable[[str], Model]:
    def build(name: str) -> Model:
        if provider == "scripted":
            return _scripted(name)
        if provider == "anthropic":
            from . import anthropic

            return anthropic.model(name)
        from . import openai

        return openai.PRESETS[provider].model(name)

    return build


def _scripted(name: str) -> Model:
    if name == banking.NAME:
        return FunctionModel(f"scripted/{name}", banking.banking_model)
    raise StatusError(
        Status.NOT_FOUND,
        f"model 'scripted/{name}' is not defined: define it with "
        f"scripted.define(ai, {name!r}, ...) (built in: scripted/{banking.NAME})",
    )


def register_builtin_providers(ai: Interlock) -> None:
    """Register `openai`, `googleai`, `ollama`, `anthropic` and `scripted` on `ai`
    (lazily)."""
    for provider in BUILTIN_PROVIDERS:
        ai.register_provider(provider, _factory(provider))
