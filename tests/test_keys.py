"""Keys read from text (`agentflow._keys.parse_keys`) and the workers' settings that use it (config/).

Issue 16: the public demo key was accepted by the production wiring, ``"a" * 32`` was
accepted, and 64 hex digits without ``hex:`` silently became 64 ASCII bytes.
"""

from __future__ import annotations

import base64
import secrets
from typing import Any

import pytest

from agentflow._keys import MAKE_ONE, MIN_DISTINCT_BYTES, PublicKeyRefused, check_key, is_public, parse_keys
from agentflow.demo.worker import DEMO_KEY

GOOD = secrets.token_bytes(32)
GOOD_HEX = "hex:" + GOOD.hex()
DEMO_FORMS = {
    "text": DEMO_KEY.decode(),
    "hex": "hex:" + DEMO_KEY.hex(),
    "base64": "base64:" + base64.b64encode(DEMO_KEY).decode(),
}
#: Keys a person might write that are not secrets, each with what the refusal says.
WEAK = {
    "one byte repeated": ("a" * 32, "one byte repeated"),
    "one byte repeated, as hex": ("hex:" + "ab" * 32, "one byte repeated"),
    "a short pattern": ("abcdefgh" * 4, "only 8 distinct byte values"),
    "zeros, as base64": ("base64:" + base64.b64encode(bytes(48)).decode(), "one byte repeated"),
    "hex digits without hex:": (secrets.token_hex(32), "64 hex digits without a prefix"),
    "a longer hex string without hex:": (secrets.token_hex(40), "80 hex digits without a prefix"),
}


def test_the_demo_key_is_known_as_public() -> None:
    # The digest in agentflow/_keys.py is the demo's key (the parser cannot import the demo)
    assert is_public(DEMO_KEY)
    assert not is_public(GOOD)


@pytest.mark.parametrize("form", sorted(DEMO_FORMS))
def test_the_demo_key_is_refused_in_every_form_unless_allowed(form: str) -> None:
    text = DEMO_FORMS[form]
    with pytest.raises(PublicKeyRefused, match="the demo's public key") as caught:
        parse_keys(text, source="$K")
    assert text not in str(caught.value) and DEMO_KEY.decode() not in str(caught.value)
    assert parse_keys(text, source="$K", allow_public=True) == [DEMO_KEY]


def test_the_demo_key_is_refused_anywhere_in_a_rotation() -> None:
    with pytest.raises(PublicKeyRefused, match=r"\$K \(key 2\) is the demo's public key"):
        parse_keys(f"{GOOD_HEX},{DEMO_FORMS['hex']}", source="$K")


@pytest.mark.parametrize("name", sorted(WEAK))
def test_weak_and_ambiguous_keys_are_refused_with_how_to_make_one(name: str) -> None:
    text, says = WEAK[name]
    with pytest.raises(ValueError, match="K") as caught:
        parse_keys(text, source="$K")
    message = str(caught.value)
    assert says in message and MAKE_ONE in message
    # and the message holds no part of the key
    secret = text.partition(":")[2] or text
    assert secret not in message and secret[:8] not in message and secret[-8:] not in message


def test_hex_digits_are_read_as_hex_with_the_prefix() -> None:
    digits = GOOD.hex()
    assert parse_keys("hex:" + digits) == [GOOD]
    assert parse_keys("hex:" + digits.upper()) == [GOOD]


@pytest.mark.parametrize(
    "text",
    [
        GOOD_HEX,
        "base64:" + base64.b64encode(GOOD).decode(),
        secrets.token_urlsafe(32),  # text from the usual generator is a good key as it is
        "correct horse battery staple, said Randall",
    ],
    ids=["hex", "base64", "token_urlsafe", "passphrase"],  # fixed ids: the same on every collection
)
def test_good_keys_are_read(text: str) -> None:
    assert len(parse_keys(text.replace(",", ";"))[0]) >= 32


def test_a_random_key_always_has_enough_distinct_bytes() -> None:
    # The rule refuses patterns, not random keys: 2,000 random keys all pass
    for _ in range(2000):
        key = secrets.token_bytes(32)
        assert len(set(key)) >= MIN_DISTINCT_BYTES
        check_key(key)


def test_short_and_malformed_keys_still_name_the_source_only() -> None:
    with pytest.raises(ValueError, match=r"\$K has 9 bytes; it needs at least 32 \(make one with"):
        parse_keys("too-short", source="$K")
    with pytest.raises(ValueError, match=r"\$K is not valid hex"):
        parse_keys("hex:zz", source="$K")
    with pytest.raises(ValueError, match=r"\$K \(key 2\) is empty"):
        parse_keys(f"{GOOD_HEX},", source="$K")


