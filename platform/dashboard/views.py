"""HTML pages: the runs list, the launch form and a run's live page.

Thin views: access and validation are the actions layer's; live data arrives in the
browser over WebSockets (runs/consumers.py) and the JSON API (api/views.py).
"""

from __future__ import annotations

import json
from functools import cache
from urllib.parse import urlencode

from django.contrib import messages
from django.contrib.auth import get_user_model
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.utils.text import slugify
from django.views.decorators.http import require_http_methods, require_POST

from configs import actions as config_actions
from configs.models import SavedConfig
from foundation import jsonin
from foundation.errors import ActionError, NotFound, nul_errors
from runs import actions, lineage, listing
from runs.models import Experiment, Run
from teams import roles
from teams.models import Team
from workers.config import json_schema
from workers.metric_names import DASHBOARD_CHARTS, METRICS
from workers.presets import PRESETS
from workers.rl_tasks import BUILTINS

NO_SUCH_RUN = "No such run in your teams."
# Tags the flash that says a new run is queued (launch, retry, resume): once the run has
# ended that is no longer true, so a finished run's page leaves it out, and run.js drops
# it when the run ends under the reader's eyes.
UNTIL_RUN_ENDS = "until-run-ends"
UNITS = {m.name: m.unit for m in METRICS}


# (sort key, column title) of the run list's sortable columns, left to right.
SORTABLE = [
    ("name", "Name"),
    ("status", "Status"),
    ("steps", "Steps"),
    ("reward", "Reward"),
    ("samples_per_s", "Samples/s"),
    ("duration", "Duration"),
    ("created", "Created"),
]


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    """The run list: filters, search, sort and page from the URL (runs/listing.py)."""
    errors: dict[str, str] = {}
    try:
        query = listing.check_list_query(request.GET)
    except ActionError as exc:
        errors = exc.errors
        query = listing.ListQuery()
    page = listing.list_runs(request.user, query)
    for run in page.runs:
        run.row = listing.row(run)
        run.spark = listing.sparkline_path(run.sparkline)
    key = query.sort.lstrip("-")
    columns = [
        {
            "key": name,
            "title": title,
            # A click sorts by the column, the second click reverses; numbers and dates
            # start with the highest, names A→Z.
            "url": "?" + urlencode(query.params(sort=_next_sort(name, query.sort), page=1)),
            "sorted": "" if key != name else ("desc" if query.sort.startswith("-") else "asc"),
        }
        for name, title in SORTABLE
    ]
    teams = Team.objects.for_user(request.user)
    return render(
        request,
        "dashboard/runs.html",
        {
            "page": page,
            "runs": page.runs,
            "query": query,
            "errors": errors,
            "columns": columns,
            "statuses": Run.Status.values,
            "presets": sorted(PRESETS),
            "experiments": Experiment.objects.filter(team__in=teams).select_related("team"),
            "launchers": sorted(
                get_user_model()
                .objects.filter(memberships__team__in=teams)
                .values_list("username", flat=True)
                .distinct()
            ),
            "next_url": "?" + urlencode(query.params(page=query.page + 1)) if page.has_next else "",
            "prev_url": "?" + urlencode(query.params(page=query.page - 1)) if page.has_prev else "",
            "here": request.get_full_path(),
            "has_team": teams.exists(),
        },
        status=400 if errors else 200,
    )


def _next_sort(key: str, current: str) -> str:
    if current.lstrip("-") == key:
        return key if current.startswith("-") else f"-{key}"
    return key if key == "name" else f"-{key}"


@login_required
@require_POST
def cancel_many(request: HttpRequest) -> HttpResponse:
    """The run list's "Cancel selected": each checked run cancelled or refused on its own,
    then back to the list as it was (filters, sort, page)."""
    try:
        run_ids = actions.check_run_ids(request.POST.getlist("runs"))
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        cancelled, refused = actions.do_cancel_runs(request.user, run_ids)
        if cancelled:
            messages.info(request, "Cancelling " + ", ".join(f"#{i}" for i in cancelled) + ".")
        for run_id, why in refused.items():
            messages.error(request, f"#{run_id} not cancelled: {why}")
    back = request.POST.get("next", "")
    # Only a path of this site: an open redirect would send people anywhere.
    return redirect(
        back if url_has_allowed_host_and_scheme(back, allowed_hosts=None) and back.startswith("/") else "dashboard:runs"
    )


