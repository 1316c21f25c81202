"""Why a run failed, in a sentence or two that says what happened and what to do.

A failed run's page shows `Failure.message` ("The model directory /x has no config.json:
point model.path at a Hugging Face model directory.") with the traceback it was worked
out from (`Failure.detail`) folded under it. `explain(exc, cfg)` finds the message by
reading everything behind the exception:

- the exceptions chained to it (`__cause__`, `__context__`, and the `cause` that Ray
  wraps a remote error in), as objects;
- the text of errors that crossed a process boundary as text: an actor's loop reports
  its traceback as a string (`ChildFailed.detail`), and Ray writes the remote traceback
  of an actor's failed constructor into the message of its ActorDiedError. Their
  exception lines ("torch.OutOfMemoryError: CUDA out of memory ...") are parsed.

The first rule that matches names the failure (`KINDS`, most specific first); the
fallback is the exception's own last line. Which actor failed comes from the driver
(`ChildFailed.who`) or from Ray's own words: a named actor's error names it
("name: run-7-buffer", "ray::run-7-inference-0:InferenceWorker.__init__").

No Django, and neither Ray nor torch is imported here: the site imports this module too
(its launch and queue explain Ray errors), and an exception of theirs can only exist
once their module is loaded, so their classes are looked up in `sys.modules`.
"""

from __future__ import annotations

import logging
import os
import re
import sys
import traceback
from dataclasses import dataclass
from typing import TYPE_CHECKING

from workers.run.paths import PathNotAllowed

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig

log = logging.getLogger(__name__)

# What a failed run says, by kind: the message is one of these situations.
KINDS = (
    "path_not_allowed",  # a config path outside the operator's roots
    "bad_model",  # model.path is not a loadable model directory
    "out_of_memory",  # MemoryError, torch's OutOfMemoryError, Ray's memory monitor
    "sync_timeout",  # the weight sync's rendezvous or broadcast outlived sync.timeout_s
    "node_lost",  # a Ray node holding run actors left the cluster
    "vllm_start",  # the vLLM engine raised in an inference worker's constructor
    "actor_start",  # another run actor's constructor raised
    "actor_died",  # Ray reports a run actor dead (killed, crashed, its node gone)
    "ray_unreachable",  # no Ray cluster answers at the address
    "ray_timeout",  # a Ray call outlived its timeout
    "actor_error",  # a run actor's loop raised
    "error",  # anything else: the exception's last line
)
# The message stays short (it is shown as is); the detail is bounded so that one status
# post stays small: the ingest refuses more.
MESSAGE_MAX = 1000
DETAIL_MAX = 50_000
# An exception line quoted inside a message is cut to this.
QUOTE_MAX = 240

_ANSI = re.compile(r"\x1b\[[0-9;]*m")
# "torch.OutOfMemoryError: CUDA out of memory", "MemoryError", "ray.exceptions.RayTaskError(
# ActorDiedError): ...": a line at column 0 naming an exception class, as tracebacks end.
_EXCEPTION_LINE = re.compile(
    r"^((?:[A-Za-z_]\w*\.)*[A-Za-z_]\w*(?:Error|Exception|Exit|Interrupt|Timeout|Failed|NotAllowed)"
    r"(?:\([A-Za-z_][\w.]*\))?)(?::\s?(.*))?$"
)
_FRAME = re.compile(r'^\s+File "([^"]+)", line \d+')
_CHAIN_SEPARATORS = ("The above exception", "During handling of the above", "Traceback (most recent call last)")
# A run actor's name as Ray writes it in an actor's error: the dead actor's "name:"
# field, or the process title of a failed constructor.
_ACTOR_NAME = re.compile(r"(?:\bname: |ray::)(run-\d+(?:-(?:buffer|trainer(?:-\d+)?|inference-\d+))?)\b")
_ACTOR_CLASSES = {
    "BufferActor": "buffer",
    "TrainerActor": "trainer",
    "TrainerRank": "trainer rank",
    "InferenceWorker": "inference worker",
    "RunDriver": "driver",
}
_CLASS_NAME = re.compile(r"\bclass_name: (\w+)|ray::(?:[\w-]+:)?(\w+)\.__init__")
# How CUDA words it (torch's OutOfMemoryError, or a RuntimeError from a kernel).
_GPU_OOM = re.compile(r"\b(?:CUDA|GPU)\b.*\bout of memory\b", re.IGNORECASE)
# How Ray says its memory monitor killed a Ray worker process (the actor's death cause).
_RAY_OOM = re.compile(r"NODE_OUT_OF_MEMORY|running low on memory|memory pressure", re.IGNORECASE)


