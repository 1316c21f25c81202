"""Why a run failed, as a record made where the exception is caught.

A `Failure` says what failed (`kind`, one of KINDS), in which run actor (`actor`,
`actor_name`) on which node (`node`), doing what (`operation`), the exception it
quotes (`error`), the sentence people read (`message`: what happened and what to do)
and the traceback (`traceback`, for the site's admins only: its frames name the
server's files). `explain(exc, cfg, actor=..., operation=...)` makes one from the
exception objects behind `exc` (`__cause__`, `__context__`, and the `cause` Ray wraps
a remote error in) and from what the catcher knows; nothing is read back from a
traceback's text.

Each side makes its own: an actor's loop and constructor catch their error and hand
the record to the driver (`ChildFailed.failure`: a dataclass, so Ray pickles it; a
constructor's through `ready`, as Ray passes an error raised in `__init__` on only as
text: workers.run.actors), the driver explains what it catches itself (a timeout, a
lost node), and the site a launch that failed. A run actor Ray reports dead is described by workers.run.ray_deaths from
Ray's own record of the death (the actor table), read only where an actor error is
behind the failure.

No Django, and neither Ray nor torch is imported here: the site imports this module
too, and an exception of theirs can only exist once their module is loaded, so their
classes are looked up in `sys.modules`.
"""

from __future__ import annotations

import json
import logging
import os
import sys
import traceback as tb
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from workers.run.paths import PathNotAllowed

if TYPE_CHECKING:
    from workers.config.run_config import RunConfig
    from workers.run.ray_deaths import ActorDeath

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
    "hang",  # a run actor's wait outlived its deadline (workers/run/watchdog.py)
    "error",  # anything else: the exception's last line
)
# The message stays short (it is shown as is); the traceback is bounded so that one
# status post stays small: the ingest refuses more.
MESSAGE_MAX = 1000
DETAIL_MAX = 50_000
# An exception line quoted inside a message is cut to this.
QUOTE_MAX = 240
# What `operation` says of a run actor's constructor and of its loop.
STARTING = "start"
LOOP = "loop"


@dataclass(frozen=True)
class Failure:
    """Why a run failed, as data: `kind` (one of KINDS); `message`, the sentence people
    read; `actor` ("trainer", "inference worker 0", "buffer", "driver"; for a lost node
    every actor it took) and `actor_name` (its Ray actor name) when a run actor failed;
    `node`, where it ran ("10.0.0.5, pool=train (Ray node 1f11c59d4fb8)"); `operation`,
    what it was doing (STARTING, LOOP, a driver phase, the caller's action); `error`,
    the exception quoted ("ValueError: loss is NaN at step 3"); `traceback`, for admins."""

    kind: str
    message: str
    actor: str = ""
    actor_name: str = ""
    node: str = ""
    operation: str = ""
    error: str = ""
    traceback: str = ""

    @property
    def detail(self) -> str:
        """The record's facts, a line each, for whoever may see the run (its
        `error_detail`): no traceback."""
        actor = f"{self.actor} ({self.actor_name})" if self.actor and self.actor_name else self.actor
        rows = (
            ("kind", self.kind),
            ("actor", actor),
            ("node", self.node),
            ("operation", self.operation),
            ("error", self.error),
        )
        return "\n".join(f"{name}: {value}" for name, value in rows if value)

    def fields(self) -> dict[str, str]:
        """The record as the status post carries it (workers.run.reporter)."""
        return {
            "kind": self.kind,
            "message": self.message,
            "actor": self.actor,
            "actor_name": self.actor_name,
            "node": self.node,
            "operation": self.operation,
            "error": self.error,
            "traceback": self.traceback,
        }


class ChildFailed(RuntimeError):
    """A run actor failed, or the driver gave up on the run's actors. `failure`: the
    record, made where the error was caught (None when the driver raised this with only
    its own sentence, e.g. actors that never became ready)."""

    def __init__(self, message: str, failure: Failure | None = None) -> None:
        super().__init__(message)
        self.failure = failure

    def __reduce__(self):  # Ray pickles it across processes: keep the record
        return (type(self), (str(self), self.failure))


