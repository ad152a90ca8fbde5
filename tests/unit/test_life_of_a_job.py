"""The life-of-a-job page (docs/design/life-of-a-job.md) against the code it walks through.

The page names modules (`stream_jobs/...py` paths and dotted names), classes and
functions, and ends with route tables: one module per row and the names the job passes in
it, in call order. No name is listed here: all are read from the page, so the page can
change (and a module move rewrite its names) and this test checks what it says then:

- every module it names imports (a path is also a file), and every dotted name resolves;
- every class or function its text names (`Class`, `Class.member`, `function()`) is an
  attribute of a module the page names, or a builtin;
- every name of a route row is in that row's module;
- two neighbours of a route are in call order wherever another function of the route
  names both (one of the first's mentions comes before one of the second's in its body,
  read in evaluation order); the first calling the second counts as checked too; other
  neighbours are not checked (a return to a caller, say).

An attribute is present when the class has it, or one of its methods assigns it to `self`
(an instance attribute such as `Worker.outcomes`).
"""

from __future__ import annotations

import ast
import builtins
import importlib
import inspect
import itertools
import re
import textwrap
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
PAGE = REPO / "docs" / "design" / "life-of-a-job.md"

TICKED = re.compile(r"`([^`\n]+)`")
FENCED = re.compile(r"^```.*?^```", re.MULTILINE | re.DOTALL)
# What the text names as code of ours: `Class`, `Class.member`, `CONSTANT`, `function()`.
CLASS_NAME = re.compile(r"[A-Z]\w*(?:\.\w+)*(?:\(\))?")
FUNCTION_CALL = re.compile(r"[a-z_]\w*\(\)")


@dataclass(frozen=True)
class InstanceAttribute:
    """An attribute a class's methods assign to `self` (not on the class itself)."""

    owner: type
    name: str


@dataclass(frozen=True)
class Row:
    """A row of a route table: its step (the last one named above it, if blank), its
    module and the names it passes there."""

    step: str
    module: str
    names: list[str]


@dataclass(frozen=True)
class Step:
    """One name of a route row, and what it is in the row's module."""

    step: str
    module: str
    name: str
    target: object

    @property
    def last(self) -> str:
        return self.name.removesuffix("()").rsplit(".", 1)[-1]


# -- reading the page ---------------------------------------------------------------------


def page_text(path: Path = PAGE) -> str:
    return FENCED.sub("", path.read_text())


def ticked(text: str) -> list[str]:
    return TICKED.findall(text)


def module_tokens(text: str) -> list[str]:
    """The page's `stream_jobs/...` paths and `stream_jobs.*` dotted names, in order."""
    return [t for t in ticked(text) if t == "stream_jobs" or t.startswith(("stream_jobs/",
                                                                          "stream_jobs."))]


def route_tables(text: str) -> list[list[Row]]:
    """The rows of each table with a Step, a Module and a Passes column."""
    tables: list[list[str]] = []
    lines: list[str] = []
    for line in [*text.splitlines(), ""]:
        if line.lstrip().startswith("|"):
            lines.append(line)
        elif lines:
            tables.append(lines)
            lines = []
    routes = []
    for table in tables:
        header = _cells(table[0])
        if not {"Step", "Module", "Passes"} <= set(header):
            continue
        which, where, what = (header.index(c) for c in ("Step", "Module", "Passes"))
        rows: list[Row] = []
        for line in table[2:]:  # the header, then its |---| line
            cells = _cells(line)
            [module] = ticked(cells[where])
            step = cells[which] or (rows[-1].step if rows else "")
            rows.append(Row(step, module, ticked(cells[what])))
        routes.append(rows)
    return routes


def _cells(line: str) -> list[str]:
    return [cell.strip() for cell in line.strip().strip("|").split("|")]


# -- resolving names ------------------------------------------------------------------------


def import_token(token: str) -> ModuleType:
    """The module a `stream_jobs/...py` path (or package folder) names."""
    path = REPO / token.rstrip("/")
    assert path.exists(), f"{token}: no such file or folder"
    dotted = token.rstrip("/").removesuffix(".py").replace("/", ".").removesuffix(".__init__")
    return importlib.import_module(dotted)


def resolve(token: str) -> object:
    """What a path, or a dotted name (a module, then attributes), names."""
    if "/" in token:
        return import_token(token)
    parts = token.removesuffix("()").split(".")
    for end in range(len(parts), 0, -1):
        name = ".".join(parts[:end])
        try:
            found: object = importlib.import_module(name)
        except ModuleNotFoundError as exc:
            if exc.name is not None and f"{name}.".startswith(f"{exc.name}."):
                continue
            raise
        return walk(found, parts[end:])
    raise LookupError(f"{token}: no module")


def walk(owner: object, names: list[str]) -> object:
    for name in names:
        owner = member(owner, name)
    return owner


def member(owner: object, name: str) -> object:
    """`owner.name`: an attribute, or an instance attribute its class's methods assign."""
    if hasattr(owner, name):
        return getattr(owner, name)
    if inspect.isclass(owner) and name in instance_attributes(owner):
        return InstanceAttribute(owner, name)
    raise LookupError(f"{getattr(owner, '__qualname__', owner)!r} has no {name!r}")