@dataclass(frozen=True)
class Failure:
    """Why a run failed: `kind` (one of KINDS), `message` (one or two sentences for
    people: what happened and what to do), `detail` (the traceback behind it)."""

    kind: str
    message: str
    detail: str = ""


class ChildFailed(RuntimeError):
    """A run actor raised or died. `who`: which one, as people call it ("trainer",
    "buffer", "inference worker 0"; "" if not known); `detail`: the traceback it reported
    (a loop's error crosses to the driver as text)."""

    def __init__(self, message: str, *, who: str = "", detail: str = "") -> None:
        super().__init__(message)
        self.who = who
        self.detail = detail


class NodeLost(ChildFailed):
    """Ray declared dead a node that held some of the run's actors. `nodes`: how each
    lost node is named ("10.0.0.5, pool=train; Ray node 1a2b…"); `actors`: the run's
    actors that were on them ("trainer rank 1")."""

    def __init__(self, nodes: list[str], actors: list[str]) -> None:
        super().__init__(f"lost node(s) {nodes} with {actors}", who=actors[0] if actors else "")
        self.nodes = nodes
        self.actors = actors


class SyncTimeout(ChildFailed):
    """The trainer and the inference workers did not all join the weight sync within
    sync.timeout_s."""

    def __init__(self, protocol: str, timeout_s: float) -> None:
        super().__init__(f"weight sync ({protocol}) did not connect within sync.timeout_s={timeout_s:g}s")
        self.protocol = protocol
        self.timeout_s = timeout_s


@dataclass(frozen=True)
class _Raised:
    """One exception behind a failure: its class name ("torch.OutOfMemoryError"), its
    message, the object when there is one (else it was parsed from a traceback's text),
    and the files of the frames that raised it (from text only)."""

    type: str
    message: str
    exc: BaseException | None = None
    files: tuple[str, ...] = ()

    @property
    def short(self) -> str:
        """The class's own name; for Ray's "RayTaskError(ActorDiedError)", the inner one."""
        name = self.type.rsplit(".", 1)[-1]
        inner = re.search(r"\((\w+)\)$", name)
        return inner.group(1) if inner else name

    @property
    def line(self) -> str:
        """'Type: first line of the message', cut to QUOTE_MAX, as a quote for a message."""
        first = self.message.strip().splitlines()[0].strip() if self.message.strip() else ""
        return _cut(f"{self.short}: {first}" if first else self.short, QUOTE_MAX)


def explain(
    exc: BaseException,
    cfg: RunConfig | None = None,
    *,
    ray_address: str | None = None,
    phase: str = "",
    what: str = "",
    nodes: dict[str, str] | None = None,
) -> Failure:
    """Why `exc` ended the run: a Failure whose message says what happened and what to
    do, and whose detail is the full traceback (with any traceback a child reported).

    `cfg`: the run's config (names the fields to change, and model.path); `ray_address`:
    the cluster the caller tried to reach; `phase`: what the driver was doing (a
    workers.run.reporter PHASE); `what`: the action that failed, for the fallback message
    ("The launch" → "The launch failed: ConnectionError: ..."); `nodes`: the run's Ray
    nodes, id → how to name one ("10.0.0.5, pool=train"), for an actor whose node died."""
    try:
        chain = _chain(exc)
        raised = _raised_behind(chain)
        child = next((e for e in chain if isinstance(e, ChildFailed)), None)
        facts = _Facts(chain, raised, child, cfg, ray_address, phase, nodes or {})
        for rule in _RULES:
            found = rule(facts)
            if found is not None:
                kind, message = found
                break
        else:
            kind, message = "error", _fallback(facts, what)
    except Exception:  # a bug here must not hide the failure it was explaining
        log.exception("could not explain %r", exc)
        line = traceback.format_exception_only(exc)[-1].strip()
        kind, message = "error", f"{what} failed: {line}" if what else line
    return Failure(kind, _sentence(message), detail(exc))


def detail(exc: BaseException) -> str:
    """The full traceback of `exc` (its chain included) and, for a child that reported
    its own, that one too; cut in the middle to DETAIL_MAX."""
    text = "".join(traceback.format_exception(exc))
    for e in _chain(exc):
        if isinstance(e, ChildFailed) and e.detail:
            text += f"\n{_who_name(e.who) if e.who else 'The run actor'} reported:\n{e.detail}"
    return clip(_ANSI.sub("", text), DETAIL_MAX)


