"""Issue 16, the viewer's settings: the token's strength, and no secret in a repr.

Findings reproduced:
- ``ViewerSettings(token="")`` was accepted, and an empty token then compared equal: a
  non-loopback client with no token denied a run;
- ``repr(ViewerSettings(...))`` showed the raw checkpoint key and the token.
"""

from __future__ import annotations

import hmac
import secrets
from pathlib import Path

import pytest
import runs_kit
from click.testing import CliRunner
from viewer_kit import TOKEN, client_for, csrf_of, make_app, settings_for

from agentflow.cli._group import cli
from agentflow.exec.checkpoints import MemoryCheckpointStore
from agentflow.viewer import ViewerSettings, create_app
from agentflow.viewer._settings import Viewer

REMOTE = ("192.0.2.7", 40000)
WEAK = [
    "",  # the finding
    "short-token",
    "a" * 40,
    "abababababababababababab",
    "0123456789 abcdefghijklmnop",
    "0123456789abcdefghijklmnop\n",
    "0123456789abcdefghijkl\x1bmnop",
    "0123456789abcdefghijklmnopé",
]


@pytest.mark.parametrize("token", WEAK)
def test_a_weak_or_empty_token_is_refused_when_the_settings_are_made_without_quoting_it(db, token):
    with pytest.raises(ValueError, match=r"ViewerSettings\.token must hold a token of 22 or more") as caught:
        settings_for(db, token=token)
    if token.strip():
        assert token.strip() not in str(caught.value)


@pytest.mark.parametrize(
    "token",
    [secrets.token_urlsafe(16), secrets.token_urlsafe(32), secrets.token_hex(16), TOKEN],
    ids=["urlsafe-16", "urlsafe-32", "hex-16", "kit-token"],  # fixed ids: the same on every collection
)
def test_a_random_token_is_accepted(db, token):
    assert settings_for(db, token=token).token == token


def test_an_empty_token_no_longer_lets_a_client_without_one_decide(db):
    # The finding: ViewerSettings(token="") compared equal to the missing token of a remote client.
    with pytest.raises(ValueError):
        make_app(db, token="")
    with client_for(make_app(db, token=TOKEN), client=REMOTE) as remote:
        csrf = csrf_of(remote.get("/runs/refund-1").text)
        for given in ({}, {"token": ""}):
            answer = remote.post("/runs/refund-1/resume", data={"decision": "deny", "csrf": csrf, **given})
            assert answer.status_code == 403


def test_the_token_is_compared_in_constant_time(db, monkeypatch):
    seen: list[tuple[bytes, bytes]] = []
    compare = hmac.compare_digest

    def spy(a: bytes, b: bytes) -> bool:
        seen.append((a, b))
        return compare(a, b)

    monkeypatch.setattr(hmac, "compare_digest", spy)  # the module _resume calls it through
    with client_for(make_app(db, token=TOKEN), client=REMOTE) as remote:
        csrf = csrf_of(remote.get("/runs/refund-1").text)
        answer = remote.post("/runs/refund-1/resume", data={"decision": "approve", "csrf": csrf, "token": "x" * 30})
    assert answer.status_code == 403
    assert (b"x" * 30, TOKEN.encode()) in seen


def test_no_repr_or_str_shows_the_key_or_the_token(db):
    settings = settings_for(db, token=TOKEN)
    viewer = Viewer(settings)
    app = create_app(settings)
    shown = [repr(settings), str(settings), repr(viewer), str(viewer), repr(viewer.sealer), repr(app.user_middleware)]
    for text in shown:
        assert TOKEN not in text
        assert repr(runs_kit.KEY) not in text and runs_kit.KEY.hex() not in text
        assert runs_kit.KEY.decode("latin-1") not in text
    assert "token=<hidden>" in repr(settings) and "keys=<1 hidden>" in repr(settings)
    assert "refunds" in repr(settings)  # what is not secret is still shown


@pytest.mark.parametrize(
    ("field", "value"), [("limit", 0), ("limit", 100_000), ("refresh_s", 0), ("port", 70_000), ("port", 0)]
)
def test_out_of_range_numbers_are_refused(db, field, value):
    with pytest.raises(ValueError, match=f"ViewerSettings.{field}"):
        settings_for(db, **{field: value})


# --- the command: the same checks, in its options' words ------------------------------------


def run_viewer(
    db: Path, monkeypatch: pytest.MonkeyPatch, *args: str, token: str | None = None, workers: str | None = None
) -> tuple[int, str, list[ViewerSettings]]:
    """``agentflow viewer --store sqlite:///db ...args`` (``$AGENTFLOW_WORKERS``: `workers`), `serve` recorded."""
    import agentflow.viewer

    served: list[ViewerSettings] = []
    monkeypatch.setattr(agentflow.viewer, "serve", lambda settings, **where: served.append(settings))
    env = {"AGENTFLOW_CHECKPOINT_KEYS": runs_kit.KEY_TEXT, "AGENTFLOW_ALLOW_DEMO_KEY": "1", "VIEWER_TOKEN": token}
    env["AGENTFLOW_WORKERS"] = workers
    result = CliRunner().invoke(cli, ["viewer", "--store", f"sqlite:///{db}", *args], env=env)
    return result.exit_code, result.stderr, served


def test_the_command_passes_hosts_proxies_and_token_to_the_settings(db, monkeypatch):
    args = ["--allowed-host", "viewer.example.com", "--proxy", "10.0.0.5", "--token-env", "VIEWER_TOKEN"]
    code, err, served = run_viewer(db, monkeypatch, *args, token=f"  {TOKEN}\n")
    assert code == 0, err
    (settings,) = served
    assert settings.allowed_hosts == ("viewer.example.com",) and settings.proxies == ("10.0.0.5",)
    assert settings.token == TOKEN  # stripped
    assert TOKEN not in err


@pytest.mark.parametrize(
    ("args", "token", "said"),
    [
        (["--token-env", "VIEWER_TOKEN"], "0123456789abcdef", "$VIEWER_TOKEN must hold a token of 22 or more"),
        (["--token-env", "VIEWER_TOKEN"], None, "$VIEWER_TOKEN must hold a token"),
        (["--proxy", "*"], None, "--proxy: '*' would let any client say"),
        (["--allowed-host", "https://x.example"], None, "--allowed-host: 'https://x.example' is not a host name"),
    ],
)
def test_a_bad_option_is_one_line_naming_it(db, monkeypatch, args, token, said):
    code, err, served = run_viewer(db, monkeypatch, *args, token=token)
    assert code == 2 and served == []
    assert len(err.strip().splitlines()) == 1 and said in err, err
    assert "0123456789abcdef" not in err


def test_the_docs_way_to_make_a_token_makes_an_accepted_one():
    store = MemoryCheckpointStore()
    assert ViewerSettings(store, [runs_kit.KEY], token=secrets.token_urlsafe(32)).token
