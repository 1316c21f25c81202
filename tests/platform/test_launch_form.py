"""The launch form's config controls: one per config field, generated from the config's
JSON schema; the presets' configs handed to launch.js as data; the server's errors
beside the control they concern; and the run's queue priority from the form."""

from __future__ import annotations

import copy
import json
import os
import shutil
import typing

import pytest
from django.contrib.staticfiles import finders
from django.test.html import Element, parse_html
from pydantic import BaseModel

from configs.models import SavedConfig
from dashboard import config_controls
from runs import queue
from runs.models import Run
from workers.config.presets import PRESETS
from workers.config.run_config import RunConfig, json_schema
from workers.rl_tasks import BUILTINS
from workers.rollout.shipped_data import DATA_DIR

URL = "/runs/new/"


def find_all(node, name: str | None = None, **attrs: str) -> list[Element]:
    """Every element under `node` named `name` whose attributes include `attrs` (an
    attribute given as "" need only be present; class matches one of the classes)."""
    found = []
    for child in getattr(node, "children", []):
        if not isinstance(child, Element):
            continue
        have = dict(child.attributes)
        ok = name in (None, child.name)
        for key, want in attrs.items():
            key = key.replace("_", "-").removesuffix("-")
            if key not in have:
                ok = False
            elif key == "class":
                ok = ok and want in (have[key] or "").split()
            elif want != "":
                ok = ok and have[key] == want
        if ok:
            found.append(child)
        found += find_all(child, name, **attrs)
    return found


def text(node) -> str:
    return " ".join(str(c) if not isinstance(c, Element) else text(c) for c in node.children)


def control(root, path: str) -> Element:
    (found,) = [c for c in find_all(root, "div", class_="control") if dict(c.attributes).get("data-path") == path]
    return found


def the_input(ctrl: Element) -> Element:
    (found,) = find_all(ctrl, "input") + find_all(ctrl, "select")
    return found


def leaves(model: type[BaseModel], prefix: str = "") -> set[str]:
    """The dotted path of every setting of `model`, sections walked into (also a section
    that may be None, as task.dataset)."""
    out = set()
    for name, field in model.model_fields.items():
        types = [t for t in (typing.get_args(field.annotation) or [field.annotation]) if t is not type(None)]
        if len(types) == 1 and isinstance(types[0], type) and issubclass(types[0], BaseModel):
            out |= leaves(types[0], f"{prefix}{name}.")
        else:
            out.add(prefix + name)
    return out


@pytest.fixture
def form_page(client_for, owner, experiment):
    def get(**query) -> Element:
        response = client_for(owner).get(URL, query)
        assert response.status_code == 200
        return parse_html(response.content.decode())

    return get


@pytest.fixture
def fresh_controls():
    """The controls are computed once per process: a test that changes the schema
    computes them again, before and after."""
    config_controls.config_controls.cache_clear()
    yield
    config_controls.config_controls.cache_clear()


# --- controls from the schema ------------------------------------------------------


def test_every_setting_but_the_warm_start_has_exactly_one_control(form_page):
    # task.options is an object, each task's own, and task.reward_weights a list of
    # numbers: edited in the overrides JSON.
    json_only = ("warm_start.", "task.options", "task.reward_weights")
    paths = [dict(c.attributes)["data-path"] for c in find_all(form_page(), "div", class_="control")]
    assert len(paths) == len(set(paths))
    assert set(paths) == {p for p in leaves(RunConfig) if not p.startswith(json_only)}


def test_the_axes_come_in_their_groups_in_order(form_page):
    groups = find_all(form_page(), "fieldset", class_="axis")
    titles = [text(find_all(g, "legend")[0]).strip() for g in groups]
    assert titles == [title for title, _ in config_controls.CONTROL_GROUPS]
    staleness = groups[titles.index("Staleness")]
    in_staleness = [dict(c.attributes)["data-path"] for c in find_all(staleness, "div", class_="control")]
    assert in_staleness == ["buffer.max_staleness", "buffer.on_stale", "buffer.max_head_offpolicyness"]