def clip(text: str, limit: int) -> str:
    """`text` cut to `limit` characters by dropping its middle: a traceback's first
    frames say where it started and its last lines what was raised."""
    if len(text) <= limit:
        return text
    marker = "\n… {} characters cut …\n"
    room = limit - len(marker.format(len(text)))
    head = room // 3
    tail = room - head
    return text[:head] + marker.format(len(text) - head - tail) + text[len(text) - tail :]


def ray_unreachable(address: str | None) -> str:
    """The sentence for a Ray cluster that does not answer at `address`."""
    if address:
        return f"Ray at {address} is unreachable: check RAY_ADDRESS and that the Ray head is running."
    return "No Ray cluster is reachable (RAY_ADDRESS is not set): set RAY_ADDRESS to the Ray head's address."


# -- reading what is behind an exception ---------------------------------------------


def _chain(exc: BaseException) -> list[BaseException]:
    """`exc` and every exception behind it, outermost first, each once."""
    out: list[BaseException] = []
    seen: set[int] = set()
    todo: list[BaseException | None] = [exc]
    while todo:
        e = todo.pop(0)
        if e is None or id(e) in seen:
            continue
        seen.add(id(e))
        out.append(e)
        # Ray keeps a remote error's original exception in `cause` (RayTaskError).
        cause = e.__dict__.get("cause") if hasattr(e, "__dict__") else None
        todo += [cause if isinstance(cause, BaseException) else None, e.__cause__, e.__context__]
    return out


def _qualname(exc: BaseException) -> str:
    cls = type(exc)
    return cls.__name__ if cls.__module__ == "builtins" else f"{cls.__module__}.{cls.__name__}"


def _raised_behind(chain: list[BaseException]) -> list[_Raised]:
    """Every exception in `chain`, then every exception line in the texts they carry (a
    child's reported traceback, a remote traceback in Ray's message), in that order."""
    raised = [_Raised(_qualname(e), _ANSI.sub("", str(e)), e) for e in chain]
    for e in chain:
        if isinstance(e, ChildFailed) and e.detail:
            raised += parse_traceback(e.detail)
        if _is_ray(e):
            raised += parse_traceback(str(e))
    return raised


def parse_traceback(text: str) -> list[_Raised]:
    """The exceptions a traceback's text shows, in the order it prints them (a chained
    traceback prints the root cause first), each with its message (continuation lines
    included, as Ray's ActorDiedError writes its fields) and the files of its frames."""
    lines = _ANSI.sub("", text).splitlines()
    out: list[_Raised] = []
    files: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        frame = _FRAME.match(line)
        if frame:
            files.append(frame.group(1))
            i += 1
            continue
        m = _EXCEPTION_LINE.match(line)
        if not m:
            i += 1
            continue
        message = [m.group(2) or ""]
        i += 1
        while i < len(lines) and lines[i].strip() and not lines[i].startswith(_CHAIN_SEPARATORS):
            if _FRAME.match(lines[i]) or lines[i].startswith("ray::"):
                break
            message.append(lines[i].strip())
            i += 1
        out.append(_Raised(m.group(1), "\n".join(message).strip(), None, tuple(files)))
        files = []
    return out


