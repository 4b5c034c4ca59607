"""Issue 16, the viewer's network edge: DNS rebinding (trusted hosts) and forwarded headers (proxies).

Findings reproduced:
- with the viewer on 127.0.0.1:PORT, requests naming ``Host: evil.example:PORT`` and a
  matching ``Origin`` from a loopback client read runs, got a CSRF token and approved;
- a spoofed ``X-Forwarded-For: 127.0.0.1`` from 127.0.0.2 (uvicorn's proxy headers on,
  ``FORWARDED_ALLOW_IPS=*``) approved.
"""

from __future__ import annotations

import http.client
from collections.abc import Mapping
from pathlib import Path

import pytest
import runs_kit
from viewer_kit import LOCAL, TOKEN, client_for, csrf_of, make_app, served_like_serve, settings_for

from agentflow.exec.checkpoints import SQLiteCheckpointStore
from agentflow.exec.run.read import read_run
from agentflow.exec.seal import Sealer
from agentflow.viewer._serve import bound

PORT = 18765
HERE = f"http://127.0.0.1:{PORT}"
EVIL = f"evil.example:{PORT}"
FORM = {"decision": "approve"}


def status_of(db: Path, run_id: str) -> str:
    async def read() -> str:
        async with SQLiteCheckpointStore(db) as store:
            return (await read_run(store, Sealer(runs_kit.KEY), run_id)).status

    return runs_kit.in_thread(read)


# --- DNS rebinding --------------------------------------------------------------------------


def test_a_rebound_host_can_read_nothing_get_no_csrf_token_and_cannot_approve(db):
    # Given the viewer on 127.0.0.1:PORT and a browser whose evil.example now resolves to 127.0.0.1
    rebound = {"Host": EVIL, "Origin": f"http://{EVIL}"}
    with client_for(make_app(db, port=PORT), base_url=HERE) as client:
        csrf = csrf_of(client.get("/runs/refund-1").text)  # (a real one, from a page opened here)
        # When the attacker's page asks, with its own name in Host and a matching Origin
        answers = [
            client.get("/", headers=rebound),
            client.get("/runs/refund-1", headers=rebound),
            client.get("/static/viewer.js", headers=rebound),
            client.post("/runs/refund-1/resume", data={**FORM, "csrf": csrf}, headers=rebound),
        ]
    # Then every request is refused before any page is made: no state, no CSRF token, no approval
    assert [a.status_code for a in answers] == [400, 400, 400, 400]
    assert all("refund" not in a.text and "csrf" not in a.text for a in answers)
    assert "--allowed-host" in answers[0].text and "evil" not in answers[0].text
    assert status_of(db, "refund-1") == "paused" and runs_kit.REFUNDS == []


def test_the_loopback_names_are_trusted_at_the_served_port_only(db):
    with client_for(make_app(db, port=PORT), base_url=HERE) as client:
        for host in (f"127.0.0.1:{PORT}", f"localhost:{PORT}", f"[::1]:{PORT}", f"LOCALHOST.:{PORT}"):
            assert client.get("/", headers={"Host": host}).status_code == 200, host
        for host in ("127.0.0.1:9999", "localhost", "[::1]:1", "", "127.0.0.1:x", f"a@127.0.0.1:{PORT}"):
            assert client.get("/", headers={"Host": host}).status_code == 400, host


def test_without_a_port_the_loopback_names_are_trusted_at_any_port(db):
    # create_app served by hand without ViewerSettings.port (the docs' mounted example)
    with client_for(make_app(db)) as client:
        assert client.get("/", headers={"Host": "localhost:1234"}).status_code == 200
        assert client.get("/", headers={"Host": "evil.example"}).status_code == 400


def test_an_allowed_host_is_answered_at_its_port_or_any(db):
    app = make_app(db, port=PORT, allowed_hosts=["viewer.example.com", "ops.example.com:8443"])
    with client_for(app, base_url=HERE) as client:
        assert client.get("/", headers={"Host": "viewer.example.com"}).status_code == 200
        assert client.get("/", headers={"Host": "Viewer.Example.com:444"}).status_code == 200
        assert client.get("/", headers={"Host": "ops.example.com:8443"}).status_code == 200
        assert client.get("/", headers={"Host": "ops.example.com"}).status_code == 400
        assert client.get("/", headers={"Host": "example.com"}).status_code == 400


