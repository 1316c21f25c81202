"""The team audit log: one `record` call per change a person makes, from the actions
layer, inside the change's own transaction."""

from __future__ import annotations

from teams.models import AuditEvent, Team

Action = AuditEvent.Action


def record(actor, team: Team, action: str, subject: str, **detail) -> AuditEvent:
    """Log that `actor` did `action` to `subject` in `team`; `detail` is kept as JSON."""
    return AuditEvent.objects.create(
        team=team,
        actor=actor if getattr(actor, "pk", None) else None,
        actor_name=getattr(actor, "get_username", lambda: "")() or "system",
        action=action,
        subject=subject[:200],
        detail=detail,
    )