# ---- the workers' settings (config/): the production wiring ---------------------------------


#: The app the settings below are given when a test is not about the app.
APP = "my_company.agents:app"


@pytest.fixture(autouse=True)
def _no_settings_from_the_environment(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> None:
    # Settings read AGENTFLOW_* variables and a .env in the working folder: neither may leak in.
    for name in ("AGENTFLOW_APP", "AGENTFLOW_CHECKPOINT_KEYS"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.chdir(tmp_path)


def settings(**values: Any) -> Any:
    pytest.importorskip("pydantic_settings")
    from config import Settings

    return Settings(**{"app": APP, **values})


@pytest.mark.parametrize("form", sorted(DEMO_FORMS))
def test_the_workers_settings_refuse_the_demo_key(form: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="AGENTFLOW_CHECKPOINT_KEYS is the demo's public key") as caught:
        settings(checkpoint_keys=DEMO_FORMS[form])
    assert DEMO_KEY.hex()[-12:] not in str(caught.value) and DEMO_KEY.decode()[-12:] not in str(caught.value)


@pytest.mark.parametrize("name", sorted(WEAK))
def test_the_workers_settings_refuse_weak_keys_without_echoing_them(name: str) -> None:
    from pydantic import ValidationError

    text, says = WEAK[name]
    with pytest.raises(ValidationError, match=says) as caught:
        settings(checkpoint_keys=text, redis_url="redis://:hunter2-secret@db:6379/0")
    message = str(caught.value)
    assert MAKE_ONE in message
    # pydantic would quote the input in its error; these settings hide it
    secret = text.partition(":")[2] or text
    assert secret[-8:] not in message and "hunter2" not in message


def test_load_settings_refuses_the_demo_key_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pydantic_settings")
    from config import load_settings

    monkeypatch.setenv("AGENTFLOW_APP", APP)
    monkeypatch.setenv("AGENTFLOW_CHECKPOINT_KEYS", DEMO_FORMS["hex"])
    with pytest.raises(SystemExit, match="agentflow settings: AGENTFLOW_CHECKPOINT_KEYS is the demo's public key"):
        load_settings()


@pytest.mark.parametrize("app", [None, "", "  "])
def test_the_workers_settings_have_no_default_app(app: str | None) -> None:
    # Issue 15: AGENTFLOW_APP used to default to the demo's ticket flow in the production wiring
    pytest.importorskip("pydantic_settings")
    from pydantic import ValidationError

    from config.settings import APP_NOT_SET, Settings

    given: dict[str, Any] = {} if app is None else {"app": app}
    with pytest.raises(ValidationError) as caught:
        Settings(checkpoint_keys=GOOD_HEX, **given)
    assert APP_NOT_SET in str(caught.value)
    assert "agentflow.demo.tickets:app" in APP_NOT_SET  # the refusal says how to try the demo's flow


def test_load_settings_without_an_app_says_what_to_set_in_one_line(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pydantic_settings")
    from config import load_settings

    monkeypatch.setenv("AGENTFLOW_CHECKPOINT_KEYS", GOOD_HEX)
    with pytest.raises(SystemExit) as caught:
        load_settings()
    message = str(caught.value)
    assert message.startswith("agentflow settings: AGENTFLOW_APP is not set: set it to the FlowApp")
    assert "package.module:attribute" in message and "\n" not in message
    assert GOOD.hex()[-12:] not in message

    # Given the app too, the same environment is accepted, and the app is the one named
    monkeypatch.setenv("AGENTFLOW_APP", APP)
    assert load_settings().app == APP


def test_every_problem_of_the_settings_is_reported_at_once(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("pydantic_settings")
    from config import load_settings

    monkeypatch.setenv("AGENTFLOW_TIME_LIMIT_S", "3000")
    with pytest.raises(SystemExit) as caught:
        load_settings()
    message = str(caught.value)
    for says in ("AGENTFLOW_CHECKPOINT_KEYS is not set", "AGENTFLOW_APP is not set", "AGENTFLOW_VISIBILITY_TIMEOUT_S"):
        assert says in message, says


def test_the_settings_show_no_secret_in_repr_or_str() -> None:
    key = secrets.token_hex(32)
    found = settings(checkpoint_keys="hex:" + key, redis_url="redis://:hunter2-secret@db:6379/0")
    for text in (repr(found), str(found)):
        assert key not in text and "hunter2" not in text
    assert found.keys() == [bytes.fromhex(key)]