def _module_class(module: str, name: str) -> type | None:
    """A class of an already imported module (None if the module is not loaded: then no
    exception of that class can exist in this process)."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return cls if isinstance(cls, type) else None


def _is_ray(exc: BaseException) -> bool:
    base = _module_class("ray.exceptions", "RayError")
    return base is not None and isinstance(exc, base)


def _is(r: _Raised, module: str, name: str) -> bool:
    """Whether `r` is an instance of module.name (or, parsed from text, named so)."""
    cls = _module_class(module, name)
    if r.exc is not None and cls is not None and isinstance(r.exc, cls):
        return True
    return r.short == name


# -- what the rules know -------------------------------------------------------------


@dataclass
class _Facts:
    chain: list[BaseException]
    raised: list[_Raised]
    child: ChildFailed | None
    cfg: RunConfig | None
    ray_address: str | None
    phase: str
    nodes: dict[str, str]

    def actor(self) -> tuple[str, str]:
        """(role, Ray actor name) of the run actor the failure is about: the one Ray
        names in an actor error (a dead actor, a failed constructor), else the child
        the driver named, else ("", "")."""
        for r in self.raised:
            if r.short in _RAY_ACTOR_ERRORS:
                found = _actor_in(r.message)
                if found[0]:
                    return found
        return (self.child.who, "") if self.child is not None and self.child.who else ("", "")


_RAY_ACTOR_ERRORS = ("ActorDiedError", "RayActorError", "ActorUnavailableError")


def _actor_in(text: str) -> tuple[str, str]:
    """(role, name) of a run actor Ray's text names, e.g. ("inference worker 0",
    "run-7-inference-0"); the role alone from its class name; else ("", "")."""
    m = _ACTOR_NAME.search(text)
    if m:
        name = m.group(1)
        parts = name.split("-", 2)
        if len(parts) == 2:
            return "driver", name
        role = parts[2]
        if role.startswith("inference-"):
            return f"inference worker {role.removeprefix('inference-')}", name
        if role.startswith("trainer-"):
            return f"trainer rank {role.removeprefix('trainer-')}", name
        return role, name
    m = _CLASS_NAME.search(text)
    if m:
        role = _ACTOR_CLASSES.get(m.group(1) or m.group(2), "")
        return role, ""
    return "", ""


def _who_name(role: str) -> str:
    """How a message names an actor, capitalised: "The trainer", "Inference worker 0"."""
    if not role:
        return "A run actor"
    if role.startswith(("inference worker", "trainer rank")):
        return role[0].upper() + role[1:]
    return f"The {role}"


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text.startswith(("The ", "A ")) else text


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sentence(text: str) -> str:
    text = _cut(" ".join(text.split()) if "\n" in text else text.strip(), MESSAGE_MAX)
    return text if text.endswith((".", "!", "?", "…")) else text + "."


# -- the rules, most specific first --------------------------------------------------


def _path_not_allowed(f: _Facts) -> tuple[str, str] | None:
    for e in f.chain:
        if isinstance(e, PathNotAllowed):
            if e.field == "model.path" and "config.json" in e.message:
                return "bad_model", _no_config(f, e.message)
            # Its message names the operator's setting and the fix already.
            return "path_not_allowed", f"{e.field}: {e.message}"
    return None


def _model_path(f: _Facts) -> str | None:
    model = getattr(f.cfg, "model", None)
    return model.path if model is not None and model.source == "path" and model.path else None


def _no_config(f: _Facts, text: str) -> str:
    path = _model_path(f) or "given in model.path"
    if _model_path(f) and not os.path.isdir(path):
        return f"The model directory {path} does not exist: point model.path at a Hugging Face model directory."
    return f"The model directory {path} has no config.json: point model.path at a Hugging Face model directory."


def _bad_model(f: _Facts) -> tuple[str, str] | None:
    """An error about model.path's directory: loading it failed (missing files, an
    unreadable config). Only errors whose message names the directory count."""
    path = _model_path(f)
    if path is None:
        return None
    names = {path.rstrip("/"), os.path.realpath(path)}
    for r in f.raised:
        if not any(n and n in r.message for n in names):
            continue
        text = r.message
        lower = text.lower()
        if "permission denied" in lower or r.short == "PermissionError":
            return "bad_model", (
                f"The model directory {path} cannot be read (permission denied): let the Ray worker processes' user "
                "read it, or point model.path at another directory."
            )
        if "config.json" in text and ("json" in r.short.lower() or "valid json" in lower or "decode" in lower):
            return "bad_model", (
                f"The config.json in the model directory {path} is not valid JSON: fix it, or point model.path "
                "at another Hugging Face model directory."
            )
        if "config.json" in text:
            return "bad_model", _no_config(f, text)
        if any(w in text for w in ("model.safetensors", "pytorch_model.bin", "no file named")):
            return "bad_model", (
                f"The model directory {path} has no weights (model.safetensors or pytorch_model.bin): point "
                "model.path at a complete Hugging Face model directory."
            )
        return "bad_model", (
            f"The model in {path} could not be loaded ({r.line}): point model.path at a Hugging Face Llama "
            "model directory."
        )
    return None


# What to lower when each role runs out of memory.
_MEMORY_FIX = {
    "trainer": "lower trainer.batch_groups or trainer.group_size, or use a smaller model",
    "inference worker": "lower trainer.batch_groups, trainer.group_size or inference.max_new_tokens, "
    "or use a smaller model",
    "buffer": "lower buffer.capacity or trainer.batch_groups",
    "driver": "lower warm_start.batch_size or use a smaller model",
    # vLLM takes its share of the GPU up front, whatever the batch.
    "vllm": "lower inference.gpu_memory_utilization or inference.num_workers, or use a smaller model",
}


def _out_of_memory(f: _Facts) -> tuple[str, str] | None:
    by_ray = gpu = found = False
    for r in f.raised:
        if r.type == "ray.exceptions.OutOfMemoryError" or (r.short == "OutOfMemoryError" and r.type.startswith("ray")):
            found = by_ray = True
        elif r.type.startswith("torch") and r.short == "OutOfMemoryError" or _GPU_OOM.search(r.message):
            found = gpu = True
        elif r.short in ("MemoryError", "OutOfMemoryError"):
            found = True
        elif r.short in _RAY_ACTOR_ERRORS and _RAY_OOM.search(_death_words(r.message)):
            found = by_ray = True
    if not found:
        return None
    role, name = f.actor()
    # Not an actor's, so this process's own (the driver's), unless Ray killed it.
    role = role or ("" if by_ray else "driver")
    backend = getattr(getattr(f.cfg, "inference", None), "backend", "")
    if role.startswith("inference worker"):
        fix = _MEMORY_FIX["vllm" if backend == "vllm" else "inference worker"]
    else:
        fix = _MEMORY_FIX.get(role, _MEMORY_FIX["trainer"])
    who = _who_name(role)
    if role == "driver" and f.phase == "warm_start":
        who = "The driver ran out of memory building the warm-started policy"
        return "out_of_memory", f"{who}: {fix}."
    if by_ray:
        actor = f" ({name})" if name else ""
        return "out_of_memory", (
            f"Ray's memory monitor killed {_lower_first(who)}{actor} because its node ran low on memory: "
            f"{fix}, or give the Ray nodes more memory."
        )
    return "out_of_memory", f"{who} ran out of {'GPU ' if gpu else ''}memory: {fix}."


def _death_words(text: str) -> str:
    """The part of an actor error where Ray says why the actor is dead (not a failed
    constructor's traceback, which may quote anything)."""
    at = text.find("The actor is dead because")
    return text[at:] if at >= 0 else ""


def _node_lost(f: _Facts) -> tuple[str, str] | None:
    lost = next((e for e in f.chain if isinstance(e, NodeLost)), None)
    if lost is None:
        return None
    nodes = " and ".join(lost.nodes)
    actors = ", ".join(lost.actors) or "no actor of this run"
    return "node_lost", (
        f"The run lost a node: {nodes} left the cluster, and with it {actors}. Launch the run again, "
        "or resume it from its latest checkpoint."
    )


def _sync_timeout(f: _Facts) -> tuple[str, str] | None:
    own = next((e for e in f.chain if isinstance(e, SyncTimeout)), None)
    timed_out = own is not None
    for r in f.raised:
        lower = r.message.lower()
        says_time = "timed out" in lower or "timeout" in lower
        if says_time and (r.short.startswith("Dist") or "gloo" in lower or any("/sync/" in p for p in r.files)):
            timed_out = True
    if not timed_out:
        return None
    sync = own or getattr(f.cfg, "sync", None)
    what = f"The weight sync ({sync.protocol}) timed out after sync.timeout_s={sync.timeout_s:g} s" if sync else ""
    return "sync_timeout", (
        f"{what or 'The weight sync timed out'}: the trainer and the inference workers did not all join in time. "
        "Raise sync.timeout_s, or lower inference.num_workers if the cluster is busy."
    )


def _root_line(raised: list[_Raised]) -> str:
    """The line to quote from a chained traceback's exceptions (root cause first): the
    outermost, unless it only points at the root cause."""
    if not raised:
        return ""
    last = raised[-1]
    if "root cause" in last.message.lower() and len(raised) > 1:
        return raised[0].line
    return last.line


def _actor_start(f: _Facts) -> tuple[str, str] | None:
    """A run actor's constructor raised (Ray reports the actor dead, its init failed)."""
    for e in f.chain:
        if not (_is_ray(e) and getattr(e, "actor_init_failed", False)):
            continue
        role, _ = _actor_in(_ANSI.sub("", str(e)))
        role = role or (f.child.who if f.child else "")
        quote = _root_line(parse_traceback(str(e)))
        backend = getattr(getattr(f.cfg, "inference", None), "backend", "")
        if role.startswith("inference worker") and (backend == "vllm" or "vllm" in str(e).lower()):
            return "vllm_start", (
                f"vLLM could not start in {role} ({quote}): check that vLLM supports the model and that "
                "inference.gpu_memory_utilization leaves it room, or set inference.backend to torch."
            )
        return "actor_start", f"{_who_name(role)} could not start: {quote}"
    return None


def _death_cause(text: str, nodes: dict[str, str]) -> str:
    """Ray's reason an actor died, in a few words; a dead node named as `nodes` knows it."""
    if "killed by `ray.kill`" in text:
        return "it was killed (ray.kill)"
    if "owner has died" in text:
        return "the process that created it died"
    if "preempted" in text.lower():
        return "its node was preempted"
    if re.search(r"node (?:\S+ )?(?:has )?died|NODE_DIED", text):
        m = re.search(r"Node Id: ([0-9a-f]+)", text)
        node = m.group(1) if m else ""
        named = nodes.get(node)
        if named:
            return f"its node died ({named}; Ray node {node[:12]}): it left the cluster"
        return f"its node died (Ray node {node[:12]})" if node else "its node died"
    m = re.search(r"Worker exit detail: (.+)", text)
    if m:
        return f"its process died ({_cut(m.group(1).strip(), QUOTE_MAX)})"
    m = re.search(r"The actor is dead because (.+)", text)
    if m:
        return _cut(m.group(1).strip().rstrip("."), QUOTE_MAX)
    return "Ray gave no reason"


def _actor_died(f: _Facts) -> tuple[str, str] | None:
    for r in f.raised:
        if r.short in _RAY_ACTOR_ERRORS:
            role, name = _actor_in(r.message)
            if not role:
                role, name = f.actor()
            cause = "Ray could not reach it" if r.short == "ActorUnavailableError" else _death_cause(r.message, f.nodes)
            actor = f" (Ray actor {name})" if name else ""
            return "actor_died", f"{_who_name(role)}{actor} died: {cause}. Launch the run again."
    return None


def _ray_unreachable(f: _Facts) -> tuple[str, str] | None:
    for r in f.raised:
        lower = r.message.lower()
        if r.short == "AuthenticationError" and "ray" in r.type.lower():
            address = f.ray_address or _address_in(r.message)
            where = f"Ray at {address}" if address else "The Ray cluster"
            return "ray_unreachable", (
                f"{where} refused this process's token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the "
                "cluster's token."
            )
        if (
            r.short == "RayUnreachable"  # workers.run.lifecycle's probe of the head
            or (r.short == "ConnectionError" and re.search(r"\b(?:ray|gcs)\b", lower))
            or "failed to connect to gcs" in lower
            or (r.short == "RpcError" and "gcs" in lower)
            or "could not find any running ray instance" in lower
        ):
            return "ray_unreachable", ray_unreachable(f.ray_address or _address_in(r.message))
    return None


def _address_in(text: str) -> str | None:
    m = re.search(r"\bat (?:address )?([\w.\-\[\]:]+:\d+)", text)
    return m.group(1) if m else None


def _ray_timeout(f: _Facts) -> tuple[str, str] | None:
    for r in f.raised:
        if _is(r, "ray.exceptions", "GetTimeoutError"):
            return "ray_timeout", (
                f"Ray did not answer in time ({r.line}): the cluster may be overloaded or short of CPUs; "
                "try again when it has room."
            )
    return None


def _actor_error(f: _Facts) -> tuple[str, str] | None:
    child = f.child
    if child is None:
        return None
    if not child.who:
        return "actor_error", str(child)
    quote = _root_line(parse_traceback(child.detail)) if child.detail else ""
    return "actor_error", f"{_who_name(child.who)} failed: {quote or str(child)}"


def _fallback(f: _Facts, what: str) -> str:
    """The outermost exception's line; for a remote error, the one Ray wrapped."""
    wrapper = _module_class("ray.exceptions", "RayTaskError")
    lines = [r.line for r in f.raised if r.exc is not None and not (wrapper and isinstance(r.exc, wrapper))]
    line = lines[0] if lines else (f.raised[0].line if f.raised else "unknown error")
    return f"{what} failed: {line}" if what else line


_RULES = (
    _node_lost,
    _path_not_allowed,
    _bad_model,
    _out_of_memory,
    _sync_timeout,
    _actor_start,
    _actor_died,
    _ray_unreachable,
    _ray_timeout,
    _actor_error,
)
