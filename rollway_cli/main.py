"""The `rollway` commands. Each one talks to the site's JSON API only (client.py) and
ends with an exit code from errors.py; a refused request prints the site's messages by
field, never a traceback."""

from __future__ import annotations

import json
import re
import sys
import tempfile
from pathlib import Path
from typing import Any
from urllib.parse import quote

import click
import httpx
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TransferSpeedColumn
from rich.table import Table

from rollway_cli import archive, credentials, errors
from rollway_cli.client import Api
from rollway_cli.compare import compare as compare_runs
from rollway_cli.errors import CliError
from rollway_cli.follow import watch
from rollway_cli.followview import View, duration, number
from rollway_cli.launchfile import launch_body

# A run as an id, "#12", or its page's URL (…/runs/12/), as a person copies it.
RUN_REF = re.compile(r"#?(\d+)|.*/runs/(\d+)/?")


class RunRef(click.ParamType):
    name = "RUN"

    def convert(self, value, param, ctx) -> int:
        if isinstance(value, int):
            return value
        match = RUN_REF.fullmatch(str(value).strip())
        if not match:
            self.fail(f"{value!r} is not a run: give its id (12) or its page's URL", param, ctx)
        return int(match.group(1) or match.group(2))


RUN = RunRef()


# Piped output has no width to fit: rich's default 80 columns would cut names short.
PIPE_WIDTH = 240


def stdout() -> Console:
    # Made per call: tests and pipes swap sys.stdout, and rich must write to the current one.
    console = Console(file=sys.stdout, highlight=False, soft_wrap=True)
    if not console.is_terminal:
        console.width = PIPE_WIDTH
    return console


def print_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2))


def site_options(command):
    """--url and --token on every command that talks to the site."""
    command = click.option(
        "--token", envvar="ROLLWAY_TOKEN", help="Personal API token (rwp_…); default: ROLLWAY_TOKEN or the login."
    )(command)
    return click.option("--url", envvar="ROLLWAY_URL", help="The site, e.g. https://rollway.example.org.")(command)


def connect(url: str | None, token: str | None) -> Api:
    return Api(credentials.resolve(url, token))


@click.group(context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="rollway", prog_name="rollway")
def cli() -> None:
    """Rollway from the command line: launch, follow, compare and export RL runs, read their logs.

    \b
    Exit codes:
      0  done (follow: the run succeeded)
      1  follow: the run failed or was lost; cancel: some runs were refused
      2  bad request: the site's messages by field, or a wrong command line
      3  follow: the run was cancelled
      4  not allowed: no token, unknown/revoked token (401), role too low (403)
      5  not found (404)
      6  conflict (409), e.g. export before the run finished
      7  the site cannot be reached or did not answer as a Rollway site"""


# --- login ----------------------------------------------------------------------------


@cli.command()
@click.option("--url", envvar="ROLLWAY_URL", help="The site, e.g. http://127.0.0.1:8000.")
@click.option("--token", envvar="ROLLWAY_TOKEN", help="A personal API token made on the site's /teams/ page.")
def login(url: str | None, token: str | None) -> int:
    """Check a site URL and API token, then keep them for the next commands."""
    saved = credentials.stored()
    if not url:
        url = click.prompt("Site URL", default=saved.url or "http://127.0.0.1:8000")
    if not token:
        token = click.prompt("API token (made on the site's /teams/ page)", hide_input=True)
    url, token = credentials.normalize_url(url), token.strip()
    with Api(credentials.Credentials(url, token)) as api:
        teams = api.get("/api/teams")["teams"]
    path = credentials.save(url, token)
    for team in teams:
        click.echo(f"logged in to {url}: team {team['slug']} ({team['name']}) as {team['role']}")
    click.echo(f"saved to {path}")
    return errors.OK


@cli.command()
def logout() -> int:
    """Forget the saved URL and token (the token stays valid: revoke it on the site)."""
    path = credentials.remove()
    click.echo(f"removed {path}" if path else f"no saved credentials at {credentials.credentials_path()}")
    return errors.OK