class NodeLost(ChildFailed):
    """Ray declared dead a node that held some of the run's actors. `nodes`: how each
    lost node is named ("10.0.0.5, pool=train (Ray node 1a2b…)"); `actors`: the run's
    actors that were on them ("trainer rank 1")."""

    def __init__(self, nodes: list[str], actors: list[str]) -> None:
        super().__init__(f"lost node(s) {nodes} with {actors}")
        self.nodes = nodes
        self.actors = actors

    def __reduce__(self):
        return (type(self), (self.nodes, self.actors))


class SyncTimeout(ChildFailed):
    """The trainer and the inference workers did not all join the weight sync within
    sync.timeout_s."""

    def __init__(self, protocol: str, timeout_s: float) -> None:
        super().__init__(f"weight sync ({protocol}) did not connect within sync.timeout_s={timeout_s:g}s")
        self.protocol = protocol
        self.timeout_s = timeout_s

    def __reduce__(self):
        return (type(self), (self.protocol, self.timeout_s))


class RayUnreachable(ConnectionError):
    """The Ray head at `address` does not accept connections (workers.run.lifecycle's
    probe)."""

    def __init__(self, address: str) -> None:
        super().__init__(f"the Ray head at {address} does not answer (RAY_ADDRESS; is it running?)")
        self.address = address


def explain(
    exc: BaseException,
    cfg: RunConfig | None = None,
    *,
    actor: str = "",
    actor_name: str = "",
    node: str = "",
    operation: str = "",
    ray_address: str | None = None,
    phase: str = "",
    what: str = "",
    nodes: dict[str, str] | None = None,
) -> Failure:
    """Why `exc` ended the run, as a Failure made of the exception objects behind it.

    `cfg`: the run's config (names the fields to change, and model.path); `actor`,
    `actor_name`, `node`: the run actor that caught `exc` (none: the driver or the
    site); `operation`: what it was doing; `ray_address`: the cluster the caller tried to
    reach; `phase`: what the driver was doing (a workers.run.reporter PHASE); `what`: the
    action that failed, for the fallback message ("The launch" → "The launch failed:
    ConnectionError: ..."); `nodes`: the run's Ray nodes, id → how to name one
    ("10.0.0.5, pool=train"), for an actor whose node died. A record a run actor made
    (a ChildFailed's) is kept as it is."""
    chain = _chain(exc)
    child = next((e for e in chain if isinstance(e, ChildFailed) and e.failure is not None), None)
    if child is not None and child.failure is not None:
        return child.failure
    base = Failure(
        "error",
        "",
        actor=actor,
        actor_name=actor_name,
        node=node,
        operation=operation or phase or (what.lower() if what else ""),
        error=_line(_outermost(chain)),
        traceback=clip("".join(tb.format_exception(exc)), DETAIL_MAX),
    )
    try:
        facts = _Facts(chain, base, cfg, ray_address, phase, nodes or {}, _death(chain))
        for rule in _RULES:
            found = rule(facts)
            if found is not None:
                break
        else:
            found = _fallback(facts, what)
    except Exception:  # a bug here must not hide the failure it was explaining
        log.exception("could not explain %r", exc)
        found = replace(base, message=f"{what} failed: {base.error}" if what else base.error)
    return replace(found, message=_sentence(found.message))


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


def node_label(where: dict) -> str:
    """How a record names the node of a run actor's `where` (workers.core.run_actors.where_am_i)."""
    labels = ", ".join(f"{k}={v}" for k, v in sorted(where.get("labels", {}).items()))
    return f"{where.get('node_ip', '')}{', ' + labels if labels else ''} (Ray node {where.get('node_id', '')[:12]})"


# -- the exception objects behind a failure --------------------------------------------


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


