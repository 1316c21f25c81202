"""What the fuzz of tests/platform/test_fuzz.py sends: every route of the URL
configuration, and hypothesis strategies for its path values, query strings, bodies and
callers.

Nothing here is written per endpoint: the routes come from the URL resolver, a view's
query parameter names from the source of the functions it calls, its body fields from
the pydantic models those functions validate with, and valid values from the fixture's
objects by name (run_id, comparison_id, ...). A new endpoint is fuzzed without an edit.
"""

from __future__ import annotations

import dataclasses
import inspect
import json
import re
import types
import typing
from collections import Counter
from dataclasses import dataclass, field
from functools import cache
from typing import Any
from urllib.parse import quote, urlencode

from django.test.client import BOUNDARY, MULTIPART_CONTENT, encode_multipart
from django.urls import URLPattern, URLResolver, get_resolver
from django.urls.converters import IntConverter, PathConverter
from django.urls.resolvers import RoutePattern
from hypothesis import strategies as st
from pydantic import BaseModel, TypeAdapter

# The packages under platform/ whose functions the walk below follows (Django's own are
# not: their parameters are listed in DJANGO_PARAMS instead).
APPS = ("api", "compare", "configs", "dashboard", "runs", "teams", "rollway", "ops")

# Query and form parameters Django's own views read (admin, auth).
DJANGO_PARAMS = (
    "next",
    "q",
    "o",
    "p",
    "e",
    "all",
    "_popup",
    "_to_field",
    "_changelist_filters",
    "term",
    "app_label",
    "model_name",
    "field_name",
    "username",
    "password",
    "email",
    "old_password",
    "new_password1",
    "new_password2",
    "action",
    "_selected_action",
    "post",
)

METHODS = ("GET", "POST", "HEAD", "PUT", "PATCH", "DELETE", "OPTIONS")


# --- routes --------------------------------------------------------------------------


@dataclass(frozen=True)
class Route:
    """One URL pattern with the resolvers above it, outermost first."""

    chain: tuple[URLResolver | URLPattern, ...]

    @property
    def pattern(self) -> URLPattern:
        return self.chain[-1]

    @property
    def template(self) -> str:
        """The route as written, e.g. "api/runs/<int:run_id>/metrics"."""
        return "".join(str(level.pattern) for level in self.chain)

    @property
    def name(self) -> str:
        namespaces = [level.namespace for level in self.chain[:-1] if getattr(level, "namespace", None)]
        return ":".join([*namespaces, self.pattern.name or ""])

    @property
    def view(self):
        return inspect.unwrap(self.pattern.callback)

    @property
    def kwargs(self) -> dict[str, Any]:
        """Path kwarg name → its converter (None for a regex group)."""
        out: dict[str, Any] = {}
        for level in self.chain:
            pattern = level.pattern
            if isinstance(pattern, RoutePattern):
                out.update(pattern.converters)
            else:
                out.update(dict.fromkeys(pattern.regex.groupindex))
        return out

    @property
    def is_admin(self) -> bool:
        return str(self.chain[0].pattern) == "admin/"

    def __str__(self) -> str:
        return "/" + self.template


def walk(patterns, prefix: tuple = ()) -> list[Route]:
    """Every URL pattern under `patterns`, resolvers included (recursively)."""
    out: list[Route] = []
    for entry in patterns:
        if isinstance(entry, URLResolver):
            out += walk(entry.url_patterns, (*prefix, entry))
        else:
            out.append(Route((*prefix, entry)))
    return out


def http_routes() -> list[Route]:
    """Each route once: django-ninja gives every method of a path its own pattern (one
    view, dispatching by method), and only the first of them is ever resolved."""
    unique: dict[str, Route] = {}
    for route in walk(get_resolver().url_patterns):
        unique.setdefault(route.template, route)
    return list(unique.values())


def ws_routes() -> list[Route]:
    from runs.routing import websocket_urlpatterns

    return walk(websocket_urlpatterns)


# --- what a view reads ------------------------------------------------------------------

_PARAM_CALLS = [
    re.compile(r"""\b(?:GET|POST)\.(?:get|getlist)\(\s*["']([^"']+)["']"""),
    re.compile(r"""_(?:param|choice)\(\s*request\s*,\s*["']([^"']+)["']"""),
]


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            names |= _code_names(const)
    return names