@pytest.mark.parametrize(
    ("path", "tag", "attrs", "options"),
    [
        ("mode", "select", {}, ["sync", "async"]),
        ("buffer.mode", "select", {}, ["none", "double", "bounded", "unbounded"]),
        ("sync.update_mode", "select", {}, ["drain", "abort_retry", "abort_resume", "in_flight"]),
        ("inference.backend", "select", {}, ["torch", "vllm"]),
        ("lora.enabled", "input", {"type": "checkbox"}, None),
        ("buffer.capacity", "input", {"type": "number", "min": "1", "step": "1"}, None),
        ("inference.gpu_memory_utilization", "input", {"type": "number", "max": "1", "step": "any"}, None),
        ("buffer.max_head_offpolicyness", "input", {"type": "number", "min": "0", "placeholder": "unset"}, None),
        ("task.alphabet", "input", {"type": "text"}, None),
        ("lora.target_modules", "input", {"type": "text"}, None),
    ],
)
def test_each_control_takes_its_kind_choices_and_bounds_from_the_schema(form_page, path, tag, attrs, options):
    ctrl = control(form_page(), path)
    el = the_input(ctrl)
    assert el.name == tag
    assert attrs.items() <= dict(el.attributes).items()
    assert "name" not in dict(el.attributes)  # only the overrides JSON is posted
    if options is not None:
        assert [dict(o.attributes)["value"] for o in find_all(el, "option")] == options


def test_an_exclusive_bound_is_said_in_words(form_page):
    ctrl = control(form_page(), "inference.gpu_memory_utilization")
    assert "min" not in dict(the_input(ctrl).attributes)  # HTML's min would allow 0
    assert "(> 0, ≤ 1)" in text(ctrl)


def test_a_setting_added_to_the_config_gets_a_control_in_its_sections_group(form_page, monkeypatch, fresh_controls):
    schema = copy.deepcopy(json_schema())
    schema["$defs"]["BufferConfig"]["properties"]["spill"] = {"type": "boolean", "description": "Spill to disk."}
    schema["$defs"]["StopConfig"]["properties"]["max_tokens"] = {"type": "integer", "minimum": 5, "maximum": 9}
    monkeypatch.setattr(config_controls, "json_schema", lambda: schema)

    page = form_page()
    staleness = find_all(page, "fieldset", id="axis-staleness")[0]
    spill = the_input(control(staleness, "buffer.spill"))
    assert spill.attributes == [("id", "cfg-buffer-spill"), ("type", "checkbox")]
    assert "Spill to disk." in text(control(staleness, "buffer.spill"))
    stop = find_all(page, "fieldset", id="axis-stop")[0]
    assert {"min": "5", "max": "9"}.items() <= dict(the_input(control(stop, "stop.max_tokens")).attributes).items()


def test_the_model_group_starts_with_where_the_policy_comes_from(form_page):
    (model,) = find_all(form_page(), "fieldset", id="axis-model")
    paths = [dict(c.attributes)["data-path"] for c in find_all(model, "div", class_="control")]
    assert paths[:3] == ["model.source", "model.path", "model.hub_id"]
    assert [dict(o.attributes)["value"] for o in find_all(the_input(control(model, "model.source")), "option")] == [
        "tiny",
        "path",
        "hub",
    ]
    assert dict(the_input(control(model, "model.path")).attributes)["type"] == "text"


def test_the_task_name_is_a_select_of_the_built_ins_or_any_other_name_typed(form_page):
    ctrl = control(form_page(), "task.name")
    assert dict(ctrl.attributes)["data-kind"] == "choice"
    (select,) = find_all(ctrl, "select", id="cfg-task-name")
    options = [(dict(o.attributes)["value"], text(o).strip()) for o in find_all(select, "option")]
    assert options == [(name, name) for name in BUILTINS] + [("", "other…")]
    (other,) = find_all(ctrl, "input", id="cfg-task-name-other")
    assert {"type": "text", "data-role": "other", "hidden": None}.items() <= dict(other.attributes).items()
    assert "name" not in dict(select.attributes) and "name" not in dict(other.attributes)