SAVED_PREFIX = "saved:"  # the launch form's value for a saved configuration: saved:<id>


def _preset_choices(user) -> list[dict]:
    """The preset selector's groups: the built-in presets, then each of the user's
    teams' saved configurations (newest version of each name)."""
    groups = [
        {
            "label": "Built-in presets",
            "options": [
                {
                    "name": name,
                    "label": name,
                    "description": preset["description"],
                    "config": preset["config"].model_dump(mode="json"),
                }
                for name, preset in PRESETS.items()
            ],
        }
    ]
    by_team: dict[str, list[dict]] = {}
    for saved in SavedConfig.objects.visible_to(user).latest_versions().select_related("team"):
        by_team.setdefault(saved.team.name, []).append(
            {
                "name": f"{SAVED_PREFIX}{saved.pk}",
                "label": saved.label,
                "description": saved.description or f"{saved.base_preset} with overrides {json.dumps(saved.overrides)}",
                "config": saved.effective_config().model_dump(mode="json"),
            }
        )
    groups += [{"label": f"{team} configurations", "options": options} for team, options in by_team.items()]
    for option in (option for group in groups for option in group["options"]):
        option["config_json"] = json.dumps(option["config"], indent=2)
    return groups


# The launch form's control groups, one per axis, in the order shown: (title, config
# paths). "section.*" is every field of the section that no earlier entry placed, so a
# field added to workers/config.py gets a control without an edit here. Each control's
# kind, choices and bounds come from the config's JSON schema. Sections left out
# (warm_start) are edited in the overrides JSON only.
CONTROL_GROUPS: list[tuple[str, list[str]]] = [
    ("Orchestration", ["mode"]),
    ("Buffer", ["buffer.mode", "buffer.capacity"]),
    ("Staleness", ["buffer.max_staleness", "buffer.on_stale", "buffer.max_head_offpolicyness", "buffer.*"]),
    ("IS correction", ["correction.method", "trainer.tis_cap", "correction.*"]),
    ("Weight sync", ["sync.protocol", "sync.update_mode", "sync.*"]),
    ("LoRA", ["lora.*"]),
    ("Inference backend", ["inference.backend", "inference.*"]),
    # Where the policy comes from first; the size fields after them apply to `tiny` only.
    ("Model", ["model.source", "model.path", "model.hub_id", "model.*"]),
    # task.options is an object, each task's own: edited in the overrides JSON only. The
    # dataset's fields are controls although the section is unset in every preset: a
    # value typed there creates it.
    ("Task", ["task.name", "task.dataset.*", "task.min_len", "task.max_len", "task.alphabet", "task.reward"]),
    ("Trainer", ["trainer.*"]),
    # Devices per pool are in the inference and trainer groups; where the pools go, here.
    ("Placement", ["placement.*"]),
    ("Eval", ["eval.*"]),
    ("Checkpoints", ["checkpoint.*"]),
    ("Stop", ["stop.*"]),
    ("Seed", ["seed"]),
]

# Free-text fields offered with their usual values: a select of these plus "other", whose
# text box takes anything else (a task in the user's package, "package.module:Class").
SUGGESTIONS: dict[str, list[str]] = {"task.name": list(BUILTINS)}


def _section(schema: dict, node: dict) -> tuple[dict, bool]:
    """`node` with a section's $ref resolved, also that of a section that may be null
    (`anyOf` [its $ref, null]: unset, as task.dataset is by default), and whether it
    may be null. Any other field comes back as it is."""
    refs = [o["$ref"] for o in [node, *node.get("anyOf", [])] if "$ref" in o]
    if not refs:
        return node, False
    return schema["$defs"][refs[0].rsplit("/", 1)[-1]], "anyOf" in node


def _schema_field(schema: dict, path: str) -> tuple[dict, bool]:
    """The JSON schema of the config field (or section, resolved) at dotted `path`, and
    whether a section on the way may be null; KeyError naming the path if the config
    has no such field."""
    node, in_optional = schema, False
    for part in path.split("."):
        properties = node.get("properties", {})
        if part not in properties:
            raise KeyError(f"the run config has no field {path!r}")
        parent_optional = in_optional
        node, optional = _section(schema, properties[part])
        in_optional = parent_optional or optional
    return node, parent_optional


