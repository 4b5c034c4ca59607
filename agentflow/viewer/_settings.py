"""`ViewerSettings` (what to serve, who may act) and `Viewer` (what the pages share)."""

from __future__ import annotations

import json
import secrets
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Final
from urllib.parse import quote

import jinja2
from markupsafe import Markup
from starlette.requests import Request
from starlette.responses import Response
from starlette.templating import Jinja2Templates

from agentflow._app import FlowApp
from agentflow._display import printable, short, when
from agentflow._errors import CheckpointError, CheckpointNotFound
from agentflow._events import Events
from agentflow._urls import redact
from agentflow.exec.checkpoints import CheckpointStore
from agentflow.exec.run.lease import process_owner
from agentflow.exec.run.read import read_run
from agentflow.exec.run.view import RunReport
from agentflow.exec.seal import Sealer
from agentflow.runs import Runs
from agentflow.viewer._hosts import TrustedHosts, check_proxies, parse_entry

if TYPE_CHECKING:
    from agentflow.celery import AgentflowTasks, FlowClient

#: Sent with every page: no framing, no inline or foreign scripts, forms post only here.
SECURITY_HEADERS: Final = {
    "Content-Security-Policy": (
        "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; connect-src 'self'; "
        "form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
    ),
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
    "Cache-Control": "no-store",
}
#: The shortest token accepted: 22 URL-safe characters carry 16 random bytes.
MIN_TOKEN_CHARS: Final = 22
#: Fewer distinct characters than this in a token of 22 or more is no random token.
MIN_TOKEN_DISTINCT: Final = 8
#: The most runs one page of the list shows.
MAX_LIMIT: Final = 1000
#: Who decides through a viewer whose settings name nobody.
DEFAULT_TOKEN_LABEL: Final = "viewer"
#: The longest token label taken.
MAX_TOKEN_LABEL: Final = 100
#: The control characters a page may carry raw (HTML takes them as whitespace).
_KEEP: Final = "\n\t"


def root_of(request: Request) -> str:
    """The path the viewer is mounted at (``""`` at the root), so links work under a prefix."""
    return str(request.scope.get("root_path", "")).rstrip("/")


def visible(value: Any) -> Any:
    r"""What a page shows of a value: control and bidi characters written as ``\x1b``, ``\u202e``.

    The templates' `finalize`: it runs on every ``{{ ... }}`` before autoescaping, so no
    string read from a store reaches the page with a raw control character (newline and
    tab stay: in HTML they are only whitespace). The escapes are the CLI's
    (`agentflow._display.printable`).
    """
    if isinstance(value, Markup):
        return Markup(printable(str(value), keep=_KEEP))
    if isinstance(value, str):
        return printable(value, keep=_KEEP)
    return value


def token_problem(token: object) -> str | None:
    """Why `token` is not a usable viewer token (never quoting it), or None."""
    if not isinstance(token, str):
        return f"it is a {type(token).__name__}, not a string"
    if not token:
        return "it is empty"
    if any(c.isspace() or not c.isprintable() or not c.isascii() for c in token):
        return "it holds whitespace, control or non-ASCII characters"
    if len(token) < MIN_TOKEN_CHARS:
        return f"it is shorter than {MIN_TOKEN_CHARS} characters"
    if len(set(token)) < MIN_TOKEN_DISTINCT:
        return "it repeats too few distinct characters to have been made at random"
    return None


def check_token(token: object, what: str) -> None:
    """Refuse a token too short or too plain to be guessed only by chance.

    Raises:
        ValueError: the token is unusable; the message names `what`, never the token.
    """
    why = token_problem(token)
    if why:
        raise ValueError(
            f"{what} must hold a token of {MIN_TOKEN_CHARS} or more random characters (16 random bytes or more, "
            f"as python -c 'import secrets; print(secrets.token_urlsafe(32))' makes): {why}"
        )


def check_token_label(label: object, what: str) -> None:
    """Refuse a token label that is not a short, printable name.

    Raises:
        ValueError: the label is empty, too long, or holds control or surrounding whitespace characters.
    """
    if (
        not isinstance(label, str)
        or not label
        or label != label.strip()
        or not label.isprintable()
        or len(label) > MAX_TOKEN_LABEL
    ):
        raise ValueError(
            f"{what} must be a name of 1 to {MAX_TOKEN_LABEL} printable characters, without surrounding spaces: "
            f"{label!r}"
        )