# --- launch ---------------------------------------------------------------------------


def resolve_experiment(api: Api, experiment: str, team: str | None) -> int:
    """An experiment id from an id or a name (in `team` when given)."""
    if experiment.isdigit():
        return int(experiment)
    found = [
        e["id"]
        for t in api.get("/api/teams")["teams"]
        if team in (None, str(t["id"]), t["slug"])
        for e in t["experiments"]
        if e["name"] == experiment
    ]
    if len(found) != 1:
        where = f" in team {team}" if team else ""
        why = "no experiment" if not found else "several experiments (pass --team or the id)"
        raise CliError(f"experiment: {why} named {experiment!r}{where}", errors.BAD_REQUEST)
    return found[0]


@cli.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--preset", help="A built-in preset (GET /api/presets), e.g. async.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="A config override, e.g. stop.max_steps=20.")
@click.option("--team", help="Team id or slug (its default experiment unless --experiment).")
@click.option("--experiment", help="Experiment id or name.")
@click.option("--name", help="The run's name.")
@click.option("--priority", type=int, help="Queue priority, -10..10 (higher starts first).")
@click.option(
    "--trackers",
    metavar="KEYS",
    help="Experiment trackers to export the run to, comma-separated (mlflow, tensorboard, wandb); '' for none. "
    "Default: every tracker the site has.",
)
@click.option("--follow", is_flag=True, help="Then follow it to the end (exit code as `rollway follow`).")
@click.option("--json", "as_json", is_flag=True, help="Print the created run as JSON.")
@site_options
def launch(file, preset, sets, team, experiment, name, priority, trackers, follow, as_json, url, token) -> int:
    """Launch a run from a YAML FILE (launch fields and/or config overrides) and options."""
    with connect(url, token) as api:
        if experiment is not None:
            experiment = resolve_experiment(api, experiment, team)
        body = launch_body(
            file,
            list(sets),
            preset=preset,
            team=team,
            experiment=experiment,
            name=name,
            priority=priority,
            trackers=trackers,
        )
        run = api.post("/api/runs", body)
        if as_json and not follow:
            print_json(run)
        else:
            click.echo(f"run {run['id']} {run['status']}: {run['name']}")
            click.echo(api.page_url(run["url"]))
            for fit in run.get("fitting") or []:  # settings its checkpoint's size would want
                click.echo(f"  {fit['field']} {fit['current']} → {fit['suggested']}: {fit['why']}")
            for unread in run.get("unread") or []:  # settings nothing in this run reads
                click.echo(f"  warning: {unread['message']}")
        if follow:
            return follow_run(api, run["id"], as_json=as_json)
    return errors.OK


def simulate_body(file, sets, cluster: dict, workload: dict, **given) -> dict:
    """The POST /api/simulations body: a launch's, with the file's `cluster:` and
    `workload:` mappings under the command's options (None: not given)."""
    body = launch_body(file, list(sets), simulation=True, **given)
    for key, options in (("cluster", cluster), ("workload", workload)):
        from_file = body.get(key) or {}
        if not isinstance(from_file, dict):
            raise CliError(f"{file}: {key} must be a mapping (gpus: 64, …)", errors.BAD_REQUEST)
        merged = from_file | {k: v for k, v in options.items() if v is not None}
        if merged:
            body[key] = merged
    return body