def test_the_datasets_fields_are_controls_in_the_task_group_with_their_defaults_shown(form_page):
    (task,) = find_all(form_page(), "fieldset", id="axis-task")
    paths = [dict(c.attributes)["data-path"] for c in find_all(task, "div", class_="control")]
    dataset = [
        "path", "subset", "split", "prompt_column", "answer_column", "eval_fraction", "eval_path", "eval_split",
        "split_seed",
    ]  # fmt: skip
    assert paths[: 1 + len(dataset)] == ["task.name"] + [f"task.dataset.{f}" for f in dataset]
    placeholders = {}
    for field in dataset:
        ctrl = control(task, f"task.dataset.{field}")
        # Every preset leaves the section unset: launch.js drops an emptied control.
        assert "data-optional" in dict(ctrl.attributes)
        placeholders[field] = dict(the_input(ctrl).attributes).get("placeholder")
    assert placeholders == {
        "path": "not set",
        "subset": "not set",
        "split": "default: train",
        "prompt_column": "default: prompt",
        "answer_column": "default: answer",
        "eval_fraction": "default: 0.1",
        "eval_path": "not set",
        "eval_split": "not set",
        "split_seed": "default: 0",
    }
    assert {"type": "number", "min": "0", "step": "any"}.items() <= dict(
        the_input(control(task, "task.dataset.eval_fraction")).attributes
    ).items()
    # Fields of sections every preset sets are not optional.
    assert "data-optional" not in dict(control(task, "task.name").attributes)


# --- data for the script -----------------------------------------------------------


def test_the_script_gets_every_presets_and_configurations_full_config(form_page, team, owner):
    saved = SavedConfig.objects.create(
        team=team, name="wide", base_preset="sync", overrides={"buffer": {"capacity": 5}}, created_by=owner
    )
    (data,) = find_all(form_page(), "script", id="preset-configs")
    configs = json.loads(text(data))
    for name, preset in PRESETS.items():
        assert configs[name] == preset["config"].model_dump(mode="json")
    assert configs[f"saved:{saved.pk}"]["buffer"]["capacity"] == 5
    assert configs[f"saved:{saved.pk}"]["mode"] == PRESETS["sync"]["config"].mode


def test_a_built_in_preset_says_where_its_peer_scores_rewards_and_a_saved_one_does_not(form_page, team, owner):
    saved = SavedConfig.objects.create(team=team, name="oat-like", base_preset="oat", overrides={}, created_by=owner)
    shown = {
        dict(p.attributes)["data-preset"]: p for p in find_all(form_page(preset="oat"), "p", class_="preset-rewards")
    }
    # Not f"saved:{saved.pk}": a saved configuration's overrides may change rewards.*.
    assert set(shown) == set(PRESETS) and f"saved:{saved.pk}" not in shown
    assert PRESETS["oat"]["rewards_where"] in text(shown["oat"])
    assert "hidden" not in dict(shown["oat"].attributes)
    assert all("hidden" in dict(p.attributes) for name, p in shown.items() if name != "oat")


def test_the_page_has_no_inline_script(client_for, owner):
    page = parse_html(client_for(owner).get(URL).content.decode())
    scripts = find_all(page, "script")
    inline = [dict(s.attributes) for s in scripts if "src" not in dict(s.attributes)]
    assert inline == [{"id": "preset-configs", "type": "application/json"}]  # data only, no code
    assert "/static/rollway/launch.js" in [dict(s.attributes).get("src") for s in scripts]
    assert finders.find("rollway/launch.js") and finders.find("rollway/launch.css")


# --- errors beside their control ----------------------------------------------------