@dataclass
class ViewReads:
    params: set[str] = field(default_factory=set)
    models: list[Any] = field(default_factory=list)  # BaseModel classes and TypeAdapters


def _ours(obj: Any) -> bool:
    return (getattr(obj, "__module__", "") or "").split(".")[0] in APPS


@cache
def view_reads(view) -> ViewReads:
    """The query/form parameter names and the pydantic input models of `view` and of the
    platform functions it calls (found through the names its code uses, three calls
    deep: the API views validate in helpers such as api.ingest)."""
    reads = ViewReads()
    seen: set[int] = set()

    def visit(fn, depth: int) -> None:
        fn = inspect.unwrap(fn)
        if id(fn) in seen or not hasattr(fn, "__code__") or not _ours(fn):
            return
        seen.add(id(fn))
        try:
            source = inspect.getsource(fn)
        except (OSError, TypeError):
            source = ""
        for pattern in _PARAM_CALLS:
            reads.params.update(pattern.findall(source))
        names = _code_names(fn.__code__)
        scope = fn.__globals__
        for name in names:
            obj = scope.get(name)
            if isinstance(obj, tuple) and name.endswith("_PARAMS") and all(isinstance(x, str) for x in obj):
                reads.params.update(obj)
            elif isinstance(obj, TypeAdapter) or (isinstance(obj, type) and issubclass(obj, BaseModel) and _ours(obj)):
                if obj not in reads.models:
                    reads.models.append(obj)
            elif depth and inspect.isfunction(obj):
                visit(obj, depth - 1)
            elif depth and isinstance(obj, type) and _ours(obj):
                # A class of ours the code uses (the launch form): what its methods read.
                for member in vars(obj).values():
                    if inspect.isfunction(member):
                        visit(member, depth - 1)
            elif dataclasses.is_dataclass(obj) and not isinstance(obj, type) and _ours(obj):
                # A declaration of ours (an ingest endpoint): the input models it holds.
                for value in vars(obj).values():
                    if isinstance(value, TypeAdapter) and value not in reads.models:
                        reads.models.append(value)
            elif depth and isinstance(obj, types.ModuleType):
                # module.function(...): follow the attributes the code names
                for attr in names:
                    target = getattr(obj, attr, None)
                    if inspect.isfunction(target):
                        visit(target, depth - 1)

    operations = ninja_operations(view)
    for operation in operations:
        visit(operation.view_func, 3)
        for hint in typing.get_type_hints(operation.view_func).values():
            for model in (hint, *typing.get_args(hint)):
                if (
                    isinstance(model, type)
                    and issubclass(model, BaseModel)
                    and _ours(model)
                    and model not in reads.models
                ):
                    reads.models.append(model)
    if not operations:
        visit(view, 3)
    return reads


def ninja_operations(view) -> list:
    """The django-ninja operations behind a URL's view (one view per path, dispatching by
    method to each operation's function); [] for a plain Django view."""
    if not (inspect.isfunction(view) and view.__module__.startswith("ninja.")):
        return []
    path_view = inspect.getclosurevars(view).nonlocals.get("self")
    return list(getattr(path_view, "operations", []))


def model_schema(model) -> dict:
    if isinstance(model, TypeAdapter):
        return model.json_schema()
    return model.model_json_schema()


# --- hostile values --------------------------------------------------------------------


@dataclass(frozen=True)
class Raw:
    """Text put into a JSON body as it is: what json.dumps never writes (NaN, 1e999,
    a 5000-digit integer, 20,000 nested brackets)."""

    text: str

    def __repr__(self) -> str:  # hypothesis shows strategies and failing examples by repr
        shown = self.text if len(self.text) <= 40 else f"{self.text[:20]}...({len(self.text)} chars)"
        return f"Raw({shown!r})"


def nested(depth: int, kind: str) -> Raw:
    if kind == "[":
        return Raw("[" * depth + "]" * depth)
    return Raw('{"a":' * depth + "1" + "}" * depth)


