"""Hot-path statements run straight on the DBAPI cursor.

SQLAlchemy Core spends tens of microseconds of Python on every statement it executes
(cache lookup, parameter construction, an execution context, a result object): more
than SQLite needs to run most of the store's statements, and, inside a write
transaction, time that every other writer waits for. `FastStatement` compiles a Core
statement once per dialect and set of parameter names, and then only binds: it
applies the types' bind and result processors, calls the cursor, and hands back the
rows as tuples.

What it keeps of SQLAlchemy: the transaction (statements run on a `Connection` inside
its transaction, begun as SQLAlchemy would if none is), the `before_cursor_execute` and
`after_cursor_execute` events (query logging, instrumentation and the tests' statement
counters see these statements), `echo`, and error handling: a driver error is raised as
SQLAlchemy raises it, a lost connection invalidates the pool the same way.

What it refuses, when the statement is first compiled for a dialect: parameters
expanded or rendered at execution (`expanding=True`, `literal_execute`), Python-side
column defaults (SQLAlchemy computes them per execution), and parameter names the
dialect must escape. On a connection with a `schema_translate_map`, which changes the
SQL at each compilation, statements go through SQLAlchemy's own execution.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, cast

from sqlalchemy.engine import Connection, Dialect
from sqlalchemy.sql import ClauseElement
from sqlalchemy.sql.base import Executable

__all__ = ["FastResult", "FastStatement"]

_Processor = Callable[[Any], Any]


class _Plan:
    __slots__ = ("defaults", "keys", "names", "processors", "results", "sql")

    def __init__(self, stmt: ClauseElement, dialect: Dialect, keys: tuple[str, ...]) -> None:
        compiled: Any = stmt.compile(dialect=dialect, column_keys=list(keys) or None)
        if compiled.post_compile_params or compiled.literal_execute_params:
            raise ValueError("FastStatement: parameters expanded at execution are not supported")
        if getattr(compiled, "insert_prefetch", None) or getattr(compiled, "update_prefetch", None):
            raise ValueError("FastStatement: Python-side column defaults are not supported")
        if getattr(compiled, "escaped_bind_names", None):
            raise ValueError("FastStatement: parameter names that need escaping are not supported")
        self.sql: str = compiled.string
        names: dict[Any, str] = compiled.bind_names
        self.defaults = {
            name: bind.effective_value for bind, name in names.items() if not bind.required
        }
        processors: dict[str, _Processor] = {}  # a name bound twice is processed once
        for bind, name in names.items():
            process = bind.type.dialect_impl(dialect).bind_processor(dialect)
            if process is not None:
                processors[name] = process
        self.processors = list(processors.items())
        self.names: tuple[str, ...] | None = (
            tuple(compiled.positiontup) if compiled.positional else None
        )
        # (key, name, objects, type) per selected or returned column
        columns: list[Any] = compiled._result_columns
        self.keys: tuple[str, ...] = tuple(str(c[0]) for c in columns)
        procs = [c[3].dialect_impl(dialect).result_processor(dialect, None) for c in columns]
        self.results: list[_Processor | None] | None = (
            procs if any(p is not None for p in procs) else None
        )

    def bind(self, params: Mapping[str, Any]) -> Any:
        values = dict(self.defaults)
        values.update(params)
        for name, process in self.processors:
            values[name] = process(values[name])
        if self.names is None:
            return values
        return tuple(values[n] for n in self.names)


class FastResult:
    """What a `FastStatement` returned: its rows (tuples, result processors applied)
    and the driver's row count."""

    __slots__ = ("_rows", "keys", "rowcount")

    def __init__(self, rows: list[tuple[Any, ...]], rowcount: int, keys: tuple[str, ...]) -> None:
        self._rows = rows
        self.rowcount = rowcount
        self.keys = keys

    def all(self) -> list[tuple[Any, ...]]:
        return self._rows

    def first(self) -> tuple[Any, ...] | None:
        return self._rows[0] if self._rows else None

    def scalar(self) -> Any:
        """The first column of the first row; None when there is no row."""
        return self._rows[0][0] if self._rows else None

    def mappings(self) -> list[dict[str, Any]]:
        """The rows as dicts keyed by column name."""
        keys = self.keys
        return [dict(zip(keys, row, strict=True)) for row in self._rows]


