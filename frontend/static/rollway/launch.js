// The launch form: one control per config field (rendered by the server from the
// config's JSON schema) and the overrides JSON, kept in step. The JSON box is what the
// form sends, so the server validates one thing; the controls are a view of the chosen
// preset's config with the overrides merged on top.
//
// - Editing a control writes that path into the overrides, or removes it when the value
//   equals the preset's, so the JSON holds only what differs.
// - Editing the JSON moves the controls; while it does not parse they are paused.
// - Choosing another preset re-bases the controls on its config and keeps the overrides.
// - A control emptied where the preset has no value (a field of task.dataset, a section
//   every preset leaves unset; "other" with nothing typed) leaves the overrides: an
//   empty string would only be refused, and the section's defaults apply without it.
"use strict";

(function () {
  var configs = JSON.parse(document.getElementById("preset-configs").textContent);
  var preset = document.getElementById("id_preset");
  var textarea = document.getElementById("id_overrides");
  var panel = document.getElementById("config-controls");
  var paused = document.getElementById("controls-paused");
  var controls = Array.prototype.slice.call(panel.querySelectorAll(".control[data-path]"));
  var overrides = {};

  function isObject(value) {
    return value !== null && typeof value === "object" && !Array.isArray(value);
  }

  // {found, value} at a dotted path of a nested object.
  function lookup(obj, path) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length; i++) {
      if (!isObject(obj) || !Object.prototype.hasOwnProperty.call(obj, parts[i])) return { found: false };
      obj = obj[parts[i]];
    }
    return { found: true, value: obj };
  }

  function assign(obj, path, value) {
    var parts = path.split(".");
    for (var i = 0; i < parts.length - 1; i++) {
      if (!isObject(obj[parts[i]])) obj[parts[i]] = {};
      obj = obj[parts[i]];
    }
    obj[parts[parts.length - 1]] = value;
  }

  // Remove the path, and the sections it leaves empty: {"buffer": {}} would override nothing.
  function remove(obj, path) {
    var parts = path.split(".");
    var chain = [obj];
    for (var i = 0; i < parts.length - 1; i++) {
      obj = obj[parts[i]];
      if (!isObject(obj)) return;
      chain.push(obj);
    }
    delete obj[parts[parts.length - 1]];
    for (var j = chain.length - 1; j > 0; j--) {
      if (Object.keys(chain[j]).length) break;
      delete chain[j - 1][parts[j - 1]];
    }
  }

  function same(a, b) {
    return JSON.stringify(a) === JSON.stringify(b);
  }

  function base() {
    return configs[preset.value] || {};
  }

  function input(control) {
    return control.querySelector("input, select");
  }

  // A "choice" control: a select of the usual values whose "other" option (value "")
  // shows a text box for anything else.
  function other(control) {
    return control.querySelector("[data-role=other]");
  }

  function empty(value) {
    return value === null || value === undefined || value === "";
  }

  // The value a control stands for, in the config's JSON types. An empty field of a
  // nullable setting is null (unset); an empty number that may not be null is sent as
  // null too, so the server names the field instead of the form guessing a value.
  function read(control) {
    var el = input(control);
    var kind = control.dataset.kind;
    var nullable = control.hasAttribute("data-nullable");
    if (kind === "checkbox") return el.checked;
    if (kind === "choice") return el.value !== "" ? el.value : other(control).value.trim();
    if (kind === "integer" || kind === "number") {
      if (el.value === "") return null;
      return Number(el.value);
    }
    if (kind === "list") {
      return el.value.split(",").map(function (s) { return s.trim(); }).filter(function (s) { return s; });
    }
    if (el.value === "" && nullable) return null;
    return el.value;
  }

  function write(control, value) {
    var el = input(control);
    var kind = control.dataset.kind;
    if (kind === "checkbox") el.checked = value === true;
    else if (kind === "choice") {
      var known = !empty(value) && Array.prototype.some.call(el.options, function (o) {
        return o.value === value;
      });
      el.value = known ? value : "";
      other(control).value = known || empty(value) ? "" : String(value);
      other(control).hidden = known;
    } else if (kind === "list") el.value = Array.isArray(value) ? value.join(", ") : "";
    else el.value = value === null || value === undefined ? "" : String(value);
  }

  function shown(value) {
    if (value === null || value === undefined) return "unset";
    return Array.isArray(value) ? value.join(", ") : String(value);
  }

  // Every control shows the override if there is one, else the preset's value; one whose
  // value differs from the preset's is marked "changed". `editing` is the control the user
  // is typing in: rewriting it would move the caret or eat a half-typed "1.".
  function render(editing) {
    var from = base();
    controls.forEach(function (control) {
      var path = control.dataset.path;
      var preset_ = lookup(from, path);
      var override = lookup(overrides, path);
      var value = override.found ? override.value : preset_.value;
      if (control !== editing) write(control, value);
      var changed = override.found && !same(override.value, preset_.value);
      control.classList.toggle("changed", changed);
      control.querySelector("[data-role=changed]").hidden = !changed;
      control.querySelector("[data-role=preset]").hidden = !changed;
      control.querySelector("[data-role=preset-value]").textContent = shown(preset_.value);
      control.querySelector("[data-role=reset]").hidden = !override.found;
    });
  }

  function writeJSON() {
    textarea.value = Object.keys(overrides).length ? JSON.stringify(overrides, null, 2) : "{}";
  }

  // Read the JSON box; false (and the controls paused) while it is not a JSON object.
  function readJSON() {
    var text = textarea.value.trim();
    var parsed;
    try {
      parsed = text ? JSON.parse(text) : {};
    } catch (e) {
      parsed = undefined;
    }
    var ok = isObject(parsed);
    panel.disabled = !ok;
    paused.hidden = ok;
    if (ok) overrides = parsed;
    return ok;
  }

  function onControl(event) {
    var control = event.target.closest(".control[data-path]");
    if (!control || panel.disabled) return;
    var path = control.dataset.path;
    var value = read(control);
    var preset_ = lookup(base(), path);
    var choosing = control.dataset.kind === "choice" && input(control).value === "";
    if (choosing) other(control).hidden = false; // "other" picked: its box, empty until typed in
    if (preset_.found && same(value, preset_.value)) remove(overrides, path);
    else if (empty(value) && (choosing || control.hasAttribute("data-optional"))) remove(overrides, path);
    else assign(overrides, path, value);
    writeJSON();
    // Not rewritten: the control being typed in, and a choice left on "other" while
    // its box is empty (rewriting would snap the select back to the preset's value).
    render(event.type === "input" || (choosing && empty(value)) ? control : null);
  }

  panel.addEventListener("input", onControl);
  panel.addEventListener("change", onControl);
  panel.addEventListener("click", function (event) {
    var reset = event.target.closest("[data-role=reset]");
    if (!reset) return;
    remove(overrides, reset.closest(".control[data-path]").dataset.path);
    writeJSON();
    render(null);
  });
  textarea.addEventListener("input", function () {
    if (readJSON()) render(null);
  });
  preset.addEventListener("change", function () {
    // The selected preset's description and full config.
    document.querySelectorAll("[data-preset]").forEach(function (el) {
      el.hidden = el.dataset.preset !== preset.value;
    });
    render(null);
  });

  readJSON();
  render(null);
  panel.hidden = false;
})();