def _module_class(module: str, name: str) -> type | None:
    """A class of an already imported module (None if the module is not loaded: then no
    exception of that class can exist in this process)."""
    mod = sys.modules.get(module)
    cls = getattr(mod, name, None) if mod is not None else None
    return cls if isinstance(cls, type) else None


def _is(exc: BaseException, module: str, name: str) -> bool:
    cls = _module_class(module, name)
    return cls is not None and isinstance(exc, cls)


def _is_ray_wrapper(exc: BaseException) -> bool:
    """A RayTaskError: the remote error it wraps (its `cause`) is the one to quote."""
    return _is(exc, "ray.exceptions", "RayTaskError")


def _outermost(chain: list[BaseException]) -> BaseException:
    return next((e for e in chain if not _is_ray_wrapper(e)), chain[0])


def _line(exc: BaseException) -> str:
    """'Type: first line of its message', cut to QUOTE_MAX, as a message quotes it."""
    text = str(exc).strip()
    first = text.splitlines()[0].strip() if text else ""
    name = type(exc).__name__
    if _is_ray_wrapper(exc) and isinstance(getattr(exc, "cause", None), BaseException):
        name = type(exc.cause).__name__  # type: ignore[attr-defined]
    return _cut(f"{name}: {first}" if first else name, QUOTE_MAX)


def _root_line(exc: BaseException) -> str:
    """The line to quote of `exc`: its own, unless it only points at its root cause
    (vLLM's "Engine core initialization failed. See root cause above"), then the
    innermost exception's."""
    chain = [e for e in _chain(exc) if not _is_ray_wrapper(e)]
    if not chain:
        return _line(exc)
    if "root cause" in str(chain[0]).lower() and len(chain) > 1:
        return _line(chain[-1])
    return _line(chain[0])


def _death(chain: list[BaseException]) -> ActorDeath | None:
    """What Ray recorded of the death of the run actor behind an actor error in `chain`."""
    base = _module_class("ray.exceptions", "RayActorError")
    err = next((e for e in chain if base is not None and isinstance(e, base)), None)
    if err is None:
        return None
    from workers.run.ray_deaths import death  # imports Ray, loaded already when one of its errors exists

    return death(err)  # type: ignore[arg-type]  # a RayActorError, by the isinstance above


# -- what the rules know ---------------------------------------------------------------


@dataclass
class _Facts:
    chain: list[BaseException]
    base: Failure  # what the catcher knows: actor, node, operation, error, traceback
    cfg: RunConfig | None
    ray_address: str | None
    phase: str
    nodes: dict[str, str]
    death: ActorDeath | None  # a run actor Ray reports dead, as Ray recorded it

    def found(self, kind: str, message: str, **fields: str) -> Failure:
        return replace(self.base, kind=kind, message=message, **fields)

    def dead_actor(self) -> dict[str, str]:
        """The record's actor fields for the dead actor, when Ray named it."""
        d = self.death
        if d is None or not (d.name or d.role):
            return {}
        return {"actor": d.role or self.base.actor, "actor_name": d.name, "node": self.node_of(d.node_id)}

    def node_of(self, node_id: str) -> str:
        if not node_id:
            return self.base.node
        named = self.nodes.get(node_id)
        return f"{named} (Ray node {node_id[:12]})" if named else f"Ray node {node_id[:12]}"


def _who_name(role: str) -> str:
    """How a message names an actor, capitalised: "The trainer", "Inference worker 0"."""
    if not role:
        return "A run actor"
    if role.startswith(("inference worker", "trainer rank", "reward worker")):
        return role[0].upper() + role[1:]
    return f"The {role}"


def _lower_first(text: str) -> str:
    return text[0].lower() + text[1:] if text.startswith(("The ", "A ")) else text