def _control(path: str, field: dict, in_optional: bool = False) -> dict:
    """One form control for a config field, from its JSON schema: enums → select,
    booleans → checkbox, integers and numbers → number input with the schema's bounds,
    lists of strings → comma-separated text, strings → text, or a select of their usual
    values plus free text (`SUGGESTIONS`). A field that may be null ("unset") takes an
    empty value for it. A field of a section that may be null (`in_optional`) is empty
    while the section is unset, its default shown as the placeholder; launch.js drops
    an emptied one from the overrides."""
    choices = [option for option in field.get("anyOf", [field]) if option.get("type") != "null"]
    if len(choices) != 1:
        raise ValueError(f"{path}: no form control for a field of several types ({field})")
    spec = {**field, **choices[0]}
    control = {
        "path": path,
        "id": "cfg-" + path.replace(".", "-"),
        "label": path.rsplit(".", 1)[-1],
        "help": field.get("description", ""),
        "nullable": len(choices) < len(field.get("anyOf", [field])),
        "optional": in_optional,
        "bounds": "",
    }
    control["placeholder"] = "unset" if control["nullable"] else ""
    if in_optional:
        control["placeholder"] = f"default: {field['default']}" if field.get("default") is not None else "not set"
    kind = spec.get("type")
    if path in SUGGESTIONS:
        control.update(kind="choice", options=SUGGESTIONS[path])
    elif "enum" in spec or "const" in spec:
        control.update(kind="select", options=spec.get("enum") or [spec["const"]])
    elif kind == "boolean":
        control["kind"] = "checkbox"
    elif kind in ("integer", "number"):
        # HTML's min/max are inclusive: an exclusive bound is said in words only.
        limits = [
            (word, spec[key])
            for key, word in [("minimum", "≥"), ("exclusiveMinimum", ">"), ("maximum", "≤"), ("exclusiveMaximum", "<")]
            if key in spec
        ]
        control.update(
            kind=kind,
            min=spec.get("minimum"),
            max=spec.get("maximum"),
            step="1" if kind == "integer" else "any",
            bounds=", ".join(f"{word} {value}" for word, value in limits if abs(value) < 2**53),
        )
    elif kind == "array" and spec.get("items", {}).get("type") == "string":
        control.update(kind="list", bounds="comma-separated")
    elif kind == "string":
        control["kind"] = "text"
    else:
        raise ValueError(f"{path}: no form control for schema {spec}")
    return control


@cache
def config_controls() -> tuple[dict, ...]:
    """The launch form's control groups (`CONTROL_GROUPS`), each control described from
    the run config's JSON schema (`_control`)."""
    schema = json_schema()
    placed: set[str] = set()
    groups = []
    for title, entries in CONTROL_GROUPS:
        paths = []
        for entry in entries:
            if entry.endswith(".*"):
                section = entry.removesuffix(".*")
                fields = _schema_field(schema, section)[0]["properties"]
                paths += [f"{section}.{name}" for name in fields if f"{section}.{name}" not in placed]
            elif entry not in placed:
                paths.append(entry)
            placed.update(paths)
        groups.append(
            {
                "title": title,
                "id": "axis-" + slugify(title),
                "controls": [_control(path, *_schema_field(schema, path)) for path in paths],
            }
        )
    return tuple(groups)


def _controls_with_errors(errors: dict[str, str]) -> tuple[list[dict], dict[str, str]]:
    """The control groups with each config error beside its control, and the errors no
    control shows (they go beside the overrides box)."""
    groups = [
        {**group, "controls": [{**control, "error": errors.get(control["path"], "")} for control in group["controls"]]}
        for group in config_controls()
    ]
    shown = {control["path"] for group in groups for control in group["controls"]}
    return groups, {field: message for field, message in errors.items() if field not in shown}


def _save_config(request: HttpRequest, form: dict, overrides: dict) -> SavedConfig:
    """The launch form's "Save as configuration": the team of the chosen experiment
    (or "team:<id>"), the chosen preset or saved configuration, the overrides."""
    experiment, _, team = form["experiment"].partition("team:")
    if experiment:
        team_obj = actions.check_experiment_access(request.user, experiment).team
    else:
        team_obj = roles.check_team_access(request.user, team)
    saved = None
    if form["preset"].startswith(SAVED_PREFIX):
        saved_id = form["preset"].removeprefix(SAVED_PREFIX)
        saved = config_actions.check_saved_config_access(request.user, saved_id, field="preset")
    save = config_actions.check_save_from_launch_form(
        request.user,
        team=team_obj,
        name=form["config_name"],
        description=form["config_description"],
        preset=form["preset"],
        saved=saved,
        overrides=overrides,
    )
    return config_actions.do_save_config(request.user, save)