@cli.command()
@click.argument("file", required=False, type=click.Path(dir_okay=False, path_type=Path))
@click.option("--gpus", type=int, help="GPUs of the simulated cluster (or cluster.gpus in FILE).")
@click.option("--gpu", help="GPU kind: H100 (the default).")
@click.option("--model", help="7B, 32B, or a Hugging Face model path whose config gives the shape.")
@click.option("--inference-share", type=float, help="Share of the GPUs that generate, 0..1 (default 0.5).")
@click.option("--tp", type=int, help="GPUs per inference worker (tensor parallel; default 1).")
@click.option("--link", help="Link between nodes: InfiniBand (default), Ethernet or NVLink.")
@click.option("--median-tokens", type=int, help="Median completion length (default 2048).")
@click.option("--p90-tokens", type=int, help="90th-percentile completion length (default: the median).")
@click.option("--max-tokens", type=int, help="Completion cut (default 32768).")
@click.option("--prompt-tokens", type=int, help="Tokens per prompt (default 512).")
@click.option("--steps", type=int, help="Trainer steps to simulate (default: the config's stop.max_steps).")
@click.option(
    "--plan",
    is_flag=True,
    help="Search the GPU split, staleness bound, buffer depth and sync protocol; store the best and the run as given.",
)
@click.option("--goal-samples", type=int, help="With --plan: rank by the time to train this many samples.")
@click.option("--preset", help="A built-in preset (GET /api/presets), e.g. async.")
@click.option("--set", "sets", multiple=True, metavar="FIELD=VALUE", help="A config override, e.g. buffer.capacity=8.")
@click.option("--team", help="Team id or slug (its default experiment unless --experiment).")
@click.option("--experiment", help="Experiment id or name.")
@click.option("--name", help="The run's name.")
@click.option("--json", "as_json", is_flag=True, help="Print the simulated run as JSON.")
@site_options
def simulate(
    file,
    gpus,
    gpu,
    model,
    inference_share,
    tp,
    link,
    median_tokens,
    p90_tokens,
    max_tokens,
    prompt_tokens,
    steps,
    plan,
    goal_samples,
    preset,
    sets,
    team,
    experiment,
    name,
    as_json,
    url,
    token,
) -> int:
    """Simulate a run (a launch's FILE and options) on a described cluster and workload:
    stored as a finished run marked simulated, charted as any run. With --plan, search
    the settings the simulator can change and store the best one's run beside the
    config as given."""
    if goal_samples is not None and not plan:
        raise CliError("--goal-samples: only with --plan (it ranks the settings a plan tries)", errors.BAD_REQUEST)
    cluster = {"gpus": gpus, "gpu": gpu, "model": model, "inference_share": inference_share, "tp": tp, "link": link}
    workload = {
        "median_tokens": median_tokens,
        "p90_tokens": p90_tokens,
        "max_tokens": max_tokens,
        "prompt_tokens": prompt_tokens,
    }
    with connect(url, token) as api:
        if experiment is not None:
            experiment = resolve_experiment(api, experiment, team)
        body = simulate_body(
            file, sets, cluster, workload, preset=preset, team=team, experiment=experiment, name=name, steps=steps
        )
        if plan:
            return print_plan(api, api.post("/api/simulations/plan", body | {"goal_samples": goal_samples}), as_json)
        run = api.post("/api/simulations", body)
        if as_json:
            print_json(run)
            return errors.OK
        summary = run["simulation"]["summary"]
        click.echo(f"run {run['id']} simulated: {run['name']}")
        click.echo(
            f"{summary['steps']:.0f} steps in {summary['seconds']:.0f} simulated s: "
            f"{summary['samples_per_s']:.2f} samples/s, trainer busy {summary['trainer_busy']:.0%}, "
            f"inference busy {summary['inference_busy']:.0%}, staleness max {summary['staleness_max']:.0f}"
        )
        click.echo(api.page_url(run["url"]))
    return errors.OK


def print_plan(api: Api, answer: dict, as_json: bool) -> int:
    """The plan's best run, how it compares with the config as given, and its top
    settings; or the whole answer as JSON."""
    if as_json:
        print_json(answer)
        return errors.OK
    plan, baseline = answer["simulation"]["plan"], answer["baseline"]
    best, given = answer["simulation"]["summary"], baseline["simulation"]["summary"]
    click.echo(f"run {answer['id']} planned: {answer['name']}, the best of {plan['searched']} settings")
    click.echo(
        f"{best['samples_per_s']:.2f} samples/s against {given['samples_per_s']:.2f} as given "
        f"(run {baseline['id']}); trainer busy {best['trainer_busy']:.0%}, inference busy {best['inference_busy']:.0%}"
    )
    click.echo(api.page_url(answer["url"]))
    table = Table(show_edge=False, pad_edge=False)
    for column in ("generating share", "max staleness", "capacity", "sync", "samples/s", "dropped stale"):
        table.add_column(column, justify="left" if column == "sync" else "right")
    for c in plan["candidates"][:5]:
        table.add_row(
            str(c["inference_share"]),
            str(c["max_staleness"]),
            str(c["capacity"]),
            c["protocol"],
            f"{c['samples_per_s']:.2f}",
            f"{c['dropped_share']:.0%}" if c["dropped_share"] is not None else "—",
        )
    stdout().print(table)
    if plan.get("staleness_caveat"):  # absent from a site older than the caveat
        click.echo(plan["staleness_caveat"])
    return errors.OK