RAW_TOKENS = [
    Raw("NaN"),
    Raw("Infinity"),
    Raw("-Infinity"),
    Raw("1e999"),
    Raw("-1e999"),
    Raw("1e309"),
    Raw("9" * 5000),  # past Python's 4300-digit int conversion limit
    Raw("1" + "0" * 400),
    Raw("-" + "9" * 30),
    nested(1000, "["),
    nested(1200, "{"),
    nested(20_000, "["),
]

HUGE_INTS = [2**31, 2**31 - 1, 2**53 + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1, 10**30, -(10**30), 10**80]

TEXT_SCALARS = [
    "",
    " ",
    "0",
    "-1",
    "-0",
    "+1",
    "1.5",
    "nan",
    "NaN",
    "inf",
    "-inf",
    "Infinity",
    "1e309",
    "-1e309",
    "1e-400",
    "0x10",
    "1_000",
    " 7 ",
    "²",  # str.isdigit() says yes, int() says no
    "١٢٣",  # Arabic-Indic digits: int() reads 123
    "true",
    "null",
    "[]",
    "{}",
    "\x00",
    "%",
    "'",
    '"',
    "<script>",
    "💥",
    *(str(n) for n in HUGE_INTS),
]


@cache
def long_text() -> st.SearchStrategy[str]:
    """Very long strings, built by repetition (hypothesis would take long to draw them)."""
    return st.builds(
        lambda unit, n: unit * n,
        st.sampled_from(["x", "é", "💥", "[", "\\", "a,", "9"]),  # 5000 nines: past int()'s digit limit
        st.sampled_from([5_000, 100_000]),
    )


@cache
def text_value() -> st.SearchStrategy[str]:
    """A query or form value: hostile scalars, numbers of every size, unicode, long."""
    return st.one_of(
        st.sampled_from(TEXT_SCALARS),
        st.integers().map(str),
        st.floats().map(repr),
        st.text(max_size=30),
        long_text(),
    )


@cache
def json_scalar() -> st.SearchStrategy[Any]:
    return st.one_of(
        st.none(),
        st.booleans(),
        st.integers(),
        st.sampled_from(HUGE_INTS),
        st.floats(),  # NaN and ±Infinity included: written as NaN/Infinity literals
        st.text(max_size=30),
        st.sampled_from(TEXT_SCALARS),
        long_text(),
        st.sampled_from(RAW_TOKENS),
    )


@cache
def hostile_json() -> st.SearchStrategy[Any]:
    """Any JSON value, wrong types, raw tokens and shallow structures."""
    return st.recursive(
        json_scalar(),
        lambda inner: st.one_of(
            st.lists(inner, max_size=4), st.dictionaries(st.one_of(st.text(max_size=8), st.just("")), inner, max_size=4)
        ),
        max_leaves=8,
    )


def dumps(value: Any) -> str:
    """JSON text of `value`, Raw values written as they are."""
    if isinstance(value, Raw):
        return value.text
    if isinstance(value, dict):
        return "{" + ",".join(json.dumps(str(k)) + ":" + dumps(v) for k, v in value.items()) + "}"
    if isinstance(value, list | tuple):
        return "[" + ",".join(dumps(v) for v in value) + "]"
    return json.dumps(value)  # floats: NaN/Infinity as Python writes them


# --- bodies from schemas ---------------------------------------------------------------


