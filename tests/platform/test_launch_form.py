"""The launch form's config controls: one per config field, generated from the config's
JSON schema; the presets' configs handed to launch.js as data; the server's errors
beside the control they concern; and the run's queue priority from the form."""

from __future__ import annotations

import copy
import json

import pytest
from django.contrib.staticfiles import finders
from django.test.html import Element, parse_html
from pydantic import BaseModel

from configs.models import SavedConfig
from dashboard import views
from runs import queue
from runs.models import Run
from workers.config import RunConfig, json_schema
from workers.presets import PRESETS

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
    """The dotted path of every setting of `model`, sections walked into."""
    out = set()
    for name, field in model.model_fields.items():
        if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel):
            out |= leaves(field.annotation, f"{prefix}{name}.")
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
    views.config_controls.cache_clear()
    yield
    views.config_controls.cache_clear()


# --- controls from the schema ------------------------------------------------------


def test_every_setting_but_the_warm_start_has_exactly_one_control(form_page):
    # task.options and task.dataset are objects, edited in the overrides JSON.
    json_only = ("warm_start.", "task.options", "task.dataset")
    paths = [dict(c.attributes)["data-path"] for c in find_all(form_page(), "div", class_="control")]
    assert len(paths) == len(set(paths))
    assert set(paths) == {p for p in leaves(RunConfig) if not p.startswith(json_only)}


def test_the_axes_come_in_their_groups_in_order(form_page):
    groups = find_all(form_page(), "fieldset", class_="axis")
    titles = [text(find_all(g, "legend")[0]).strip() for g in groups]
    assert titles == [title for title, _ in views.CONTROL_GROUPS]
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
    monkeypatch.setattr(views, "json_schema", lambda: schema)

    page = form_page()
    staleness = find_all(page, "fieldset", id="axis-staleness")[0]
    spill = the_input(control(staleness, "buffer.spill"))
    assert spill.attributes == [("id", "cfg-buffer-spill"), ("type", "checkbox")]
    assert "Spill to disk." in text(control(staleness, "buffer.spill"))
    stop = find_all(page, "fieldset", id="axis-stop")[0]
    assert {"min": "5", "max": "9"}.items() <= dict(the_input(control(stop, "stop.max_tokens")).attributes).items()


def test_a_setting_no_control_can_show_is_named_when_the_controls_are_built(monkeypatch, fresh_controls):
    schema = copy.deepcopy(json_schema())
    schema["$defs"]["LoRAConfig"]["properties"]["scales"] = {"type": "object"}
    monkeypatch.setattr(views, "json_schema", lambda: schema)
    with pytest.raises(ValueError, match="lora.scales"):
        views.config_controls()


def test_a_group_naming_a_setting_the_config_lacks_is_refused(monkeypatch, fresh_controls):
    monkeypatch.setattr(views, "CONTROL_GROUPS", [("Buffer", ["buffer.capacty"])])
    with pytest.raises(KeyError, match="buffer.capacty"):
        views.config_controls()


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


# --- priority ------------------------------------------------------------------------


def test_the_forms_priority_reaches_the_run_and_the_queue_admits_it_first(
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
        admitted = queue.do_schedule_queue()
    assert admitted == [runs["urgent"].pk]


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