def _cut(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _sentence(text: str) -> str:
    text = _cut(" ".join(text.split()) if "\n" in text else text.strip(), MESSAGE_MAX)
    return text if text.endswith((".", "!", "?", "…")) else text + "."


# -- the rules, most specific first ----------------------------------------------------


def _path_not_allowed(f: _Facts) -> Failure | None:
    for e in f.chain:
        if isinstance(e, PathNotAllowed):
            # Only the refusal of a directory under the roots is about the directory: one
            # outside them is refused in words that tell nothing about the host.
            if e.field == "model.path" and "config.json" in e.message:
                problem = _model_dir_problem(f, e)
                if problem:
                    return f.found("bad_model", problem)
            # Its message names the operator's setting and the fix already.
            return f.found("path_not_allowed", f"{e.field}: {e.message}")
    return None


def _model_path(f: _Facts) -> str | None:
    model = getattr(f.cfg, "model", None)
    return model.path if model is not None and model.source == "path" and model.path else None


def _names_model_dir(e: BaseException, path: str) -> bool:
    """Whether `e` is about model.path's directory: its file names one in it, or its
    message (all that transformers' loading errors give) quotes the directory."""
    names = {path.rstrip("/"), os.path.realpath(path)}
    filename = getattr(e, "filename", None)
    said = f"{filename or ''} {e}"
    return any(n and n in said for n in names)


def _model_dir_problem(f: _Facts, e: BaseException) -> str | None:
    """What is wrong with model.path's directory, found by looking at it (not at the
    words of the error that led here); None if nothing is."""
    path = _model_path(f)
    if path is None:
        return None
    fix = "point model.path at a Hugging Face model directory"
    if isinstance(e, PermissionError) or not os.access(path, os.R_OK | os.X_OK) and os.path.isdir(path):
        return (
            f"The model directory {path} cannot be read (permission denied): let the Ray worker processes' user "
            "read it, or point model.path at another directory."
        )
    if not os.path.isdir(path):
        return f"The model directory {path} does not exist: {fix}."
    config = os.path.join(path, "config.json")
    if not os.path.isfile(config):
        return f"The model directory {path} has no config.json: {fix}."
    try:
        with open(config, encoding="utf-8") as fh:
            json.load(fh)
    except (OSError, ValueError):
        return (
            f"The config.json in the model directory {path} is not valid JSON: fix it, or point model.path "
            "at another Hugging Face model directory."
        )
    names = set(os.listdir(path))
    if not any(n.endswith((".safetensors", ".bin")) for n in names):
        return (
            f"The model directory {path} has no weights (model.safetensors or pytorch_model.bin): point "
            "model.path at a complete Hugging Face model directory."
        )
    return None


def _bad_model(f: _Facts) -> Failure | None:
    """An error about model.path's directory: loading it failed (missing files, an
    unreadable config). Only errors that name the directory count."""
    path = _model_path(f)
    if path is None:
        return None
    for e in f.chain:
        if _is_ray_wrapper(e) or not _names_model_dir(e, path):
            continue
        problem = _model_dir_problem(f, e)
        if problem:
            return f.found("bad_model", problem)
        return f.found(
            "bad_model",
            f"The model in {path} could not be loaded ({_line(e)}): point model.path at a Hugging Face Llama "
            "model directory.",
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


def _gpu_oom(e: BaseException) -> bool:
    if _is(e, "torch", "OutOfMemoryError"):
        return True
    # An older CUDA kernel's failed allocation is a plain RuntimeError ("CUDA error: out
    # of memory"): torch gives no class or attribute for it, only these words.
    text = str(e)
    return type(e) is RuntimeError and ("CUDA" in text or "GPU" in text) and "out of memory" in text.lower()


def _out_of_memory(f: _Facts) -> Failure | None:
    by_ray = any(_is(e, "ray.exceptions", "OutOfMemoryError") for e in f.chain)
    by_ray = by_ray or (f.death is not None and f.death.cause == "out_of_memory")
    gpu = any(_gpu_oom(e) for e in f.chain)
    if not (by_ray or gpu or any(isinstance(e, MemoryError) for e in f.chain)):
        return None
    fields = f.dead_actor()
    role = fields.get("actor", f.base.actor)
    name = fields.get("actor_name", f.base.actor_name)
    # Not an actor's, so this process's own (the driver's), unless Ray killed it.
    role = role or ("" if by_ray else "driver")
    fields["actor"] = role
    backend = getattr(getattr(f.cfg, "inference", None), "backend", "")
    if role.startswith("inference worker"):
        fix = _MEMORY_FIX["vllm" if backend == "vllm" else "inference worker"]
    else:
        fix = _MEMORY_FIX.get(role.removesuffix(" rank 0"), _MEMORY_FIX["trainer"])
    who = _who_name(role)
    if role == "driver" and f.phase == "warm_start":
        who = "The driver ran out of memory building the warm-started policy"
        return f.found("out_of_memory", f"{who}: {fix}.", **fields)
    if by_ray:
        actor = f" ({name})" if name else ""
        return f.found(
            "out_of_memory",
            f"Ray's memory monitor killed {_lower_first(who)}{actor} because its node ran low on memory: "
            f"{fix}, or give the Ray nodes more memory.",
            **fields,
        )
    return f.found("out_of_memory", f"{who} ran out of {'GPU ' if gpu else ''}memory: {fix}.", **fields)


def _node_lost(f: _Facts) -> Failure | None:
    lost = next((e for e in f.chain if isinstance(e, NodeLost)), None)
    if lost is None:
        return None
    nodes = " and ".join(lost.nodes)
    actors = ", ".join(lost.actors) or "no actor of this run"
    return f.found(
        "node_lost",
        f"The run lost a node: {nodes} left the cluster, and with it {actors}. Launch the run again, "
        "or resume it from its latest checkpoint.",
        actor=", ".join(lost.actors),
        node=nodes,
    )


def _dist_timeout(e: BaseException) -> bool:
    """A torch.distributed rendezvous or collective that timed out."""
    base = _module_class("torch.distributed", "DistError")
    if base is None or not isinstance(e, base):
        return False
    # torch raises DistStoreError for a store's timeout but names no timeout class for
    # a collective's: the words are all it gives.
    return _is(e, "torch.distributed", "DistStoreError") or "timed out" in str(e).lower()


def _sync_timeout(f: _Facts) -> Failure | None:
    own = next((e for e in f.chain if isinstance(e, SyncTimeout)), None)
    if own is None and not any(_dist_timeout(e) for e in f.chain):
        return None
    sync = own or getattr(f.cfg, "sync", None)
    what = f"The weight sync ({sync.protocol}) timed out after sync.timeout_s={sync.timeout_s:g} s" if sync else ""
    return f.found(
        "sync_timeout",
        f"{what or 'The weight sync timed out'}: the trainer and the inference workers did not all join in time. "
        "Raise sync.timeout_s, or lower inference.num_workers if the cluster is busy.",
    )


def _actor_start(f: _Facts) -> Failure | None:
    """A run actor's constructor raised: the record made inside it (`recorded`), or Ray's
    word that an actor's creation failed."""
    if f.base.operation == STARTING and f.base.actor:
        role, exc = f.base.actor, f.chain[0]
        quote = _root_line(exc)
        backend = getattr(getattr(f.cfg, "inference", None), "backend", "")
        vllm = any(type(e).__module__.startswith("vllm") for e in f.chain)
        if role.startswith("inference worker") and (backend == "vllm" or vllm):
            return f.found(
                "vllm_start",
                f"vLLM could not start in {role} ({quote}): check that vLLM supports the model and that "
                "inference.gpu_memory_utilization leaves it room, or set inference.backend to torch.",
                error=quote,
            )
        return f.found("actor_start", f"{_who_name(role)} could not start: {quote}", error=quote)
    if f.death is not None and f.death.cause == "init_failed":
        # An actor whose constructor does not record its failure: Ray keeps the
        # constructor's exception only as text, in the traceback.
        fields = f.dead_actor()
        return f.found("actor_start", f"{_who_name(fields.get('actor', ''))} could not start", **fields)
    return None


# Ray's reason an actor died (workers.run.ray_deaths.ActorDeath.cause), in a few words.
_DEATH_CAUSES = {
    "killed": "it was killed (ray.kill)",
    "owner_died": "the process that created it died",
    "preempted": "its node was preempted",
    "unavailable": "Ray could not reach it",
    "init_failed": "its constructor raised",
    "": "Ray gave no reason",
}


def _death_words(f: _Facts, death: ActorDeath) -> str:
    if death.cause == "node_died":
        named = f.nodes.get(death.node_id)
        node = death.node_id[:12]
        if named:
            return f"its node died ({named}; Ray node {node}): it left the cluster"
        return f"its node died (Ray node {node})" if node else "its node died"
    if death.cause == "process_died":
        return f"its process died ({_cut(death.exit_detail, QUOTE_MAX)})" if death.exit_detail else "its process died"
    return _DEATH_CAUSES.get(death.cause, _DEATH_CAUSES[""])


def _actor_died(f: _Facts) -> Failure | None:
    if f.death is None:
        return None
    fields = f.dead_actor()
    actor = f" (Ray actor {f.death.name})" if f.death.name else ""
    return f.found(
        "actor_died",
        f"{_who_name(fields.get('actor', ''))}{actor} died: {_death_words(f, f.death)}. Launch the run again.",
        **fields,
    )


def _ray_unreachable(f: _Facts) -> Failure | None:
    for e in f.chain:
        if _is(e, "ray.exceptions", "AuthenticationError"):
            where = f"Ray at {f.ray_address}" if f.ray_address else "The Ray cluster"
            return f.found(
                "ray_unreachable",
                f"{where} refused this process's token: set RAY_AUTH_TOKEN (or RAY_AUTH_TOKEN_PATH) to the "
                "cluster's token.",
            )
        if isinstance(e, RayUnreachable):
            return f.found("ray_unreachable", ray_unreachable(e.address))
        # ray.init raises a plain ConnectionError or RuntimeError when no cluster answers,
        # with no attribute naming the cause: its words are all Ray gives.
        lower = str(e).lower()
        if (
            (isinstance(e, ConnectionError) and ("ray" in lower or "gcs" in lower))
            or "failed to connect to gcs" in lower
            or "could not find any running ray instance" in lower
        ):
            return f.found("ray_unreachable", ray_unreachable(f.ray_address or _address_in(str(e))))
    return None


def _address_in(text: str) -> str | None:
    """The "host:port" Ray's connection error names ("... at 10.0.0.9:6380"): ray.init
    keeps the address it tried in no attribute."""
    words = [w.strip("()[],;'\"") for w in text.split()]
    found = [w for w, before in zip(words[1:], words, strict=False) if before == "at" and ":" in w]
    return found[0].rstrip(".") if found and found[0].rpartition(":")[2].rstrip(".").isdigit() else None


def _ray_timeout(f: _Facts) -> Failure | None:
    for e in f.chain:
        if _is(e, "ray.exceptions", "GetTimeoutError"):
            return f.found(
                "ray_timeout",
                f"Ray did not answer in time ({_line(e)}): the cluster may be overloaded or short of CPUs; "
                "try again when it has room.",
            )
    return None


def _actor_error(f: _Facts) -> Failure | None:
    child = next((e for e in f.chain if isinstance(e, ChildFailed)), None)
    if f.base.actor and f.base.operation != STARTING:
        return f.found("actor_error", f"{_who_name(f.base.actor)} failed: {_root_line(f.chain[0])}")
    if child is not None:
        return f.found("actor_error", str(child))
    return None


def _fallback(f: _Facts, what: str) -> Failure:
    line = f.base.error or "unknown error"
    return f.found("error", f"{what} failed: {line}" if what else line)


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