def instance_attributes(cls: type) -> set[str]:
    """The names a class (and its bases of ours) assigns to `self` in its methods."""
    found: set[str] = set()
    for klass in cls.__mro__:
        if not klass.__module__.startswith("stream_jobs"):
            continue
        tree = ast.parse(textwrap.dedent(inspect.getsource(klass)))
        for node in ast.walk(tree):
            targets: list[ast.expr] = []
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AnnAssign | ast.AugAssign):
                targets = [node.target]
            for target in targets:
                for leaf in ast.walk(target):
                    if (isinstance(leaf, ast.Attribute) and isinstance(leaf.value, ast.Name)
                            and leaf.value.id == "self"):
                        found.add(leaf.attr)
    return found


def page_modules(text: str) -> list[ModuleType]:
    modules = [resolve(token) for token in module_tokens(text)]
    return [m for m in modules if isinstance(m, ModuleType)]


def resolve_in(token: str, modules: list[ModuleType]) -> object:
    """`Class.member` or `function()` as an attribute of one of `modules`, or a builtin."""
    head, *rest = token.removesuffix("()").split(".")
    for module in [*modules, builtins]:
        if hasattr(module, head):
            try:
                return walk(getattr(module, head), rest)
            except LookupError:
                continue
    raise LookupError(f"`{token}` is in none of the page's modules")


def route_steps(text: str) -> list[list[Step]]:
    return [[Step(row.step, row.module, name,
                  walk(import_token(row.module), name.removesuffix("()").split(".")))
             for row in rows for name in row.names]
            for rows in route_tables(text)]


# -- call order -----------------------------------------------------------------------------


class _EvaluationOrder(ast.NodeVisitor):
    """The names a function body mentions, in about the order Python evaluates them: an
    assignment's value before its target, a call's arguments before the call, a
    comprehension's loop before its result, a lambda passed to a call after the call."""

    def __init__(self) -> None:
        self.names: list[str] = []

    def visit_Name(self, node: ast.Name) -> None:
        self.names.append(node.id)

    def visit_Attribute(self, node: ast.Attribute) -> None:
        self.visit(node.value)
        self.names.append(node.attr)

    def visit_Call(self, node: ast.Call) -> None:
        func, callee = node.func, None
        if isinstance(func, ast.Attribute | ast.Name):
            callee = func.attr if isinstance(func, ast.Attribute) else func.id
            if isinstance(func, ast.Attribute):
                self.visit(func.value)
        else:
            self.visit(func)
        arguments = [*node.args, *(keyword.value for keyword in node.keywords)]
        for argument in arguments:
            if not isinstance(argument, ast.Lambda):
                self.visit(argument)
        if callee is not None:
            self.names.append(callee)
        for argument in arguments:
            if isinstance(argument, ast.Lambda):  # called by the callee, if at all
                self.visit(argument.body)

    def generic_visit(self, node: ast.AST) -> None:
        if isinstance(node, ast.ListComp | ast.SetComp | ast.GeneratorExp | ast.DictComp):
            for generator in node.generators:
                for part in (generator.iter, generator.target, *generator.ifs):
                    self.visit(part)
            results = [node.key, node.value] if isinstance(node, ast.DictComp) else [node.elt]
            for result in results:
                self.visit(result)
        elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
            if node.value is not None:
                self.visit(node.value)
            for target in node.targets if isinstance(node, ast.Assign) else [node.target]:
                self.visit(target)
        elif not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):  # those run later
            super().generic_visit(node)


def function_of(target: object) -> Any:
    """The function behind a route name (a property's getter), or None for what has no
    body of its own (a class, a constant, an instance attribute)."""
    if isinstance(target, property):
        target = target.fget
    if inspect.isfunction(target) or inspect.ismethod(target):
        return inspect.unwrap(target)
    return None


def mentions(function: Any) -> list[str]:
    """The names `function`'s body mentions, in evaluation order (docstring left out)."""
    return mentions_in(textwrap.dedent(inspect.getsource(function)))


def mentions_in(source: str) -> list[str]:
    """`mentions` of the one function `source` defines."""
    [definition] = ast.parse(source).body
    assert isinstance(definition, ast.FunctionDef | ast.AsyncFunctionDef)
    body = definition.body
    if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant):
        body = body[1:]
    order = _EvaluationOrder()
    for statement in body:
        order.visit(statement)
    return order.names


def order_problems(route: list[Step]) -> tuple[int, list[str]]:
    """How many neighbours of `route` could be checked, and those out of order."""
    callers = {id(f): (f, mentions(f)) for step in route
               if (f := function_of(step.target)) is not None}
    checked, problems = 0, []
    for first, second in itertools.pairwise(route):
        if first.last == second.last:
            continue  # one name for both (`JobContext.once`, `DedupStore.once`): no telling
        found = _pair_problems(first, second, callers.values())
        if found is not None:
            checked += 1
            problems.extend(found)
    return checked, problems