def test_config_errors_show_beside_their_control_and_the_others_beside_the_json(client_for, owner, experiment):
    overrides = {"buffer": {"capacity": 0, "capcity": 3}, "model": {"hidden_size": 66}}
    form = {"experiment": experiment.pk, "preset": "async", "overrides": json.dumps(overrides)}
    r = client_for(owner).post(URL, form)
    assert r.status_code == 400
    page = parse_html(r.content.decode())

    capacity = control(page, "buffer.capacity")
    assert "has-error" in dict(capacity.attributes)["class"].split()
    (error,) = find_all(capacity, "p", class_="field-error")
    assert dict(error.attributes)["data-field"] == "buffer.capacity"
    assert "greater than or equal to 1" in text(error)

    (listed,) = find_all(page, "ul", id="config-errors")
    fields = [dict(li.attributes)["data-field"] for li in find_all(listed, "li")]
    assert fields == ["buffer.capcity", "model"]  # no control shows these
    assert find_all(control(page, "model.hidden_size"), "p", class_="field-error") == []
    assert not Run.objects.exists()


@pytest.fixture
def roots(settings, tmp_path):
    """A model root and a data root holding the shipped countdown file; a copy of it, and
    a directory, outside them."""
    models, data, outside = tmp_path / "models", tmp_path / "data", tmp_path / "outside"
    for d in (models, data, outside):
        d.mkdir()
    for d in (data, outside):
        shutil.copy(os.path.join(DATA_DIR, "countdown.jsonl"), d / "countdown.jsonl")
    settings.ROLLWAY_MODEL_ROOTS = [str(models)]
    settings.ROLLWAY_DATA_ROOTS = [str(data)]
    settings.ROLLWAY_SCRATCH_DIR = str(tmp_path / "scratch")
    return {"models": models, "data": data, "outside": outside}


def test_paths_outside_the_allowed_roots_are_refused_beside_the_model_and_dataset_controls(
    client_for, owner, experiment, roots
):
    overrides = {
        "model": {"source": "path", "path": str(roots["outside"])},
        "task": {"name": "countdown", "dataset": {"path": str(roots["outside"] / "countdown.jsonl")}},
        "inference": {"max_new_tokens": 13},
    }
    form = {"experiment": experiment.pk, "preset": "sync", "overrides": json.dumps(overrides)}
    r = client_for(owner).post(URL, form)
    assert r.status_code == 400
    page = parse_html(r.content.decode())
    for path, root_setting in [("model.path", "ROLLWAY_MODEL_ROOTS"), ("task.dataset.path", "ROLLWAY_DATA_ROOTS")]:
        ctrl = control(page, path)
        assert "has-error" in dict(ctrl.attributes)["class"].split()
        (error,) = find_all(ctrl, "p", class_="field-error")
        assert "outside the allowed roots" in text(error) and root_setting in text(error), text(error)
    assert find_all(page, "ul", id="config-errors") == []  # nothing left without a control
    assert not Run.objects.exists()


def test_a_missing_column_is_refused_beside_its_control(client_for, owner, experiment, roots):
    dataset = {"path": str(roots["data"] / "countdown.jsonl"), "answer_column": "solution_text"}
    overrides = {"task": {"name": "countdown", "dataset": dataset}, "inference": {"max_new_tokens": 13}}
    r = client_for(owner).post(URL, {"experiment": experiment.pk, "preset": "sync", "overrides": json.dumps(overrides)})
    assert r.status_code == 400
    (error,) = find_all(
        control(parse_html(r.content.decode()), "task.dataset.answer_column"), "p", class_="field-error"
    )
    assert "no column 'solution_text'" in text(error)