@login_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    """The launch form: experiment, name, preset, priority, and the overrides JSON that
    launch.js keeps in step with one control per config field (`config_controls`). On
    any error nothing is created and the form comes back with each message next to its
    field (config fields by dotted path, e.g. buffer.capacity, beside their control)."""
    experiments = Experiment.objects.filter(team__in=Team.objects.for_user(request.user)).select_related("team")
    form = {
        "experiment": request.POST.get("experiment", ""),
        "name": request.POST.get("name", ""),
        "preset": request.POST.get("preset", request.GET.get("preset", next(iter(PRESETS)))),
        "overrides": request.POST.get("overrides", "{}"),
        "priority": request.POST.get("priority", "0"),
        "config_name": request.POST.get("config_name", ""),
        "config_description": request.POST.get("config_description", ""),
    }
    # Clone with edits: the form opens holding the run's preset and overrides, and the
    # launched run records that it is a clone of it (runs/lineage.py).
    form["clone_of"] = request.POST.get("clone_of", request.GET.get("clone", ""))
    clone_of = None
    if form["clone_of"]:
        try:
            clone_of = actions.check_run_access(request.user, int(form["clone_of"]))
        except (ValueError, NotFound):
            raise Http404(NO_SUCH_RUN) from None
        if request.method == "GET":
            form.update(
                experiment=str(clone_of.experiment_id),
                name=f"{clone_of.name} (clone)"[: actions.RUN_NAME_MAX],
                preset=clone_of.preset,
                overrides=json.dumps(clone_of.overrides, indent=2),
                priority=str(clone_of.priority),
            )
    errors: dict[str, str] = nul_errors(form) if request.method == "POST" else {}
    status = 400  # a refusal's own (403: the role does not allow it)
    if request.method == "POST" and not errors:
        try:
            overrides = jsonin.loads(form["overrides"] or "{}")
        except jsonin.BadJSON as exc:
            errors["overrides"] = str(exc)
        else:
            try:
                if request.POST.get("action") == "save":
                    saved = _save_config(request, form, overrides)
                    messages.success(request, f"Saved configuration {saved.label} in team {saved.team.name}.")
                    return redirect(f"{reverse('dashboard:launch')}?preset={SAVED_PREFIX}{saved.pk}")
                # "team:<id>" picks a team without experiments: its "default" one is made
                experiment, _, team = form["experiment"].partition("team:")
                # "saved:<id>" picks a team's saved configuration instead of a preset
                preset, _, saved_config = form["preset"].partition(SAVED_PREFIX)
                launch_request = actions.check_launch(
                    request.user,
                    experiment=experiment,
                    team=team,
                    name=form["name"],
                    preset=preset,
                    overrides=overrides,
                    saved_config=saved_config,
                    priority=form["priority"],
                )
            except ActionError as exc:
                errors, status = exc.errors, exc.http_status
            else:
                if clone_of is not None:
                    run = lineage.do_clone(request.user, clone_of, launch_request)
                else:
                    run = actions.do_launch_run(request.user, launch_request)
                messages.success(request, f"Run #{run.pk} queued.", extra_tags=UNTIL_RUN_ENDS)
                return redirect(run)
    if "team" in errors:
        errors["experiment"] = errors.pop("team")
    if "saved_config" in errors:
        errors["preset"] = errors.pop("saved_config")
    if request.POST.get("action") == "save":
        shown_at = {"name": "config_name", "description": "config_description", "base_preset": "preset"}
        for field in shown_at.keys() & errors.keys():
            errors[shown_at[field]] = errors.pop(field)
    simple = {"experiment", "name", "preset", "overrides", "priority", "config_name", "config_description", "config"}
    preset_groups = _preset_choices(request.user)
    control_groups, unplaced = _controls_with_errors({k: v for k, v in errors.items() if k not in simple})
    context = {
        "form": form,
        "experiment_choices": [(str(e.pk), f"{e.team.name} / {e.name}") for e in experiments]
        + [
            (f"team:{team.pk}", f"{team.name} / default (new)")
            for team in Team.objects.for_user(request.user).filter(experiments__isnull=True)
        ],
        "preset_groups": preset_groups,
        # launch.js re-bases the controls on the chosen preset's (or configuration's) config.
        "preset_configs": {o["name"]: o["config"] for group in preset_groups for o in group["options"]},
        "control_groups": control_groups,
        "priority_range": (actions.PRIORITY_MIN, actions.PRIORITY_MAX),
        "errors": errors,
        "field_errors": {k: v for k, v in errors.items() if k in simple},
        # Everything else came from the engine config: beside its control, or when no
        # control shows that path (a section, an unknown field), beside the overrides box.
        "config_errors": sorted(unplaced.items()),
    }
    return render(request, "dashboard/launch.html", context, status=status if errors else 200)


