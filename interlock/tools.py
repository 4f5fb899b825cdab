"""Tools: ordinary ones, and interruptible ones that may pause the turn."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextvars
import inspect
import types
import typing
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, overload

from pydantic import TypeAdapter, ValidationError

from schemas import Part, Status, ToolDefinition

from ._json import copy_json, to_json_value
from .context import ToolContext
from .errors import StatusError
from .interrupts import interrupt_as, json_of, respond, restart

__all__ = ["InterruptibleTool", "Tool", "brief", "run_sync"]

In = TypeVar("In")
Out = TypeVar("Out")
Res = TypeVar("Res")
T = TypeVar("T")


def run_sync(value: Any) -> Any:
    """Await `value` when it is awaitable, from sync code, with or without a running loop."""
    if not inspect.isawaitable(value):
        return value

    async def _await() -> Any:
        return await value

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(_await())
    with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:  # in this context
        return pool.submit(contextvars.copy_context().run, asyncio.run, _await()).result()


def brief(exc: ValidationError, at: str = "") -> str:
    """A one-line account of a pydantic validation error; `at` names where the value
    validated sits in a larger one (its locations are given under it)."""
    start = (at,) if at else ()
    return "; ".join(
        f"{'.'.join(str(x) for x in (*start, *e['loc'])) or 'value'}: {e['msg']}"
        for e in exc.errors()
    )


def _strip_optional(tp: Any) -> Any:
    if typing.get_origin(tp) in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if len(args) == 1:
            return args[0]
        return typing.Union[tuple(args)]  # noqa: UP007
    return tp


def _hints(name: str, fn: Callable[..., Any]) -> dict[str, Any]:
    """The resolved annotations of `fn`. Under `from __future__ import annotations` they
    are strings; types defined inside a function (a test's, a factory's) are found in
    `fn`'s closure and in the locals of the code that defined the tool (the first frame
    outside this package)."""
    try:
        return typing.get_type_hints(fn)
    except NameError as first:
        local: dict[str, Any] = {}
        frame = inspect.currentframe()
        while frame is not None and frame.f_globals.get("__name__", "").startswith("interlock."):
            frame = frame.f_back
        if frame is not None:
            local.update(frame.f_locals)
        del frame
        local.update(inspect.getclosurevars(fn).nonlocals)
        try:
            return typing.get_type_hints(fn, localns=local)
        except NameError as exc:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"tool {name!r}: cannot resolve the annotation {exc.name!r} of its function "
                "(define the type at module level, or before the tool)",
            ) from first


class Tool(Generic[In, Out]):
    """A tool the model can call. `fn(input)` (optionally with a `ToolContext` parameter),
    sync or async. In and Out come from the annotations and are validated with pydantic."""

    interruptible = False

    def __init__(self, name: str, description: str, fn: Callable[..., Any]) -> None:
        self.name = name
        self.description = description
        self.fn = fn
        hints = _hints(name, fn)
        params = list(inspect.signature(fn).parameters.values())
        self._ctx_param = next((p.name for p in params if hints.get(p.name) is ToolContext), None)
        positional = [p for p in params if p.name != self._ctx_param]
        self._check_signature(fn)
        self.input_type: Any = hints.get(positional[0].name, Any) if positional else Any
        self.resume_type: Any = (
            _strip_optional(hints.get(positional[1].name, Any)) if len(positional) > 1 else Any
        )
        self.output_type: Any = hints.get("return", Any)
        self._in = TypeAdapter(self.input_type)
        self._out = TypeAdapter(self.output_type)
        self._res = TypeAdapter(self.resume_type)
        self._schemas: tuple[dict[str, Any], dict[str, Any]] | None = None

    def __repr__(self) -> str:
        return f"<{type(self).__name__} {self.name}>"

    def _check_signature(self, fn: Callable[..., Any]) -> None:
        """A function that cannot take the arguments `invoke` passes is refused now
        (INVALID_ARGUMENT), not when the model first calls it (a failed turn)."""
        shape = "(input, resume)" if self.interruptible else "(input)"
        args = (None, None) if self.interruptible else (None,)
        kwargs = {self._ctx_param: None} if self._ctx_param else {}
        try:
            inspect.signature(fn).bind(*args, **kwargs)
        except TypeError as exc:
            kind = "an interruptible tool" if self.interruptible else "a tool"
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"tool {self.name!r}: the function of {kind} takes {shape}, plus an optional "
                f"ToolContext parameter ({exc})",
            ) from None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return run_sync(self.fn(*args, **kwargs))

    def definition(self) -> ToolDefinition:
        """The tool as a model sees it. The JSON Schemas are generated once per tool (they
        depend only on its annotations); each call returns fresh copies of them, so a model
        plugin may edit what it gets."""
        if self._schemas is None:
            self._schemas = (
                self._in.json_schema(by_alias=True),
                self._out.json_schema(by_alias=True),
            )
        input_schema, output_schema = self._schemas
        return ToolDefinition(
            name=self.name,
            description=self.description,
            input_schema=copy_json(input_schema),
            output_schema=copy_json(output_schema),
        )

    # -- validation -------------------------------------------------------------------

    def parse_input(self, value: Any) -> Any:
        try:
            return self._in.validate_python(value)
        except ValidationError as exc:
            message = f"invalid input for tool {self.name!r}: {brief(exc)}"
            if isinstance(value, str):  # a model's arguments that were not JSON, kept raw
                shown = value if len(value) <= 200 else value[:200] + "..."
                message += f" (the model sent arguments that are not JSON: {shown!r})"
            raise StatusError(Status.INVALID_ARGUMENT, message) from exc

    def check_output(self, value: Any) -> Any:
        """`value` validated against Out, as JSON (INVALID_ARGUMENT when it does not fit)."""
        try:
            given = json_of(value, f"output of tool {self.name!r}")
            return to_json_value(self._out.validate_python(given))
        except ValidationError as exc:
            raise StatusError(
                Status.INVALID_ARGUMENT, f"invalid output for tool {self.name!r}: {brief(exc)}"
            ) from exc

    def parse_resumed(self, value: Any) -> Any:
        if value is None:
            return None
        try:
            return self._res.validate_python(value)
        except ValidationError as exc:
            raise StatusError(
                Status.INVALID_ARGUMENT, f"invalid resume data for tool {self.name!r}: {brief(exc)}"
            ) from exc

    # -- running ----------------------------------------------------------------------

    def invoke(self, ctx: ToolContext) -> Any:
        """Run the tool for one call; returns its output, validated against Out, as JSON
        (INVALID_ARGUMENT when it does not fit). May raise ToolInterrupt."""
        args: list[Any] = [self.parse_input(ctx.input)]
        if self.interruptible:
            args.append(self.parse_resumed(ctx.resumed))
        kwargs = {self._ctx_param: ctx} if self._ctx_param else {}
        return self.check_output(run_sync(self.fn(*args, **kwargs)))

    # -- building answers to interrupts ----------------------------------------------

    def _own(self, part: Part) -> None:
        if part.tool_request is None:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"tool {self.name!r} answers an interrupt by its tool-request part (one of "
                "output.interrupts), not by this part",
            )
        if part.tool_request.name != self.name:
            raise StatusError(
                Status.INVALID_ARGUMENT,
                f"part belongs to {part.tool_request.name!r}, not to tool {self.name!r}",
            )

    @overload
    def interrupt_as(self, part: Part, type_: None = None) -> dict[str, Any] | None: ...
    @overload
    def interrupt_as(self, part: Part, type_: type[T]) -> T | None: ...
    @overload
    def interrupt_as(self, part: Part, type_: Any) -> Any: ...
    def interrupt_as(self, part: Part, type_: Any = None) -> Any:
        """The payload of `part` when it is an interrupt of this tool (typed as `type_`)."""
        if part.tool_request is None or part.tool_request.name != self.name:
            return None
        return interrupt_as(part, type_ if type_ is not None else dict[str, Any])

    def respond(
        self, part: Part, output: Out | Mapping[str, object], metadata: dict[str, Any] | None = None
    ) -> Part:
        """Answer the interrupt with the tool's output, without running the tool
        (`metadata` becomes the value of the part's `metadata.interruptResponse`)."""
        self._own(part)
        return respond(part, self.check_output(_plain(output)), metadata)

    def resume(self, part: Part, resume_data: Any = None) -> Part:
        """Re-run the tool with `resume_data` delivered as its `res` argument."""
        self._own(part)
        resume_data = _plain(resume_data)
        if resume_data is not None:
            self.parse_resumed(json_of(resume_data, "resume data"))
        return restart(part, resume_data)

    restart = resume


def _plain(value: Any) -> Any:
    """A mapping that is no dict (a `MappingProxyType`, a `UserDict`) as a dict: the
    JSON form the types take."""
    if isinstance(value, Mapping) and not isinstance(value, dict):
        return dict(value)
    return value


class InterruptibleTool(Tool[In, Out], Generic[In, Out, Res]):
    """A tool `fn(input, res)` that may call `interrupt()`; `res` is None on the first
    call and the resume data on a restart."""

    interruptible = True

    if TYPE_CHECKING:  # the same methods, typed by the resume data the function takes

        def resume(
            self, part: Part, resume_data: Res | Mapping[str, object] | None = None
        ) -> Part: ...

        restart = resume