@dataclass(frozen=True, repr=False)
class ViewerSettings:
    """What the viewer serves and who may act through it.

    Checked when made: a bad token, host name or proxy address, or a `workers` path that
    names no deployment, raises `ValueError` naming the setting (never a token's value).
    Neither `repr` nor `str` shows the key ring, the token or the workers; the label is
    redacted when made, so a URL given as it is shows no password on any page.
    """

    store: CheckpointStore
    """The store whose runs are shown."""
    keys: Sequence[bytes]
    """The checkpoint key ring (newest first) that checks every row shown."""
    flows: FlowApp | None = None
    """The app whose flows the actions use; None (and no `workers`) makes the viewer read-only."""
    token: str | None = None
    """If set, every action needs this token (from any address); if not, only loopback clients may act.

    At least 22 random characters (16 random bytes); ``secrets.token_urlsafe(32)`` makes one."""
    label: str = ""
    """What the header names as the store: a URL is shown without its password (`agentflow._urls.redact`)."""
    limit: int = 50
    """How many runs one page of the list shows, newest first (each read as its latest checkpoint only)."""
    refresh_s: int = 5
    """Seconds between live refreshes."""
    allowed_hosts: Sequence[str] = ()
    """Host names browsers may reach the viewer by, besides ``127.0.0.1``, ``localhost`` and ``[::1]``.

    ``name`` (any port) or ``name:port``; a request naming any other host gets a 400."""
    port: int | None = None
    """The port the viewer is served on: the loopback names are trusted only at it (None: at any port).

    `serve` sets it; give it when you serve `create_app` yourself."""
    proxies: Sequence[str] = ()
    """Addresses (or networks) of reverse proxies whose ``X-Forwarded-For``/``-Proto`` are believed.

    Empty (the default): nobody's. With proxies, every action needs the token."""
    token_label: str = DEFAULT_TOKEN_LABEL
    """Who decides through this viewer: signed as the ``operator`` of every action it stores.

    Name the people who hold the token (``ops-team``, a person's name); without a token, those
    at this machine."""
    workers: str | AgentflowTasks | None = None
    """The deployment's `AgentflowTasks` (or ``"module:attr"`` naming them): every action that runs a tool
    then goes through `agentflow.celery.FlowClient`, and the workers run the tools, never the viewer.

    A path is imported when the settings are made (`agentflow.celery.load_tasks`); without `flows`,
    the workers' app is used. Needs the ``celery`` extra."""

    def __post_init__(self) -> None:
        if self.token is not None:
            check_token(self.token, "ViewerSettings.token")
        check_token_label(self.token_label, "ViewerSettings.token_label")
        object.__setattr__(self, "label", redact(self.label))
        for name in ("allowed_hosts", "proxies"):
            if isinstance(getattr(self, name), str):
                raise ValueError(f"ViewerSettings.{name}: give a list of strings, not one string")
        for entry in self.allowed_hosts:
            parse_entry(entry, "ViewerSettings.allowed_hosts")
        object.__setattr__(self, "allowed_hosts", tuple(self.allowed_hosts))
        object.__setattr__(self, "proxies", check_proxies(self.proxies, "ViewerSettings.proxies"))
        if self.port is not None and not 0 < self.port < 65536:
            raise ValueError(f"ViewerSettings.port: {self.port} is not a TCP port")
        if not 0 < self.limit <= MAX_LIMIT:
            raise ValueError(f"ViewerSettings.limit: show 1 to {MAX_LIMIT} runs a page, not {self.limit}")
        if self.refresh_s < 1:
            raise ValueError(f"ViewerSettings.refresh_s: refresh every second or less often, not {self.refresh_s}")
        if isinstance(self.workers, str):
            object.__setattr__(self, "workers", _load_workers(self.workers))

    def __repr__(self) -> str:
        flows = None if self.flows is None else f"<FlowApp: {', '.join(sorted(self.flows.flows))}>"
        return (
            f"ViewerSettings(store=<{type(self.store).__name__}>, keys=<{len(self.keys)} hidden>, flows={flows}, "
            f"token={'<hidden>' if self.token is not None else None}, label={self.label!r}, limit={self.limit}, "
            f"refresh_s={self.refresh_s}, allowed_hosts={self.allowed_hosts!r}, port={self.port}, "
            f"proxies={self.proxies!r}, token_label={self.token_label!r}, "
            f"workers={'<AgentflowTasks>' if self.workers is not None else None})"
        )