def test_the_origin_is_held_against_the_trusted_list_never_against_the_host(db):
    app = make_app(db, port=PORT, allowed_hosts=["viewer.example.com"])
    with client_for(app, base_url=HERE) as client:
        csrf = csrf_of(client.get("/runs/refund-1").text)

        def post(origin: str, host: str = f"127.0.0.1:{PORT}") -> int:
            data = {**FORM, "csrf": csrf}
            return client.post("/runs/refund-1/resume", data=data, headers={"Origin": origin, "Host": host}).status_code

        # a trusted Host does not make any Origin trusted, even one equal to it...
        assert post(f"http://evil.example:{PORT}") == 403
        assert post("http://viewer.example.com.evil.example") == 403
        # ...another port on this machine is another site...
        assert post("http://127.0.0.1:3000") == 403
        assert post("http://localhost:3000", host=f"localhost:{PORT}") == 403
        assert post("null") == 403
        assert post("") == 403
        assert status_of(db, "refund-1") == "paused"
        # ...and a trusted Origin is fine, whatever trusted name the request itself used
        assert post(f"http://localhost:{PORT}") == 303
    assert status_of(db, "refund-1") == "done"


def test_a_trusted_name_reached_through_https_is_a_trusted_origin(db):
    app = make_app(db, port=PORT, allowed_hosts=["viewer.example.com"])
    with client_for(app, base_url=HERE) as client:
        csrf = csrf_of(client.get("/runs/refund-1").text)
        headers = {"Origin": "https://viewer.example.com", "Host": "viewer.example.com"}
        assert client.post("/runs/refund-1/resume", data={**FORM, "csrf": csrf}, headers=headers).status_code == 303


def test_serve_trusts_the_loopback_names_at_its_port_and_a_specific_address_it_listens_on(db):
    settings = settings_for(db)
    assert bound(settings, "127.0.0.1", 8765).port == 8765
    assert bound(settings, "127.0.0.1", 8765).allowed_hosts == ()
    assert bound(settings, "192.0.2.10", 80).allowed_hosts == ("192.0.2.10:80",)
    assert bound(settings, "2001:db8::1", 8765).allowed_hosts == ("[2001:db8::1]:8765",)
    assert bound(settings, "0.0.0.0", 8765).allowed_hosts == ()  # browsers need a name: --allowed-host
    assert bound(settings_for(db, port=9000), "127.0.0.1", 8765).port == 9000  # a port given stays


def test_through_a_real_server_a_rebound_host_gets_400(db):
    with served_like_serve(settings_for(db)) as base:
        port = int(base.rsplit(":", 1)[1])
        assert fetch(port, "GET", "/runs/refund-1", {"Host": f"evil.example:{port}"})[0] == 400
        assert fetch(port, "GET", "/runs/refund-1", {"Host": "127.0.0.1:1"})[0] == 400
        assert fetch(port, "GET", "/runs/refund-1", {"Host": f"localhost:{port}"})[0] == 200


# --- forwarded headers ----------------------------------------------------------------------

ELSEWHERE = ("192.0.2.7", 40000)
PROXY = ("10.0.0.5", 40000)


def test_a_spoofed_forwarded_for_does_not_make_a_client_local(db):
    spoof = {"X-Forwarded-For": "127.0.0.1", "X-Forwarded-Proto": "http"}
    with client_for(make_app(db)) as local, client_for(make_app(db), client=ELSEWHERE) as remote:
        csrf = csrf_of(local.get("/runs/refund-1").text)
        page = remote.get("/runs/refund-1", headers=spoof).text
        assert "acting on a run is allowed only from this machine" in page and 'name="csrf"' not in page
        assert remote.post("/runs/refund-1/resume", data={**FORM, "csrf": csrf}, headers=spoof).status_code == 403
    assert status_of(db, "refund-1") == "paused"


