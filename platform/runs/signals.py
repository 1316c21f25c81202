"""Access that ends while a WebSocket is open: a membership removed (by a team admin, the
admin site, or with its team or user) or an account deactivated is sent to the user's
sockets (runs/consumers.py), which stop at once instead of streaming until the page
reloads. Sent once the change is committed: a rolled-back removal closes nothing."""

from __future__ import annotations

from django.contrib.auth import get_user_model
from django.db import transaction
from django.db.models.signals import post_delete, post_save
from django.dispatch import receiver

from runs import events
from teams.models import Membership


@receiver(post_delete, sender=Membership, dispatch_uid="runs.revoke_membership")
def membership_removed(sender, instance: Membership, **kwargs) -> None:
    user_id, team_id = instance.user_id, instance.team_id
    transaction.on_commit(lambda: events.send_access_revoked(user_id, team_id))


@receiver(post_save, sender=get_user_model(), dispatch_uid="runs.revoke_inactive_user")
def user_saved(sender, instance, created: bool, **kwargs) -> None:
    if not created and not instance.is_active:
        user_id = instance.pk
        transaction.on_commit(lambda: events.send_access_revoked(user_id, None))