# --- runs -----------------------------------------------------------------------------


def team_id(api: Api, team: str) -> int:
    for t in api.get("/api/teams")["teams"]:
        if team in (str(t["id"]), t["slug"], t["name"]):
            return t["id"]
    raise CliError(f"team: you (this token) see no team {team!r}", errors.NOT_FOUND)


@cli.command()
@click.option("--status", help="Only these statuses, comma-separated (queued,running,…).")
@click.option("--team", help="Only this team's runs (id, slug or name; filters the page shown).")
@click.option("--experiment", type=int, help="Only this experiment's runs (id).")
@click.option("--search", "-q", help="Part of the run's name.")
@click.option("--sort", help="created|name|status|steps|reward|samples_per_s|duration, - to reverse.")
@click.option("--page", type=int, help="Page number (from 1).")
@click.option("--page-size", type=int, help="Runs per page (up to 200).")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON page.")
@site_options
def runs(status, team, experiment, search, sort, page, page_size, as_json, url, token) -> int:
    """List runs, newest first, with their latest reward and progress."""
    with connect(url, token) as api:
        data = api.get(
            "/api/runs", status=status, experiment=experiment, q=search, sort=sort, page=page, page_size=page_size
        )
        rows = data["runs"]
        if team:
            wanted = team_id(api, team)
            rows = [r for r in rows if r["team"]["id"] == wanted]
            data = {**data, "runs": rows}
    if as_json:
        print_json(data)
        return errors.OK
    table = Table(show_edge=False, pad_edge=False)
    for column, justify in [
        ("id", "right"),
        ("name", "left"),
        ("status", "left"),
        ("team", "left"),
        ("preset", "left"),
        ("steps", "right"),
        ("reward/mean", "right"),
        ("samples/s", "right"),
        ("progress", "right"),
        ("duration", "right"),
        ("created", "left"),
    ]:
        table.add_column(column, justify=justify)
    for r in rows:
        table.add_row(
            str(r["id"]),
            r["name"] + (" (simulated)" if r.get("simulated") else ""),
            r["status"],
            r["team"]["name"],
            r["preset"],
            "–" if r["steps_done"] is None else str(r["steps_done"]),
            number(r["latest_reward"]),
            number(r["samples_per_s"], 1),
            "–" if r["progress"] is None else f"{r['progress']:.0%}",
            duration(r["duration_s"]),
            (r["created_at"] or "")[:16].replace("T", " "),
        )
    console = stdout()
    console.print(table)
    console.print(
        f"page {data['page']}/{data['pages']} · {data['total']} runs" + (" (this page, one team)" if team else "")
    )
    return errors.OK


# --- follow ---------------------------------------------------------------------------


def follow_run(api: Api, run_id: int, *, as_json: bool = False, interval_s: float = 2.0) -> int:
    view = View(stdout(), as_json=as_json)
    last = None
    try:
        for last in watch(
            api, run_id, interval_s=interval_s, on_retry=lambda exc: view.note(f"retrying: {exc.message}")
        ):
            view.show(last)
    except KeyboardInterrupt:
        view.close(None)
        click.echo(f"stopped following run {run_id}; it goes on (rollway cancel {run_id} stops it)", err=True)
        return 130
    except BaseException:
        view.close(None)
        raise
    view.close(last)
    return last.exit_code if last else errors.RUN_FAILED