def _pair_problems(first: Step, second: Step, callers: Iterable[tuple[Any, list[str]]]
                   ) -> list[str] | None:
    """Why `second` cannot follow `first`; None when no function of the route tells."""
    first_function, second_function = function_of(first.target), function_of(second.target)
    pair = f"{first.name} ({first.module}) then {second.name} ({second.module})"
    told, problems = False, []
    for function, names in callers:
        if function is first_function:
            told |= second.last in names  # the first calls the second
        elif function is second_function:
            # Within a step the second calling the first puts them the wrong way round;
            # across steps it may be another path (a retry's way back to the worker).
            if first.step == second.step and first.last in names:
                told = True
                problems.append(f"{pair}: {second.name} calls {first.name}")
        elif first.last in names and second.last in names:
            told = True
            if names.index(first.last) > len(names) - 1 - names[::-1].index(second.last):
                problems.append(f"{pair}: {function.__qualname__} mentions "
                                f"{second.last} only before {first.last}")
    return problems if told else None


# -- the checks -----------------------------------------------------------------------------


def test_every_module_the_page_names_imports() -> None:
    tokens = module_tokens(page_text())
    assert tokens, "the page names no stream_jobs module"
    failures = []
    for token in tokens:
        try:
            resolve(token)
        except (LookupError, ImportError, AssertionError) as exc:
            failures.append(f"`{token}`: {exc}")
    assert not failures, "\n".join(failures)


def test_every_class_and_function_the_page_names_exists() -> None:
    text = page_text()
    modules = page_modules(text)
    named = [t for t in ticked(text) if CLASS_NAME.fullmatch(t) or FUNCTION_CALL.fullmatch(t)]
    assert named, "the page names no class or function"
    failures = []
    for token in named:
        try:
            resolve_in(token, modules)
        except LookupError as exc:
            failures.append(str(exc))
    assert not failures, "\n".join(sorted(set(failures)))


def test_every_route_step_is_in_its_rows_module() -> None:
    routes = route_tables(page_text())
    assert len(routes) >= 2, "the page's route tables (Module, Passes) are missing"
    failures = []
    for rows in routes:
        for row in rows:
            assert row.names, f"a route row of {row.module} names nothing it passes"
            for name in row.names:
                try:
                    walk(import_token(row.module), name.removesuffix("()").split("."))
                except (LookupError, ImportError, AssertionError) as exc:
                    failures.append(f"{row.module}: `{name}`: {exc}")
    assert not failures, "\n".join(failures)


def test_each_route_is_in_call_order() -> None:
    for route in route_steps(page_text()):
        checked, problems = order_problems(route)
        assert not problems, "\n".join(problems)
        # A route none of whose neighbours could be checked would pass on any order.
        assert checked >= len(route) // 2, (
            f"only {checked} of the {len(route) - 1} neighbours of the route from "
            f"{route[0].name} could be checked")


# -- the checker itself ---------------------------------------------------------------------


def test_the_order_check_finds_neighbours_swapped() -> None:
    route = route_steps(page_text())[0]
    checked, problems = order_problems(route)
    assert checked
    assert not problems
    swapped = []
    for i in range(len(route) - 1):
        turned = [*route[:i], route[i + 1], route[i], *route[i + 2:]]
        if order_problems(turned)[1]:
            swapped.append(i)
    assert len(swapped) >= checked // 2, "swapping neighbours went unnoticed"


SAMPLE = """
async def sample(self):
    "A docstring naming write and send."
    results = {w.tp: w.tracker.position for w in self.works if w.tracker.needs_commit}
    await until_acked(lambda: self.producer.send(topic, job), self.stopping)
    await self.write(lane_topic(prefix), results)
    dead_letter(FailureInfo.from_exception(exc))
"""


def test_evaluation_order_puts_arguments_before_calls_and_lambdas_after() -> None:
    names = mentions_in(SAMPLE)
    assert names.index("needs_commit") < names.index("position")
    assert names.index("until_acked") < names.index("send")
    assert names.index("lane_topic") < names.index("write")
    assert names.index("from_exception") < names.index("dead_letter")
    assert names[:2] == ["self", "works"]  # the loop first; the docstring left out


@pytest.mark.parametrize(("token", "found"), [
    ("stream_jobs/offsets.py", True), ("stream_jobs.offsets.OffsetTracker.finished", True),
    ("stream_jobs/runtime/", True), ("stream_jobs/no_such_module.py", False),
    ("stream_jobs.offsets.OffsetTracker.no_such_method", False),
])
def test_names_resolve_or_fail(token: str, found: bool) -> None:
    try:
        resolve(token)
    except (LookupError, ImportError, AssertionError):
        assert not found
    else:
        assert found


def test_instance_attributes_count_as_present() -> None:
    from stream_jobs.runtime.worker import Worker

    assert isinstance(member(Worker, "outcomes"), InstanceAttribute)
    with pytest.raises(LookupError):
        member(Worker, "no_such_counter")