def from_schema(schema: dict, defs: dict, hints: dict[str, st.SearchStrategy], name: str = "") -> st.SearchStrategy:
    """Valid-ish values for a JSON schema (bounds, enums and patterns kept), any one of
    them replaced by a hostile value now and then. `hints` gives values by field name
    for fields the schema leaves open (`Any`: run ids, overrides, seeds...)."""
    hostile = hostile_json()
    if name in hints and (not schema or "type" not in schema or name == "overrides"):
        return st.one_of(hints[name], hostile)
    if "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    if "anyOf" in schema:
        return st.one_of([from_schema(s, defs, hints, name) for s in schema["anyOf"]])
    if "enum" in schema:
        return st.one_of(st.sampled_from(schema["enum"]), hostile)
    if "const" in schema:
        return st.one_of(st.just(schema["const"]), hostile)
    kind = schema.get("type")
    valid: st.SearchStrategy
    if kind == "integer":
        lo = schema.get("minimum", schema.get("exclusiveMinimum", None))
        hi = schema.get("maximum", None)
        if "exclusiveMaximum" in schema:
            hi = schema["exclusiveMaximum"] - 1
        # the bounds themselves and the huge values inside them (2**63 ≥ 0 but no column holds it)
        edges = [
            v for v in (lo, hi, *HUGE_INTS) if v is not None and (lo is None or v >= lo) and (hi is None or v <= hi)
        ]
        valid = st.one_of(st.integers(min_value=lo, max_value=hi), st.sampled_from(edges))
    elif kind == "number":
        valid = st.floats(
            min_value=schema.get("minimum", schema.get("exclusiveMinimum")),
            max_value=schema.get("maximum", schema.get("exclusiveMaximum")),
            allow_nan=False,
            allow_infinity=False,
        )
    elif kind == "string":
        valid = (
            st.from_regex(schema["pattern"], fullmatch=True)
            if "pattern" in schema
            else st.text(max_size=min(schema.get("maxLength", 40), 40))
        )
    elif kind == "boolean":
        valid = st.booleans()
    elif kind == "null":
        valid = st.none()
    elif kind == "array":
        valid = st.lists(
            from_schema(schema.get("items", {}), defs, hints), max_size=min(schema.get("maxItems", 4), 4)
        ).map(list)
    elif kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        required = set(schema.get("required", ()))
        valid = st.fixed_dictionaries(
            {k: from_schema(v, defs, hints, k) for k, v in properties.items() if k in required},
            optional={k: from_schema(v, defs, hints, k) for k, v in properties.items() if k not in required},
        )
    else:
        valid = hints.get(name, hostile)
    return st.one_of(valid, valid, hostile)  # mostly valid, so the checks behind the first one run


@cache
def run_config_schema() -> dict:
    from workers.config.run_config import json_schema

    return json_schema()


@cache
def overrides() -> st.SearchStrategy[dict]:
    """Run config overrides built from RunConfig's JSON schema: sections and fields it
    has, with values inside and outside their bounds."""
    schema = run_config_schema()
    return from_schema(schema, schema.get("$defs", {}), {})


