"""The registry: tools, models and agents, by name."""

from __future__ import annotations

import logging
import os
import secrets
import threading
import warnings
from collections.abc import Awaitable, Callable, Iterable, Mapping
from datetime import timedelta
from typing import Any, Protocol, TypeVar, cast, overload

from schemas import Status

from .agent import Agent
from .errors import StatusError, ToolNotFoundError
from .interrupts import seconds
from .middleware import Middleware
from .models import register_builtin_providers
from .models.base import FunctionModel, Model
from .state import RandomSecretWarning, StateCodec
from .stores.base import SessionStore
from .tools import InterruptibleTool, Tool

__all__ = ["Interlock", "ModelProvider"]

log = logging.getLogger("interlock")

In = TypeVar("In")
Out = TypeVar("Out")
Res = TypeVar("Res")

ModelProvider = Callable[[str], Model]
"""Builds the model `provider/<name>` from `<name>`."""


class _ToolDecorator(Protocol):
    """What `ai.tool(name=...)` returns: a decorator typed by the function it gets."""

    @overload
    def __call__(self, fn: Callable[[In], Awaitable[Out]], /) -> Tool[In, Out]: ...
    @overload
    def __call__(self, fn: Callable[[In], Out], /) -> Tool[In, Out]: ...
    @overload
    def __call__(self, fn: Callable[..., Any], /) -> Tool[Any, Any]: ...


class _InterruptibleToolDecorator(Protocol):
    """What `ai.interruptible_tool(name=...)` returns, typed alike."""

    @overload
    def __call__(
        self, fn: Callable[[In, Res], Awaitable[Out]], /
    ) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def __call__(self, fn: Callable[[In, Res], Out], /) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def __call__(self, fn: Callable[..., Any], /) -> InterruptibleTool[Any, Any, Any]: ...