def test_a_launched_checkpoint_shows_the_settings_its_size_would_want_on_its_page(
    client_for, owner, experiment, roots, monkeypatch, enqueued
):
    """The form's launch of a checkpoint keeps the config it was given and says on the
    run's page which settings do not suit the model (its size counted from its config;
    the tiny checkpoint here counts as a large one)."""
    from workers.model import fitting
    from workers.model.tiny_hf import make_tiny_checkpoint

    monkeypatch.setattr(fitting, "SMALLEST", 1)
    path = make_tiny_checkpoint(str(roots["models"] / "qwen"))
    form = {
        "experiment": experiment.pk,
        "preset": "async",
        "overrides": json.dumps({"model": {"source": "path", "path": path}}),
    }
    client = client_for(owner)
    r = client.post(URL, form)
    assert r.status_code == 302, r.content[-2000:]
    run = Run.objects.get()
    assert run.run_config.trainer.lr == 1e-3  # kept as given
    warnings = [
        text(li) for li in find_all(parse_html(client.get(r["Location"]).content.decode()), "li", class_="warning")
    ]
    assert any(w.startswith("trainer.lr is 0.001; 1e-06 suits this model") for w in warnings), warnings


def test_a_launch_setting_what_its_run_will_not_read_is_warned_on_its_page(client_for, owner, experiment):
    form = {"experiment": experiment.pk, "preset": "async", "overrides": json.dumps({"sync": {"packed": False}})}
    client = client_for(owner)
    r = client.post(URL, form)
    assert r.status_code == 302, r.content[-2000:]
    assert Run.objects.get().run_config.sync.packed is False  # queued as given
    warnings = [
        text(li) for li in find_all(parse_html(client.get(r["Location"]).content.decode()), "li", class_="warning")
    ]
    assert any(w.startswith("sync.packed is read only by a collective") for w in warnings), warnings


# --- priority ------------------------------------------------------------------------


def test_the_forms_priority_reaches_the_run_and_the_queue_schedules_it_first(
    client_for, owner, experiment, driver, settings, django_capture_on_commit_callbacks
):
    settings.ROLLWAY_MAX_RUNNING = 1
    client = client_for(owner)
    for name, priority in [("first come", "0"), ("urgent", "3"), ("later", "")]:
        r = client.post(URL, {"experiment": experiment.pk, "preset": "sync", "name": name, "priority": priority})
        assert r.status_code == 302, r.content
    runs = {run.name: run for run in Run.objects.all()}
    assert {name: run.priority for name, run in runs.items()} == {"first come": 0, "urgent": 3, "later": 0}

    with django_capture_on_commit_callbacks(execute=True):
        scheduled = queue.do_schedule_queue()
    assert scheduled == [runs["urgent"].pk]


def test_the_form_shows_its_priority_field_with_the_range(form_page):
    (field,) = find_all(form_page(), "input", id="id_priority")
    assert {"name": "priority", "type": "number", "min": "-10", "max": "10", "value": "0"}.items() <= dict(
        field.attributes
    ).items()


@pytest.mark.parametrize("priority", ["11", "-11", "high", "1.5"])
def test_the_form_refuses_a_bad_priority_beside_the_field(client_for, owner, experiment, priority):
    r = client_for(owner).post(URL, {"experiment": experiment.pk, "preset": "async", "priority": priority})
    assert r.status_code == 400
    page = parse_html(r.content.decode())
    (error,) = find_all(page, "p", data_field="priority")
    assert "from -10 to 10" in text(error)
    assert dict(find_all(page, "input", id="id_priority")[0].attributes)["value"] == priority  # kept
    assert not Run.objects.exists()


def test_the_run_list_and_the_run_page_show_a_priority_other_than_0(client_for, owner, make_run):
    urgent, plain = make_run(name="urgent", priority=3), make_run(name="plain")
    client = client_for(owner)
    for url in ("/", urgent.get_absolute_url()):
        shown = find_all(parse_html(client.get(url).content.decode()), "span", data_role="priority")
        assert [text(s).strip() for s in shown] == ["priority +3"]
    assert (
        find_all(parse_html(client.get(plain.get_absolute_url()).content.decode()), "span", data_role="priority") == []
    )