@cli.command()
@click.argument("run", type=RUN)
@click.option(
    "--interval", type=click.FloatRange(min=0.2), default=2.0, show_default=True, help="Seconds between polls."
)
@click.option("--json", "as_json", is_flag=True, help="One JSON object per poll (JSON lines).")
@site_options
def follow(run, interval, as_json, url, token) -> int:
    """Follow a run live until it ends; exit 0 succeeded, 1 failed or lost, 3 cancelled."""
    with connect(url, token) as api:
        return follow_run(api, run, as_json=as_json, interval_s=interval)


# --- replay ---------------------------------------------------------------------------


@cli.command()
@click.argument("run", type=RUN)
@click.option("--follow", is_flag=True, help="Then follow the replay to the end (exit code as `rollway follow`).")
@click.option("--json", "as_json", is_flag=True, help="Print the created run as JSON.")
@site_options
def replay(run, follow, as_json, url, token) -> int:
    """Replay a run that succeeded: its config again, under the schedule it recorded (the
    same groups from the same workers and versions, trained in the same batches)."""
    with connect(url, token) as api:
        child = api.post(f"/api/runs/{run}/replay", {})
        if as_json and not follow:
            print_json(child)
        else:
            click.echo(f"run {child['id']} {child['status']}: {child['name']}")
            click.echo(api.page_url(child["url"]))
        if follow:
            return follow_run(api, child["id"], as_json=as_json)
    return errors.OK


# --- cancel ---------------------------------------------------------------------------


@cli.command()
@click.argument("run_ids", nargs=-1, required=True, type=RUN, metavar="RUN...")
@click.option("--json", "as_json", is_flag=True)
@site_options
def cancel(run_ids, as_json, url, token) -> int:
    """Cancel runs (each on its own: one refusal does not stop the others)."""
    with connect(url, token) as api:
        result = api.post("/api/runs/cancel", {"runs": list(run_ids)})
    if as_json:
        print_json(result)
    else:
        for run_id in result["cancelled"]:
            click.echo(f"run {run_id} cancelling")
        for run_id, why in result["refused"].items():
            click.echo(f"run {run_id} refused: {why}", err=True)
    return errors.PARTLY_REFUSED if result["refused"] else errors.OK


# --- compare --------------------------------------------------------------------------


def show_value(value: Any) -> str:
    return "–" if value is None else value if isinstance(value, str) else json.dumps(value)


@cli.command()
@click.argument("run_ids", nargs=-1, required=True, type=RUN, metavar="RUN RUN...")
@click.option("--json", "as_json", is_flag=True)
@site_options
def compare(run_ids, as_json, url, token) -> int:
    """Runs side by side: the config fields that differ, then each run's outcome."""
    if len(set(run_ids)) < 2:
        raise click.UsageError("give at least two different runs")
    with connect(url, token) as api:
        result = compare_runs(api, list(dict.fromkeys(run_ids)))
    if as_json:
        print_json(result)
        return errors.OK
    table = Table(show_edge=False, pad_edge=False)
    table.add_column("")
    for r in result["runs"]:
        table.add_column(f"run {r['id']}", justify="right")
    table.add_row("name", *[r["name"] for r in result["runs"]])
    table.add_row("status", *[r["status"] for r in result["runs"]])
    table.add_row("steps", *[show_value(r["steps"]) for r in result["runs"]])
    table.add_row("final reward/mean", *[number(r["final_reward"]) for r in result["runs"]])
    table.add_row("best reward/mean", *[number(r["best_reward"]) for r in result["runs"]], end_section=True)
    for field, values in result["differences"].items():
        table.add_row(field, *[show_value(v) for v in values])
    console = stdout()
    console.print(table)
    if not result["differences"]:
        console.print("the runs' configs are identical")
    return errors.OK


# --- export ---------------------------------------------------------------------------