def _load_workers(path: str) -> AgentflowTasks:
    """The `AgentflowTasks` at ``module:attr`` (agentflow.celery is imported here only: its extra is optional).

    Raises:
        ValueError: the extra is missing, or the path does not name the tasks (the message says which).
    """
    try:
        from agentflow.celery import load_tasks
    except ImportError as exc:
        raise ValueError(
            f"ViewerSettings.workers needs the 'celery' extra: pip install 'agentflow[celery]' ({exc})"
        ) from None
    return load_tasks(path)


class Viewer:
    """What the pages share: the settings, a sealer, the trusted hosts, the templates and the CSRF secret."""

    def __init__(self, settings: ViewerSettings) -> None:
        self.settings = settings
        self.sealer = Sealer(list(settings.keys))
        tasks = settings.workers
        assert not isinstance(tasks, str)  # loaded when the settings were made
        #: The app whose flows the actions use (the workers' when only `workers` is given); None: read-only.
        self.flows: FlowApp | None = settings.flows or (tasks.worker.flow_app if tasks is not None else None)
        #: Carries the actions out through the workers, when the settings name them (`transport`).
        self.client: FlowClient | None = None
        #: The app's runs by id, in this process: what an action is checked against, and carries it
        #: out unless the workers do (None: read-only).
        self.runs: Runs | None = None
        if tasks is not None:
            from agentflow.celery import FlowClient  # the settings loaded the tasks: the extra is installed

            self.client = FlowClient(tasks, name="viewer")
            self.runs = self.client.runs
        elif self.flows is not None:
            # Its actions go into the runs' event streams, for whoever follows them.
            owner, events = process_owner("viewer"), Events(record=True)
            self.runs = Runs(self.flows, self.flows.runner(settings.store, settings.keys, owner=owner, events=events))
        self.trusted = TrustedHosts.of(settings.allowed_hosts, settings.port)
        #: Signs the CSRF tokens of this process's forms (a restart makes open pages stale).
        self.csrf_secret = secrets.token_bytes(32)
        #: Set when the server shuts down: every open event stream ends (`agentflow.viewer._stream`).
        self.closing = False
        env = jinja2.Environment(
            loader=jinja2.PackageLoader("agentflow.viewer", "templates"),
            autoescape=jinja2.select_autoescape(["html"]),
            undefined=jinja2.StrictUndefined,
            finalize=visible,
        )
        env.filters.update(
            when=when,
            short=lambda v, width=60: "" if v is None else short(v, width),
            pretty=lambda v: json.dumps(v, indent=2, sort_keys=True, default=str),
            q=lambda v: quote(str(v), safe="", errors="replace"),
            cls=lambda v: str(v).replace(" ", "-").lower(),
        )
        self.templates = Jinja2Templates(env=env)

    def __repr__(self) -> str:
        return f"<Viewer of {self.settings!r}>"

    @property
    def transport(self) -> Runs | FlowClient | None:
        """What carries the actions out: the workers' client, else this process's runs (None: read-only)."""
        return self.client if self.client is not None else self.runs

    def page(self, request: Request, name: str, context: dict[str, Any], status: int = 200) -> Response:
        """Render template `name` with the shared context and the security headers."""
        shared = {"label": self.settings.label, "refresh_s": self.settings.refresh_s, "root": root_of(request)}
        response = self.templates.TemplateResponse(request, name, shared | context, status_code=status)
        response.headers.update(SECURITY_HEADERS)
        return response

    def problem(self, request: Request, status: int, title: str, message: str, run_id: str | None = None) -> Response:
        """An error page: what went wrong, in one sentence, and a way back."""
        return self.page(request, "problem.html", {"title": title, "message": message, "run_id": run_id}, status)

    async def read(self, request: Request, run_id: str) -> RunReport | Response:
        """The run, every row checked (`read_run`); or the page saying why not (404 unknown, 503 unreadable)."""
        try:
            return await read_run(self.settings.store, self.sealer, run_id)
        except CheckpointNotFound:
            return self.problem(request, 404, "No such run", f"The store holds no run {run_id!r}.")
        except CheckpointError as exc:
            return self.problem(request, 503, "The store cannot be read", str(exc), run_id)
