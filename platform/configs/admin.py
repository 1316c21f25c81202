"""Saved configurations in the Django admin, beside the built-in presets (read-only).

A saved version is never changed in place (runs point at the version they ran), so
existing rows are view-only here; adding a row validates it as the API does and saves
it as the next version of its name. Staff who are not superusers see and add only
their own teams' configurations.
"""

from __future__ import annotations

from django import forms
from django.contrib import admin
from django.db.models import Max
from django.template.response import TemplateResponse
from django.urls import path

from configs.actions import builtin_presets
from configs.models import SavedConfig
from configs.policy import check_config
from foundation.errors import ActionError
from teams.admin import administered
from workers.config.presets import PRESETS


class SavedConfigForm(forms.ModelForm):
    base_preset = forms.ChoiceField(choices=[(name, name) for name in PRESETS])

    class Meta:
        model = SavedConfig
        fields = ["team", "name", "description", "base_preset", "overrides"]

    def clean(self):
        data = super().clean()
        base_preset, overrides = data.get("base_preset"), data.get("overrides")
        if data.get("name") in PRESETS:
            self.add_error("name", f"{data['name']!r} is a built-in preset's name; choose another")
        if base_preset and not isinstance(overrides, dict):
            self.add_error("overrides", 'must be a JSON object, e.g. {"buffer": {"capacity": 4}}')
        elif base_preset:
            try:
                _, errors = check_config(base_preset, overrides)
            except ActionError as exc:  # the Hugging Face Hub did not answer: say so on the form
                errors = exc.errors
            for field, message in errors.items():
                self.add_error("overrides", f"{field}: {message}")
        return data


@admin.register(SavedConfig)
class SavedConfigAdmin(admin.ModelAdmin):
    form = SavedConfigForm
    list_display = ["name", "version", "team", "base_preset", "created_by", "created_at"]
    list_filter = ["team", "base_preset"]
    search_fields = ["name", "description"]
    readonly_fields = ["version", "created_by", "created_at"]
    change_list_template = "admin/configs/savedconfig/change_list.html"

    def get_queryset(self, request):
        found = super().get_queryset(request).select_related("team", "created_by")
        return found if request.user.is_superuser else found.filter(team__in=administered(request.user))

    def formfield_for_foreignkey(self, db_field, request, **kwargs):
        if db_field.name == "team" and not request.user.is_superuser:
            kwargs["queryset"] = administered(request.user)
        return super().formfield_for_foreignkey(db_field, request, **kwargs)

    def has_change_permission(self, request, obj=None):
        # Existing versions are read-only: an edit is a new version (POST .../versions).
        return obj is None and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        obj.created_by = request.user
        same_name = SavedConfig.objects.filter(team=obj.team, name=obj.name)
        obj.version = (same_name.aggregate(n=Max("version"))["n"] or 0) + 1
        super().save_model(request, obj, form, change)

    def get_urls(self):
        presets = path("presets/", self.admin_site.admin_view(self.presets_view), name="configs_builtin_presets")
        return [presets, *super().get_urls()]

    def presets_view(self, request):
        """The built-in presets: code, listed here read-only beside the saved ones."""
        context = {
            **self.admin_site.each_context(request),
            "title": "Built-in presets (read-only)",
            "opts": self.model._meta,
            "presets": builtin_presets(),
        }
        return TemplateResponse(request, "admin/configs/presets.html", context)