def download(api: Api, run_id: int, into: Path) -> int:
    """The run's model zip written to `into`; its size in bytes."""
    size = 0
    with api.stream(f"/api/runs/{run_id}/export") as response, open(into, "wb") as out:
        total = int(response.headers["Content-Length"]) if "Content-Length" in response.headers else None
        columns = [TextColumn(f"run {run_id} model"), BarColumn(), DownloadColumn(), TransferSpeedColumn()]
        with Progress(*columns, console=Console(stderr=True), disable=not sys.stderr.isatty()) as bar:
            task = bar.add_task("download", total=total)
            try:
                for chunk in response.iter_bytes(archive.CHUNK_BYTES):
                    out.write(chunk)
                    size += len(chunk)
                    bar.update(task, advance=len(chunk))
            except httpx.HTTPError as exc:
                raise CliError(f"the download of run {run_id}'s model broke off: {exc}", errors.UNREACHABLE) from None
    return size


@cli.command()
@click.argument("run", type=RUN)
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.option("--overwrite", is_flag=True, help="Replace files DIRECTORY already has.")
@click.option("--json", "as_json", is_flag=True, help="Print the files written as JSON.")
@site_options
def export(run, directory, overwrite, as_json, url, token) -> int:
    """Download a finished run's model and unpack it into DIRECTORY (a Hugging Face model dir)."""
    with connect(url, token) as api, tempfile.TemporaryDirectory(prefix="rollway-export-") as tmp:
        zip_path = Path(tmp) / f"run-{run}-model.zip"
        size = download(api, run, zip_path)
        try:
            written = archive.unpack(zip_path, directory, overwrite=overwrite)
        except archive.UnsafeArchive as exc:
            raise CliError(f"refused run {run}'s archive, nothing was written: {exc}", errors.BAD_REQUEST) from None
        except (OSError, ValueError) as exc:  # zipfile.BadZipFile is an Exception too
            raise CliError(f"cannot unpack run {run}'s archive: {exc}", errors.UNREACHABLE) from None
    if as_json:
        print_json({"run": run, "directory": str(directory), "files": [str(p) for p in written]})
    else:
        for path in written:
            click.echo(f"{path.stat().st_size:>12,}  {path}")
        click.echo(f"run {run}: {len(written)} files ({size:,} bytes downloaded) in {directory}")
    return errors.OK


# --- logs -----------------------------------------------------------------------------


@cli.command()
@click.argument("run", type=RUN)
@click.option("--all", "whole", is_flag=True, help="The whole log, not only its end (the last 256 KB).")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON (size, offset, truncated, text).")
@site_options
def logs(run, whole, as_json, url, token) -> int:
    """Print a run's driver log: its end (the last 256 KB, whole lines), or all of it."""
    with connect(url, token) as api:
        if whole:
            with api.stream(f"/api/runs/{run}/log/download") as response:
                try:
                    for chunk in response.iter_bytes(archive.CHUNK_BYTES):
                        sys.stdout.buffer.write(chunk)
                except httpx.HTTPError as exc:
                    raise CliError(f"the log of run {run} broke off: {exc}", errors.UNREACHABLE) from None
            sys.stdout.buffer.flush()
            return errors.OK
        data = api.get(f"/api/runs/{run}/log")
    if as_json:
        print_json(data)
        return errors.OK
    if data["truncated"]:
        click.echo(
            f"(the last {data['size'] - data['offset']:,} of {data['size']:,} bytes; --all for the whole log)", err=True
        )
    click.echo(data["text"], nl=False)
    return errors.OK


# --- teams ----------------------------------------------------------------------------

ROLES = click.Choice(["viewer", "member", "admin"])


def team_path(team: str, *rest: str) -> str:
    """/api/teams/<team>/…, each part quoted: a username may be an email address."""
    return "/".join(["/api/teams", *(quote(part, safe="") for part in (team, *rest))])


@cli.group()
def team() -> None:
    """Create teams and manage their members (the site's /teams/ page, over the API).

    \b
    Creating a team needs a site admin's token with the admin role; managing
    members needs the admin role in the team (the token's team only).
    USER is a username or an account's email address."""