class Interlock:
    """Holds an application's tools, models and agents.

    `secret` signs client-managed states; it defaults to `INTERLOCK_SECRET`, else a
    random secret per process (states then do not survive a restart)."""

    def __init__(self, secret: str | bytes | None = None) -> None:
        self.tools: dict[str, Tool[Any, Any]] = {}
        self.models: dict[str, Model] = {}
        self.agents: dict[str, Agent] = {}
        self.providers: dict[str, ModelProvider] = {}
        self._secret = secret
        self._codec: StateCodec | None = None
        register_builtin_providers(self)  # openai/ googleai/ ollama/ anthropic/ scripted/ (lazy)

    # -- tools ------------------------------------------------------------------------

    # The overloads type a tool by its function's annotations, sync or async: In, Out
    # and, for an interruptible tool, Res, the type of its `res` parameter as written
    # (`ApprovalReply | None`: None included). A function of another shape (one that
    # takes a ToolContext, say) gives a tool typed Any.

    @overload
    def define_tool(
        self, name: str, description: str, fn: Callable[[In], Awaitable[Out]]
    ) -> Tool[In, Out]: ...
    @overload
    def define_tool(
        self, name: str, description: str, fn: Callable[[In], Out]
    ) -> Tool[In, Out]: ...
    @overload
    def define_tool(
        self, name: str, description: str, fn: Callable[..., Any]
    ) -> Tool[Any, Any]: ...
    def define_tool(self, name: str, description: str, fn: Callable[..., Any]) -> Tool[Any, Any]:
        """Register an ordinary tool `fn(input) -> output`."""
        return self._add_tool(Tool(name, description, fn))

    @overload
    def define_interruptible_tool(
        self, name: str, description: str, fn: Callable[[In, Res], Awaitable[Out]]
    ) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def define_interruptible_tool(
        self, name: str, description: str, fn: Callable[[In, Res], Out]
    ) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def define_interruptible_tool(
        self, name: str, description: str, fn: Callable[..., Any]
    ) -> InterruptibleTool[Any, Any, Any]: ...
    def define_interruptible_tool(
        self, name: str, description: str, fn: Callable[..., Any]
    ) -> InterruptibleTool[Any, Any, Any]:
        """Register a tool `fn(input, resume) -> output` that may call `interrupt()`."""
        tool: InterruptibleTool[Any, Any, Any] = InterruptibleTool(name, description, fn)
        self._add_tool(tool)
        return tool

    @overload
    def tool(self, fn: Callable[[In], Awaitable[Out]], /) -> Tool[In, Out]: ...
    @overload
    def tool(self, fn: Callable[[In], Out], /) -> Tool[In, Out]: ...
    @overload
    def tool(self, fn: Callable[..., Any], /) -> Tool[Any, Any]: ...
    @overload
    def tool(self, name: str, description: str | None = None, /) -> _ToolDecorator: ...
    @overload
    def tool(
        self, fn: None = None, /, *, name: str | None = None, description: str | None = None
    ) -> _ToolDecorator: ...
    def tool(
        self,
        fn: Callable[..., Any] | str | None = None,
        text: str | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> Tool[Any, Any] | _ToolDecorator:
        """Decorator form of `define_tool` (`@ai.tool`, `@ai.tool(name=...,
        description=...)` or `@ai.tool("name", "description")`); returns the tool
        object. Name and description default to the function's."""
        fn, name, description = _decorator_args("tool", fn, text, name, description)

        def register(f: Callable[..., Any]) -> Tool[Any, Any]:
            return self.define_tool(name or f.__name__, description or (f.__doc__ or ""), f)

        return register(fn) if fn is not None else cast(_ToolDecorator, register)

    @overload
    def interruptible_tool(
        self, fn: Callable[[In, Res], Awaitable[Out]], /
    ) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def interruptible_tool(
        self, fn: Callable[[In, Res], Out], /
    ) -> InterruptibleTool[In, Out, Res]: ...
    @overload
    def interruptible_tool(self, fn: Callable[..., Any], /) -> InterruptibleTool[Any, Any, Any]: ...
    @overload
    def interruptible_tool(
        self, name: str, description: str | None = None, /
    ) -> _InterruptibleToolDecorator: ...
    @overload
    def interruptible_tool(
        self, fn: None = None, /, *, name: str | None = None, description: str | None = None
    ) -> _InterruptibleToolDecorator: ...
    def interruptible_tool(
        self,
        fn: Callable[..., Any] | str | None = None,
        text: str | None = None,
        /,
        *,
        name: str | None = None,
        description: str | None = None,
    ) -> InterruptibleTool[Any, Any, Any] | _InterruptibleToolDecorator:
        """Decorator form of `define_interruptible_tool`, called as `tool` is; returns
        the tool object."""
        fn, name, description = _decorator_args("interruptible_tool", fn, text, name, description)

        def register(f: Callable[..., Any]) -> InterruptibleTool[Any, Any, Any]:
            return self.define_interruptible_tool(
                name or f.__name__, description or (f.__doc__ or ""), f
            )

        return register(fn) if fn is not None else cast(_InterruptibleToolDecorator, register)

    def _add_tool(self, tool: Tool[Any, Any]) -> Tool[Any, Any]:
        if tool.name in self.tools:
            raise StatusError(Status.ALREADY_EXISTS, f"tool {tool.name!r} is already defined")
        self.tools[tool.name] = tool
        return tool

    def lookup_tool(self, name: str) -> Tool[Any, Any]:
        try:
            return self.tools[name]
        except KeyError:
            raise ToolNotFoundError(f"tool {name!r} is not defined") from None

    # -- models -----------------------------------------------------------------------

    def define_model(self, name: str, fn: Callable[..., Any]) -> Model:
        """Register the model `name` from `fn(request)` (or, streaming,
        `fn(request, on_chunk)`), returning a `ModelResponse` or a `Message`. Names
        usually read `provider/model` (`scripted/banking`); an agent names the model
        exactly as it was defined."""
        if not isinstance(name, str) or not name.strip():
            raise StatusError(Status.INVALID_ARGUMENT, f"model name {name!r} is empty")
        model = FunctionModel(name, fn)
        self.models[name] = model
        return model

    def register_provider(self, provider: str, factory: ModelProvider) -> None:
        """Resolve every `provider/<name>` not defined by hand through `factory(name)`."""
        self.providers[provider] = factory

    def lookup_model(self, name: str) -> Model:
        if name in self.models:
            return self.models[name]
        provider, _, model = name.partition("/")
        factory = self.providers.get(provider)
        if factory is None:
            known = ", ".join(sorted(self.providers)) or "none"
            if "/" not in name:  # `gpt-4o-mini` for `openai/gpt-4o-mini`
                raise StatusError(
                    Status.NOT_FOUND,
                    f"model {name!r} is not defined: define it with ai.define_model under "
                    "that name, or name a provider's model as provider/model (e.g. "
                    f"openai/gpt-4o-mini); registered providers: {known}",
                )
            raise StatusError(
                Status.NOT_FOUND,
                f"model {name!r} is not defined: define it with ai.define_model, or "
                f"register a provider for {provider!r} (registered providers: {known})",
            )
        self.models[name] = factory(model)
        return self.models[name]

    # -- agents -----------------------------------------------------------------------

    def define_agent(
        self,
        name: str,
        *,
        model: str,
        system: str | None = None,
        tools: Iterable[Tool[Any, Any] | str] = (),
        middleware: Iterable[Middleware] = (),
        store: SessionStore | None = None,
        max_turns: int = 10,
        config: Mapping[str, Any] | None = None,
        interrupt_expires_in: float | timedelta | None = None,
    ) -> Agent:
        """Define an agent: a model, a system prompt, tools and where sessions live.
        `interrupt_expires_in` gives every pause a deadline unless its tool set one."""
        if max_turns < 1:
            raise StatusError(Status.INVALID_ARGUMENT, "max_turns must be at least 1")
        resolved = tuple(t if isinstance(t, Tool) else self.lookup_tool(t) for t in tools)
        agent = Agent(
            name=name,
            registry=self,
            model=model,
            system=system,
            tools=resolved,
            middleware=tuple(middleware),
            store=store,
            max_turns=max_turns,
            config=config,
            interrupt_expires_in=seconds(interrupt_expires_in),
        )
        self.agents[name] = agent
        return agent

    def lookup_agent(self, name: str) -> Agent:
        try:
            return self.agents[name]
        except KeyError:
            known = ", ".join(sorted(self.agents)) or "none"
            raise StatusError(
                Status.NOT_FOUND, f"agent {name!r} is not defined (defined: {known})"
            ) from None

    # -- client-managed state ---------------------------------------------------------

    @property
    def state_codec(self) -> StateCodec:
        """Signs and reads this registry's states. Made on first use; without a secret
        it uses the process's random one and warns (`RandomSecretWarning`, and the
        same line in the log), once per registry."""
        if self._codec is None:
            secret = self._secret or os.environ.get("INTERLOCK_SECRET")
            if not secret:
                warnings.warn(RandomSecretWarning(_RANDOM_SECRET), stacklevel=2)
                log.warning(_RANDOM_SECRET)
                secret = _process_secret()
            self._codec = StateCodec(secret.encode() if isinstance(secret, str) else secret)
        return self._codec


def _decorator_args(
    form: str,
    first: Callable[..., Any] | str | None,
    second: str | None,
    name: str | None,
    description: str | None,
) -> tuple[Callable[..., Any] | None, str | None, str | None]:
    """(function, name, description) of a decorator call: `@ai.<form>`,
    `@ai.<form>(name=..., description=...)` or `@ai.<form>("name", "description")`."""
    if isinstance(first, str):
        if name is not None or description is not None:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"ai.{form}: give the name and description either by position or by "
                "keyword, not both",
            )
        return None, first, second
    if second is not None:
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"ai.{form}: a description by position follows a name, not a function",
        )
    if first is not None and not callable(first):
        raise StatusError(
            Status.INVALID_ARGUMENT,
            f"ai.{form} takes a function, or a name and a description; got {type(first).__name__}",
        )
    return first, name, description


_RANDOM_SECRET = (
    "no secret set (Interlock(secret=...) or INTERLOCK_SECRET): states are signed with "
    "a random per-process secret and will not survive a restart"
)
_random_secret: bytes | None = None
_random_secret_lock = threading.Lock()


def _process_secret() -> bytes:
    """The random secret of this process, for every registry given no secret: made the
    first time one is needed, kept until the process ends."""
    global _random_secret
    with _random_secret_lock:
        if _random_secret is None:
            _random_secret = secrets.token_bytes(32)
        return _random_secret