def test_forwarded_headers_count_only_from_a_named_proxy(db):
    app = make_app(db, proxies=["10.0.0.5"], token=TOKEN)
    spoof = {"X-Forwarded-For": "127.0.0.1"}
    with client_for(app, client=ELSEWHERE) as stranger, client_for(app, client=PROXY) as proxy:
        csrf = csrf_of(proxy.get("/runs/refund-1").text)
        # a client that is not the proxy says it is 127.0.0.1: not believed, and the token is needed anyway
        assert stranger.post("/runs/refund-1/resume", data={**FORM, "csrf": csrf}, headers=spoof).status_code == 403
        # through the proxy, a loopback client is not enough either: the token is
        assert proxy.post("/runs/refund-1/resume", data={**FORM, "csrf": csrf}, headers=spoof).status_code == 403
        assert status_of(db, "refund-1") == "paused"
        data = {**FORM, "csrf": csrf, "token": TOKEN}
        answer = proxy.post("/runs/refund-1/resume", data=data, headers={"X-Forwarded-For": "203.0.113.9"})
        assert answer.status_code == 303
    assert status_of(db, "refund-1") == "done"


def test_behind_a_proxy_without_a_token_nobody_approves(db):
    app = make_app(db, proxies=["10.0.0.5"])
    with client_for(app, client=LOCAL) as local:
        page = local.get("/runs/refund-1").text
        assert "behind a proxy, acting on a run needs the viewer&#39;s token" in page and 'name="csrf"' not in page


def test_forwarded_proto_counts_only_from_a_named_proxy(db):
    # viewer.example.com is trusted at 443 only: a request names no port, so its scheme decides
    app = make_app(db, proxies=["10.0.0.0/24"], allowed_hosts=["viewer.example.com:443"])
    tls = {"Host": "viewer.example.com", "X-Forwarded-Proto": "https"}
    with client_for(app, client=PROXY) as proxy, client_for(app, client=ELSEWHERE) as stranger:
        assert proxy.get("/", headers=tls).status_code == 200
        assert proxy.get("/", headers={"Host": "viewer.example.com"}).status_code == 400
        assert stranger.get("/", headers=tls).status_code == 400


def test_through_a_real_server_a_spoofed_forwarded_for_from_127_0_0_2_is_refused(db, monkeypatch):
    # uvicorn's own default would believe X-Forwarded-For from $FORWARDED_ALLOW_IPS
    monkeypatch.setenv("FORWARDED_ALLOW_IPS", "*")
    with served_like_serve(settings_for(db)) as base:
        port = int(base.rsplit(":", 1)[1])
        here = {"Host": f"127.0.0.1:{port}", "Origin": f"http://127.0.0.1:{port}"}
        csrf = csrf_of(fetch(port, "GET", "/runs/refund-1", here)[1])
        form = f"decision=approve&csrf={csrf}"
        spoofed = {**here, "X-Forwarded-For": "127.0.0.1"}
        status, page = fetch(port, "POST", "/runs/refund-1/resume", spoofed, form, source="127.0.0.2")
        assert status == 403 and "only from this machine" in page
        assert status_of(db, "refund-1") == "paused" and runs_kit.REFUNDS == []
        # the same form from this machine goes through (so it was the address that was refused)
        assert fetch(port, "POST", "/runs/refund-1/resume", here, form)[0] == 303
    assert status_of(db, "refund-1") == "done"


def fetch(
    port: int, method: str, path: str, headers: Mapping[str, str], body: str | None = None, source: str = "127.0.0.1"
) -> tuple[int, str]:
    """One raw HTTP request to 127.0.0.1:`port` from the address `source`, with exactly these headers."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10, source_address=(source, 0))
    try:
        conn.putrequest(method, path, skip_host=True, skip_accept_encoding=True)
        sent = dict(headers)
        if body is not None:
            sent |= {"Content-Type": "application/x-www-form-urlencoded", "Content-Length": str(len(body))}
        for name, value in sent.items():
            conn.putheader(name, value)
        conn.endheaders(body.encode() if body is not None else None)
        answer = conn.getresponse()
        return answer.status, answer.read().decode()
    finally:
        conn.close()


@pytest.mark.parametrize("proxies", [["*"], ["proxy.example"], ["10.0.0.0/33"]])
def test_proxies_must_be_addresses(db, proxies):
    with pytest.raises(ValueError, match="ViewerSettings.proxies"):
        settings_for(db, proxies=proxies)


@pytest.mark.parametrize("hosts", [["*"], ["*.example.com"], ["https://viewer.example.com"], ["a b"], "viewer.example"])
def test_allowed_hosts_must_be_host_names(db, hosts):
    with pytest.raises(ValueError, match="ViewerSettings.allowed_hosts"):
        settings_for(db, allowed_hosts=hosts)
