"""HTML pages: the runs list, the launch form and a run's live page.

Thin views: access and validation are the actions layer's, what a page shows is
dashboard/pages.py's and the launch form dashboard/forms.py's; live data arrives in the
browser over WebSockets (runs/consumers.py) and the JSON API (api/views.py).
"""

from __future__ import annotations

from collections.abc import Callable

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from configs import policy
from configs.models import SavedConfig
from dashboard import pages
from dashboard.forms import SAVED_PREFIX, LaunchForm
from dashboard.pages import UNTIL_RUN_ENDS
from foundation.errors import ActionError, NotFound
from runs import actions, lineage, simulation
from runs.models import Run

NO_SUCH_RUN = "No such run in your teams."


@login_required
def runs(request: HttpRequest) -> HttpResponse:
    context, status = pages.run_list(request)
    return render(request, "dashboard/runs.html", context, status=status)


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


@login_required
@require_http_methods(["GET", "POST"])
def launch(request: HttpRequest) -> HttpResponse:
    """The launch form: on any error nothing is created and the form comes back with
    each message next to its field (config fields beside their control)."""
    try:
        form = LaunchForm(request)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    done = form.submit() if request.method == "POST" else None
    if isinstance(done, SavedConfig):
        messages.success(request, f"Saved configuration {done.label} in team {done.team.name}.")
        return redirect(f"{reverse('dashboard:launch')}?preset={SAVED_PREFIX}{done.pk}")
    if isinstance(done, Run) and done.simulated and "plan" in done.simulation:
        plan = done.simulation["plan"]
        messages.success(
            request,
            f"Run #{done.pk} simulated: the best of {plan['searched']} settings; "
            f"the config as given is run #{plan['baseline_run']}.",
        )
        return redirect(done)
    if isinstance(done, Run) and done.simulated:
        messages.success(request, f"Run #{done.pk} simulated.")
        return redirect(done)
    if isinstance(done, Run):
        messages.success(request, f"Run #{done.pk} queued.", extra_tags=UNTIL_RUN_ENDS)
        for fit in policy.settings_that_fit(done.run_config):  # what its checkpoint's size would want
            messages.warning(
                request, f"{fit['field']} is {fit['current']}; {fit['suggested']} suits this model: {fit['why']}."
            )
        for unread in policy.unread_settings(done.run_config):  # set, but nothing in this run reads it
            messages.warning(request, f"{unread['message']}.")
        return redirect(done)
    return render(request, "dashboard/launch.html", form.context(), status=form.status)


def _visible_run(request: HttpRequest, run_id: int) -> Run:
    """The run if the user may see it; a 404 page otherwise (never saying which)."""
    try:
        return actions.check_run_access(request.user, run_id)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None


@login_required
def run(request: HttpRequest, run_id: int) -> HttpResponse:
    return render(request, "dashboard/run.html", pages.run_page(request, _visible_run(request, run_id)))


@login_required
def run_log(request: HttpRequest, run_id: int) -> HttpResponse:
    """The end of the run's driver log, with a download of the whole file."""
    context, status = pages.run_log_page(_visible_run(request, run_id))
    return render(request, "dashboard/run_log.html", context, status=status)


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


def _lineage_action(request: HttpRequest, run_id: int, check: Callable, do: Callable, done: str) -> HttpResponse:
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
def replay(request: HttpRequest, run_id: int) -> HttpResponse:
    return _lineage_action(
        request,
        run_id,
        lambda: lineage.check_replay(request.user, run_id),
        lambda parent: lineage.do_replay(request.user, parent),
        "Run #{child} queued: a replay of run #{parent}, under its recorded schedule.",
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
def plan_row(request: HttpRequest, run_id: int, row: int) -> HttpResponse:
    """A row of a planned run's table, simulated (or its run, where it was before); off
    to that run, or back to the planned run with the refusal."""
    try:
        checked = simulation.check_plan_row(request.user, run_id, row)
    except NotFound:
        raise Http404(NO_SUCH_RUN) from None
    except ActionError as exc:
        messages.error(request, exc.message)
        return redirect("dashboard:run", run_id=run_id)
    done, new = simulation.do_simulate_plan_row(request.user, *checked)
    said = "simulated" if new else "simulated before"
    messages.success(request, f"Row {row} of run #{run_id}'s plan, {said}: run #{done.pk}.")
    return redirect(done)


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