def _charts(run: Run) -> list[dict]:
    """The run page's chart cards; `empty` says why a chart will stay empty for this run
    (its pass is off in the run's config), shown in place of "waiting for data"."""
    eval_off = not (run.config.get("eval") or {}).get("every_steps")
    return [
        {
            "id": f"chart-{slugify(title)}",
            "title": title,
            "series": ",".join(series),
            "unit": UNITS.get(series[0], ""),
            "empty": "eval is off for this run" if eval_off and all(s.startswith("eval/") for s in series) else "",
        }
        for title, series in DASHBOARD_CHARTS
    ]


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        found = actions.check_run_access(request.user, run_id)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    role = roles.role_of(request.user, found.experiment.team)
    flashes = [m for m in messages.get_messages(request) if not found.is_terminal or UNTIL_RUN_ENDS not in m.tags]
    return render(
        request,
        "dashboard/run.html",
        {
            "run": found,
            "may_cancel": roles.may_cancel(request.user, found),
            "may_export": roles.allows(role, "export models"),
            "may_launch": roles.allows(role, "launch runs"),
            "may_annotate": roles.allows(role, roles.annotate_action(request.user, found)),
            "checkpoints": found.checkpoints.order_by("-step"),
            "children": found.children.order_by("pk"),
            "tags_text": " ".join(found.tag_names()),
            "config_json": json.dumps(found.config, indent=2),
            "overrides_json": json.dumps(found.overrides, indent=2),
            "charts": _charts(found),
            "messages": flashes,
        },
    )


@login_required
@require_POST
def cancel(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        found = actions.check_cancel(request.user, run_id)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        actions.do_cancel_run(request.user, found)
        messages.info(request, f"Cancelling run #{found.pk}.")
    return redirect("dashboard:run", run_id=run_id)


def _lineage_action(request: HttpRequest, run_id: int, check, do, done: str) -> HttpResponse:
    """A lineage POST from the run page (runs/lineage.py): on success, off to the new
    run; a refusal comes back to the run page as a message."""
    try:
        checked = check()
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    except ActionError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:run", run_id=run_id)
    child = do(*checked) if isinstance(checked, tuple) else do(checked)
    messages.success(request, done.format(child=child.pk, parent=run_id), extra_tags=UNTIL_RUN_ENDS)
    return redirect(child)


@login_required
@require_POST
def retry(request: HttpRequest, run_id: int) -> HttpResponse:
    return _lineage_action(
        request,
        run_id,
        lambda: lineage.check_retry(request.user, run_id),
        lambda parent: lineage.do_retry(request.user, parent),
        "Run #{child} queued: a retry of run #{parent}.",
    )


@login_required
@require_POST
def resume(request: HttpRequest, run_id: int) -> HttpResponse:
    return _lineage_action(
        request,
        run_id,
        lambda: lineage.check_resume(request.user, run_id, request.POST.get("step")),
        lambda parent, checkpoint: lineage.do_resume(request.user, parent, checkpoint),
        "Run #{child} queued: it resumes run #{parent} from its checkpoint.",
    )


@login_required
@require_POST
def annotate(request: HttpRequest, run_id: int) -> HttpResponse:
    try:
        found, notes, tags = lineage.check_annotate(
            request.user, run_id, notes=request.POST.get("notes"), tags=request.POST.get("tags")
        )
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    except ActionError as exc:
        messages.error(request, exc.message)
    else:
        lineage.do_annotate(request.user, found, notes, tags)
        messages.success(request, "Notes and tags saved.")
    return redirect("dashboard:run", run_id=run_id)