class FastStatement:
    """A Core statement, compiled once per dialect and parameter names, executed on
    the DBAPI cursor of a `Connection` (see the module's docstring)."""

    __slots__ = ("_plans", "statement")

    _of: ClassVar[dict[int, FastStatement]] = {}

    def __init__(self, statement: ClauseElement) -> None:
        self.statement = statement
        self._plans: dict[tuple[str, tuple[str, ...]], _Plan] = {}

    @classmethod
    def of(cls, statement: ClauseElement) -> FastStatement:
        """The one `FastStatement` of `statement` (built once, kept with it): for
        statements that are themselves built once, such as cached ones."""
        fast = cls._of.get(id(statement))
        if fast is None or fast.statement is not statement:
            fast = cls._of[id(statement)] = cls(statement)
        return fast

    def _plan(self, conn: Connection, keys: tuple[str, ...]) -> _Plan:
        dialect = conn.dialect
        key = (dialect.name, keys)
        plan = self._plans.get(key)
        if plan is None:
            plan = self._plans[key] = _Plan(self.statement, dialect, keys)
        return plan

    def execute(self, conn: Connection, params: Mapping[str, Any] | None = None) -> FastResult:
        params = params or {}
        if _translated(conn):
            return self._through_sqlalchemy(conn, dict(params))
        plan = self._plan(conn, tuple(params))
        return _run(conn, plan, plan.bind(params), many=False)

    def executemany(self, conn: Connection, rows: Sequence[Mapping[str, Any]]) -> FastResult:
        """One statement for many parameter sets (all with the same names)."""
        if not rows:
            return FastResult([], 0, ())
        if _translated(conn):
            return self._through_sqlalchemy(conn, [dict(r) for r in rows])
        plan = self._plan(conn, tuple(rows[0]))
        return _run(conn, plan, [plan.bind(r) for r in rows], many=True)

    def _through_sqlalchemy(self, conn: Connection, params: Any) -> FastResult:
        """SQLAlchemy's own execution, for a connection whose execution options change
        how the statement compiles (`schema_translate_map`)."""
        result = conn.execute(cast(Executable, self.statement), params)
        if not result.returns_rows:
            return FastResult([], result.rowcount, ())
        keys = tuple(result.keys())
        rows = [tuple(row) for row in result.all()]
        return FastResult(rows, result.rowcount, keys)


def _translated(conn: Connection) -> bool:
    """Whether `conn` renames schemas at compile time (a plan compiled once would not)."""
    return bool(conn.get_execution_options().get("schema_translate_map"))


def _run(conn: Connection, plan: _Plan, params: Any, *, many: bool) -> FastResult:
    if not conn.in_transaction():
        conn.begin()  # as SQLAlchemy's autobegin would
    sql = plan.sql
    cursor: Any = None
    try:
        cursor = conn.connection.dbapi_connection.cursor()  # type: ignore[union-attr]
        for fn in conn.dispatch.before_cursor_execute:
            sql, params = fn(conn, cursor, sql, params, None, many)
        if conn._echo:  # as SQLAlchemy logs its own: the statement, then its parameters
            conn._log_info(sql)
            conn._log_parameters(params, "compiled once", ismulti=many)
        if many:
            cursor.executemany(sql, params)
        else:
            cursor.execute(sql, params)
        for fn in conn.dispatch.after_cursor_execute:
            fn(conn, cursor, sql, params, None, many)
        rows: list[Any] = cursor.fetchall() if cursor.description is not None else []
        rowcount = cursor.rowcount
    except BaseException as exc:
        conn._handle_dbapi_exception(exc, sql, params, cursor, None)
    cursor.close()
    processors = plan.results
    if processors is not None and rows:
        rows = [
            tuple(v if p is None else p(v) for p, v in zip(processors, row, strict=True))
            for row in rows
        ]
    return FastResult(rows, rowcount, plan.keys)