def model_body(models: list, hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy[Any]:
    """A body for one of the view's input models (any model: a view may read several)."""
    bodies = []
    for model in models:
        schema = model_schema(model)
        bodies.append(from_schema(schema, schema.get("$defs", {}), hints))
    return st.one_of(bodies) if bodies else hostile_json()


def _with_bad_bytes(text: str, draw) -> bytes:
    raw = text.encode("utf-8", "surrogatepass")
    spot = draw(st.integers(0, len(raw)), label="bad byte at")
    junk = draw(st.sampled_from([b"\xff", b"\xc3\x28", b"\xed\xa0\x80", b"\x00", b"\xf0\x28\x8c"]))
    return raw[:spot] + junk + raw[spot:]


BODY_KINDS = ["json", "json", "json", "form", "multipart", "bad-multipart", "junk", "empty"]


def bodies(
    models: list, params: set[str], hints: dict[str, st.SearchStrategy], *, focused: bool = False
) -> st.SearchStrategy:
    """(bytes, content type): JSON from the view's models (raw tokens, deep nesting,
    invalid UTF-8 included), not-JSON, form-encoded and multipart forms, empty.
    `focused`: only well-formed JSON from the models and well-formed forms, so the
    checks behind the parser are what the examples reach."""
    if focused:
        return _body(model_body(models, hints), form_pairs(params, hints), ["json", "form"], ["utf-8"])
    values = st.one_of(model_body(models, hints), hostile_json())
    return _body(values, form_pairs(params, hints), BODY_KINDS, ["utf-8", "utf-8", "bad-bytes", "utf-16", "truncated"])


@st.composite
def _body(draw, json_values, pairs_of, kinds: list[str], encodings: list[str]) -> tuple[bytes, str]:
    kind = draw(st.sampled_from(kinds))
    if kind == "json":
        value = draw(json_values)
        text = dumps(value)
        encoding = draw(st.sampled_from(encodings))
        if encoding == "bad-bytes":
            raw = _with_bad_bytes(text, draw)
        elif encoding == "utf-16":
            raw = text.encode("utf-16", "surrogatepass")
        elif encoding == "truncated":
            raw = text.encode("utf-8", "surrogatepass")[: draw(st.integers(0, max(len(text) - 1, 0)))]
        else:
            raw = text.encode("utf-8", "surrogatepass")
        content_type = draw(
            st.sampled_from(
                ["application/json"]
                if len(encodings) == 1
                else ["application/json", "application/json; charset=latin-1", "text/plain"]
            )
        )
        return raw, content_type
    if kind in ("form", "multipart"):
        pairs = draw(pairs_of)
        if kind == "form":
            return urlencode(pairs).encode(), "application/x-www-form-urlencoded"
        fields: dict[str, list[str]] = {}
        for k, v in pairs:
            fields.setdefault(k, []).append(v)
        return encode_multipart(BOUNDARY, fields), MULTIPART_CONTENT
    if kind == "bad-multipart":
        raw = draw(st.sampled_from([b"", b"--x\r\n", b"--" + BOUNDARY.encode() + b"\r\nContent-Disposition: form"]))
        return raw, draw(st.sampled_from(["multipart/form-data", MULTIPART_CONTENT, "multipart/form-data; boundary="]))
    if kind == "junk":
        raw = draw(
            st.one_of(st.binary(max_size=200), st.text(max_size=200).map(lambda s: s.encode("utf-8", "replace")))
        )
        return raw, draw(st.sampled_from(["application/json", "application/x-www-form-urlencoded", "image/png", ""]))
    return b"", draw(st.sampled_from(["application/json", ""]))


# --- query strings ----------------------------------------------------------------------


def form_pairs(params: set[str], hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy[list[tuple[str, str]]]:
    """(name, value) pairs: the view's own parameter names (repeated keys too) with
    valid values or hostile ones, and now and then a name it does not read."""
    names = sorted(params) or ["q"]
    known = st.sampled_from(names).flatmap(
        lambda name: (
            st.tuples(st.just(name), st.one_of(hints[name].map(as_text), text_value()))
            if name in hints
            else st.tuples(st.just(name), text_value())
        )
    )
    pair = st.one_of(known, known, st.tuples(st.text(max_size=10), text_value()))
    return st.lists(pair, max_size=6)


def as_text(value: Any) -> str:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        return ",".join(as_text(v) for v in value)
    return dumps(value)


RAW_QUERY_TAILS = ["", "", "", "&%ff%fe=%c3", "&=", "&&", "&flag", "&%", "&%zz=1", "&a=%E2%82", "&" + "k=v&" * 500]


def queries(params: set[str], hints: dict[str, st.SearchStrategy]) -> st.SearchStrategy[str]:
    return st.builds(
        lambda pairs, tail: urlencode(pairs) + tail, form_pairs(params, hints), st.sampled_from(RAW_QUERY_TAILS)
    )


# --- path values ------------------------------------------------------------------------


def hostile_path_value(converter) -> st.SearchStrategy[str]:
    """What the converter's regex lets through that no object has: huge ints, zero,
    long and odd text."""
    if isinstance(converter, IntConverter):
        return st.one_of(
            st.sampled_from([str(n) for n in HUGE_INTS if n >= 0] + ["0", "00", "9" * 5000]),
            st.integers(min_value=0).map(str),
        )
    regex = converter.regex if converter is not None else "[^/]+"
    return st.one_of(
        st.from_regex(f"(?:{regex})", fullmatch=True).filter(bool),
        st.sampled_from([s for s in TEXT_SCALARS if s and re.fullmatch(regex, s) and "/" not in s]),
    )


_ROUTE_PART = re.compile(r"<(?:(?P<converter>[^>:]+):)?(?P<name>[^>]+)>")


def paths(route: Route, valid: dict[str, list[str]], hostile: bool) -> st.SearchStrategy[str]:
    """URL paths for `route`: each path value a valid one from `valid` (by kwarg name),
    or, when `hostile` (or none is known), what the converter's regex allows."""
    parts: list[st.SearchStrategy[str]] = []
    for level in route.chain:
        pattern = level.pattern
        if not isinstance(pattern, RoutePattern):
            parts.append(st.from_regex(pattern.regex, fullmatch=True).map(lambda text: quote(text, safe="/")))
            continue
        route_text, start = str(pattern), 0
        for match in _ROUTE_PART.finditer(route_text):
            parts.append(st.just(route_text[start : match.start()]))
            start = match.end()
            converter = pattern.converters.get(match["name"])
            choices = valid.get(match["name"])
            values = hostile_path_value(converter) if hostile or not choices else st.sampled_from(choices)
            # only a path converter's value may hold a slash
            safe = "/" if isinstance(converter, PathConverter) else ""
            parts.append(values.map(lambda value, safe=safe: quote(value, safe=safe)))
        parts.append(st.just(route_text[start:]))
    return st.tuples(*parts).map(lambda texts: "/" + "".join(texts))


# --- requests ---------------------------------------------------------------------------


@dataclass(frozen=True)
class FuzzRequest:
    persona: str  # "anonymous", "member", "outsider", "admin"
    method: str
    path: str
    query: str
    body: bytes
    content_type: str
    bearer: str | None  # "right" (the run's ingest token), "wrong", other raw text, or None

    def __repr__(self) -> str:
        shown = self.body if len(self.body) <= 300 else self.body[:300] + b"...(%d bytes)" % len(self.body)
        q = self.query if len(self.query) <= 300 else self.query[:300] + f"...({len(self.query)} chars)"
        return (
            f"{self.persona} {self.method} {self.path}?{q} bearer={self.bearer!r} "
            f"content-type={self.content_type!r} body={shown!r}"
        )


def personas_for(route: Route) -> list[str]:
    return ["anonymous", "member", "outsider"] + (["admin"] if route.is_admin else [])


BEARERS = [None, "right", "right", "wrong", "Bearer", "Basic dXNlcjpwdw==", "Bearer \x7f"]


def requests_for(
    route: Route, valid: dict[str, list[str]], hints: dict[str, st.SearchStrategy]
) -> st.SearchStrategy[FuzzRequest]:
    """Requests to `route` from every persona, by every method, with valid and hostile
    path values, the view's query parameters and bodies for its models. Half are
    focused: a member (an admin on admin pages) with the run's token sends GET or POST to
    a valid path with well-formed JSON or forms, so the view's checks (not only the
    login, the token and the parser) meet hostile values."""
    reads = view_reads(route.view)
    params = reads.params | (set(DJANGO_PARAMS) if not (_ours(route.view) or ninja_operations(route.view)) else set())
    valid_paths = paths(route, valid, hostile=False)
    focused = _request(
        personas=st.just("admin" if route.is_admin else "member"),
        methods=st.sampled_from(["GET", "POST"]),
        paths=valid_paths,
        queries=queries(params, hints),
        bodies=bodies(reads.models, params, hints, focused=True),
        bearers=st.just("right"),
    )
    wild = _request(
        personas=st.sampled_from(personas_for(route)),
        methods=st.sampled_from(["GET", "POST", *METHODS]),
        paths=st.one_of(valid_paths, paths(route, valid, hostile=True)),
        queries=queries(params, hints),
        bodies=bodies(reads.models, params, hints),
        bearers=st.sampled_from(BEARERS),
    )
    return st.one_of(focused, wild)


@st.composite
def _request(draw, personas, methods, paths, queries, bodies, bearers) -> FuzzRequest:
    method = draw(methods)
    raw, content_type = draw(bodies) if method not in ("GET", "HEAD") else (b"", "")
    return FuzzRequest(
        persona=draw(personas),
        method=method,
        path=draw(paths),
        query=draw(queries),
        body=raw,
        content_type=content_type,
        bearer=draw(bearers),
    )


# --- the fixed corpus: every route gets these, whatever hypothesis draws --------------

# Bodies every route is sent by POST.
FIXED_BODIES: list[tuple[bytes, str]] = [
    (b"", "application/json"),
    (b"{", "application/json"),
    (b"null", "application/json"),
    (b"[]", "application/json"),
    (b'"text"', "application/json"),
    (b'{"a": NaN, "b": Infinity, "c": -Infinity}', "application/json"),
    (b'{"a": 1e999}', "application/json"),
    (b'{"a": ' + b"9" * 5000 + b"}", "application/json"),
    (("[" * 1500 + "]" * 1500).encode(), "application/json"),
    (('{"a":' * 1500 + "1" + "}" * 1500).encode(), "application/json"),
    (("[" * 100_000 + "]" * 100_000).encode(), "application/json"),
    (b'{"name": "\xff\xfe"}', "application/json"),
    (b"\xef\xbb\xbf{}", "application/json"),
    (b"a=1&b=%ff&c", "application/x-www-form-urlencoded"),
    (b"not json at all", "application/json"),
    (b"--x\r\n", "multipart/form-data"),
    (b"", MULTIPART_CONTENT),
]

# Each query or form parameter of a view gets each of these, one at a time, the other
# parameters at their baseline values.
PARAM_VALUES = ["", "²", "1e309", str(2**63), "9" * 5000, "\x00", "x" * 10_000]

# Each field of a view's body model gets each of these, one at a time, in a body that is
# otherwise valid (its required fields at their smallest valid values).
FIELD_VALUES: list[Any] = [
    None,
    True,
    1.5,
    2**63,  # past a bigint column
    10**30,  # past a 64-bit int anywhere
    "",
    "²",  # str.isdigit() says yes, int() says no
    "\x00",  # no PostgreSQL text or JSON column stores one
    "x" * 100_000,
    [],
    {},
    ["²"],
    Raw("NaN"),
    Raw("9" * 5000),  # past int()'s 4300 digits
]


def _resolve(schema: dict, defs: dict) -> dict:
    while "$ref" in schema:
        schema = defs[schema["$ref"].rsplit("/", 1)[-1]]
    return schema


def smallest(schema: dict, defs: dict) -> Any:
    """The smallest valid instance of `schema` (required fields only)."""
    schema = _resolve(schema, defs)
    if "anyOf" in schema:
        options = [s for s in schema["anyOf"] if s.get("type") != "null"] or schema["anyOf"]
        return smallest(options[0], defs)
    if "enum" in schema:
        return schema["enum"][0]
    if "const" in schema:
        return schema["const"]
    kind = schema.get("type")
    if kind == "integer":
        return max(schema.get("minimum", 0), schema.get("exclusiveMinimum", -1) + 1)
    if kind == "number":
        return float(schema.get("minimum", 0))
    if kind == "string":
        return "loss" if "pattern" not in schema or re.fullmatch(schema["pattern"], "loss") else "0"
    if kind == "boolean":
        return False
    if kind == "array":
        return []
    if kind == "object" or "properties" in schema:
        properties = schema.get("properties", {})
        return {k: smallest(properties[k], defs) for k in schema.get("required", ())}
    return None


def field_bodies(models: list) -> list[bytes]:
    """JSON bodies for the view's models: each field (and each field of an array's
    objects, as in {"points": [{...}]}) set to each of FIELD_VALUES in turn."""
    out: list[bytes] = []
    for model in models:
        schema = model_schema(model)
        defs = schema.get("$defs", {})
        base = smallest(schema, defs)
        for name, prop in schema.get("properties", {}).items():
            out += [dumps({**base, name: value}).encode() for value in FIELD_VALUES]
            items = _resolve(_resolve(prop, defs).get("items", {}), defs)
            if "properties" in items:
                item = {k: smallest(v, defs) for k, v in items["properties"].items()}
                for inner in items["properties"]:
                    out += [dumps({**base, name: [{**item, inner: value}]}).encode() for value in FIELD_VALUES]
    return out


def param_variants(params: set[str], baseline: dict[str, str]) -> list[str]:
    """Query strings (or form bodies): each of `params` set to each of PARAM_VALUES in
    turn, the others in `baseline` (valid values by name) kept."""
    base = {k: v for k, v in baseline.items() if k in params}
    return [urlencode({**base, name: value}) for name in sorted(params) for value in PARAM_VALUES]


@dataclass
class Tally:
    """Requests sent and responses by status class (2xx, 3xx, 4xx, 5xx)."""

    by_class: Counter = field(default_factory=Counter)
    ws: Counter = field(default_factory=Counter)

    def add(self, status: int) -> None:
        self.by_class[f"{status // 100}xx"] += 1

    def summary(self) -> str:
        total = sum(self.by_class.values())
        classes = ", ".join(f"{k} {self.by_class[k]:,}" for k in ("2xx", "3xx", "4xx", "5xx"))
        line = f"fuzz: {total:,} requests: {classes}"
        if self.ws:
            line += "; websocket: " + ", ".join(f"{k} {v:,}" for k, v in sorted(self.ws.items()))
        return line