@team.command("create")
@click.argument("name")
@click.option("--slug", help="The team's slug in URLs (default: from NAME).")
@click.option("--admin", "first_admin", metavar="USER", help="Its first admin (default: you).")
@click.option("--json", "as_json", is_flag=True, help="Print the created team as JSON.")
@site_options
def team_create(name, slug, first_admin, as_json, url, token) -> int:
    """Create team NAME with its first admin: site admins (Django staff) only."""
    body = {"name": name} | ({"slug": slug} if slug else {}) | ({"admin": first_admin} if first_admin else {})
    with connect(url, token) as api:
        created = api.post("/api/teams", body)
    if as_json:
        print_json(created)
    else:
        click.echo(f"created team {created['slug']} ({created['name']}) with {created['admin']} as its admin")
    return errors.OK


@team.command("members")
@click.argument("team_ref", metavar="TEAM")
@click.option("--json", "as_json", is_flag=True, help="Print the API's JSON.")
@site_options
def team_members(team_ref, as_json, url, token) -> int:
    """List TEAM's members and their roles (TEAM: its slug or id)."""
    with connect(url, token) as api:
        data = api.get(team_path(team_ref, "members"))
    if as_json:
        print_json(data)
        return errors.OK
    table = Table("member", "role", "joined", box=None, pad_edge=False)
    for member in data["members"]:
        table.add_row(member["username"], member["role"], member["joined_at"][:10])
    stdout().print(table)
    return errors.OK


def set_member(team_ref: str, user: str, role: str, url, token, *, as_json: bool) -> int:
    with connect(url, token) as api:
        member = api.post(team_path(team_ref, "members"), {"username": user, "role": role})
    if as_json:
        print_json(member)
    else:
        click.echo(f"{member['username']} is {member['role']} in team {team_ref}")
    return errors.OK


@team.command("add")
@click.argument("team_ref", metavar="TEAM")
@click.argument("user", metavar="USER")
@click.option("--role", type=ROLES, default="member", show_default=True, help="The role in the team.")
@click.option("--json", "as_json", is_flag=True, help="Print the membership as JSON.")
@site_options
def team_add(team_ref, user, role, as_json, url, token) -> int:
    """Add USER (who has an account on the site) to TEAM with a role."""
    return set_member(team_ref, user, role, url, token, as_json=as_json)


@team.command("role")
@click.argument("team_ref", metavar="TEAM")
@click.argument("user", metavar="USER")
@click.argument("role", type=ROLES)
@click.option("--json", "as_json", is_flag=True, help="Print the membership as JSON.")
@site_options
def team_role(team_ref, user, role, as_json, url, token) -> int:
    """Change USER's role in TEAM (the last admin cannot be demoted: exit 6)."""
    return set_member(team_ref, user, role, url, token, as_json=as_json)


@team.command("remove")
@click.argument("team_ref", metavar="TEAM")
@click.argument("user", metavar="USER")
@site_options
def team_remove(team_ref, user, url, token) -> int:
    """Remove USER from TEAM (the last admin cannot be removed: exit 6)."""
    with connect(url, token) as api:
        removed = api.delete(team_path(team_ref, "members", user))["removed"]
    click.echo(f"removed {removed} from team {team_ref}")
    return errors.OK


# --- entry point ----------------------------------------------------------------------


def fail(message: str, errors_by_field: dict[str, str] | None = None) -> None:
    if errors_by_field and len(errors_by_field) > 1:
        click.echo("error: the site refused the request:", err=True)
        for field, why in errors_by_field.items():
            click.echo(f"  {field}: {why}", err=True)
    else:
        click.echo(f"error: {message}", err=True)


def main(argv: list[str] | None = None) -> int:
    """Run one command; its exit code (errors.py), never a traceback for a refusal."""
    try:
        code = cli.main(args=argv, prog_name="rollway", standalone_mode=False)
    except CliError as exc:
        fail(exc.message, exc.errors)
        return exc.exit_code
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        return 130
    except click.ClickException as exc:
        exc.show()
        return exc.exit_code
    except click.exceptions.Exit as exc:  # --help, --version
        return exc.exit_code
    return code if isinstance(code, int) else errors.OK
