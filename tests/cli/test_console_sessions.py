"""The console's signed-in sessions (dmq.client.cli.console._viewers.Sessions), on a fake clock with
stand-in clients that count their closes: the bounds (a cap with least-recently-used eviction, an
idle expiry) and the ownership of each session's client (closed exactly once: at once when no page
holds it, else by the last page out). The HTTP flows over real servers are in
test_console_signin.py; the one path they cannot reach without waiting on the clock (a token
refused mid-session) is here, with the application in process and a stand-in client."""

from __future__ import annotations

import asyncio
import re
from typing import cast

import pytest
from aiohttp.test_utils import TestClient, TestServer

from dmq.client.admin import AdminClient
from dmq.client.cli.console import ConsoleSettings, create_app
from dmq.client.cli.console._app import SESSION_COOKIE, ConsoleServer
from dmq.client.cli.console._viewers import Session, Sessions
from dmq.client.errors import AuthorizationError
from tests.clocks import ManualClock


class FakeClient:
    def __init__(self, name: str) -> None:
        self.name = name
        self.closes = 0

    def close(self) -> None:
        self.closes += 1


def _add(sessions: Sessions, name: str) -> tuple[Session, FakeClient]:
    client = FakeClient(name)
    return sessions.add(name, cast(AdminClient, client)), client


def test_past_the_cap_the_least_recently_used_session_ends_and_its_client_is_closed() -> None:
    clock = ManualClock()
    sessions = Sessions(max_sessions=2, idle_s=60, clock=clock)
    a, a_client = _add(sessions, "alice")
    b, b_client = _add(sessions, "bob")
    clock.now += 1
    taken = sessions.take(a.session_id)  # alice used since bob: bob is the least recently used
    assert taken is a
    sessions.give_back(a)
    c, _c_client = _add(sessions, "carol")
    assert len(sessions) == 2 and repr(sessions) == "<Sessions 2/2 idle_s=60>"
    assert sessions.take(b.session_id) is None and b_client.closes == 1 and b.ended
    assert a_client.closes == 0 and sessions.take(a.session_id) is a
    assert sessions.take(c.session_id) is c


def test_an_idle_session_ends_on_the_next_access_or_sweep() -> None:
    clock = ManualClock()
    sessions = Sessions(max_sessions=10, idle_s=60, clock=clock)
    a, a_client = _add(sessions, "alice")
    b, b_client = _add(sessions, "bob")
    clock.now += 59
    got = sessions.take(b.session_id)
    assert got is b
    sessions.give_back(b)
    clock.now += 1  # alice idle 60 s, bob 1 s
    assert sessions.sweep() == 1 and a_client.closes == 1 and b_client.closes == 0
    assert sessions.take(a.session_id) is None
    clock.now += 60
    assert sessions.take(b.session_id) is None and b_client.closes == 1  # found idle on access
    assert len(sessions) == 0


def test_a_session_ended_under_a_page_is_closed_by_the_last_page_out() -> None:
    clock = ManualClock()
    sessions = Sessions(max_sessions=1, idle_s=60, clock=clock)
    a, a_client = _add(sessions, "alice")
    first, second = sessions.take(a.session_id), sessions.take(a.session_id)
    assert first is a and second is a and a.pages == 2
    sessions.end(a.session_id)  # signed out while two pages read with its client
    assert a_client.closes == 0 and sessions.take(a.session_id) is None
    sessions.give_back(a)
    assert a_client.closes == 0
    sessions.give_back(a)
    assert a_client.closes == 1
    # Evicted by the cap while in use: the same.
    b, b_client = _add(sessions, "bob")
    assert sessions.take(b.session_id) is b
    _c, _ = _add(sessions, "carol")
    assert b.ended and b_client.closes == 0
    sessions.give_back(b)
    assert b_client.closes == 1


def test_close_ends_every_session_once_and_ids_are_unguessable() -> None:
    sessions = Sessions(max_sessions=5, idle_s=60, clock=ManualClock())
    made = [_add(sessions, f"p{i}") for i in range(5)]
    ids = {s.session_id for s, _ in made}
    assert len(ids) == 5 and all(len(i) >= 40 for i in ids)  # 32 random bytes, URL-safe base64
    assert len({s.form_token for s, _ in made}) == 5  # each session guards its own forms
    sessions.end("no-such-session")
    sessions.end(None)
    sessions.close()
    assert [c.closes for _, c in made] == [1] * 5 and len(sessions) == 0
    assert "session_id" not in repr(made[0][0]) and "form_token" not in repr(made[0][0])


@pytest.mark.parametrize(("max_sessions", "idle_s"), [(0, 60.0), (1, 0.0)])
def test_bounds_must_be_positive(max_sessions: int, idle_s: float) -> None:
    with pytest.raises(ValueError, match="max_sessions"):
        Sessions(max_sessions=max_sessions, idle_s=idle_s)


class ExpiringAdmin:
    """Takes the token at sign-in, then refuses it as the servers do once it has expired."""

    def __init__(self) -> None:
        self.calls = 0
        self.closes = 0

    def list_topics(self) -> list[object]:
        self.calls += 1
        if self.calls > 1:
            raise AuthorizationError("the token expired at 2026-01-02T03:04:05Z: get a new one", code="UNAUTHENTICATED")
        return []

    def close(self) -> None:
        self.closes += 1


def test_a_token_the_servers_stop_taking_ends_the_session_and_asks_to_sign_in_again(
        monkeypatch: pytest.MonkeyPatch) -> None:
    """The console's own handling of a refusal mid-session (over real servers this needs a token
    to expire between two pages: a wait on the clock), with the application in process."""
    admin = ExpiringAdmin()
    monkeypatch.setattr(ConsoleServer, "client", lambda self, token=None: admin)
    app = create_app(ConsoleSettings("127.0.0.1:9", sign_in=True))

    async def scenario() -> None:
        async with TestClient(TestServer(app)) as client:
            form = await (await client.get("/signin")).text()
            found = re.search(r'name="form_token" value="([^"]+)"', form)
            assert found is not None
            signed = await client.post("/signin", data={"token": "header.payload.signature", "next": "/topics",
                                                        "form_token": found.group(1)}, allow_redirects=False)
            assert signed.status == 303 and signed.headers["Location"] == "/topics"
            assert SESSION_COOKIE in signed.cookies
            refused = await client.get("/topics", allow_redirects=False)
            assert refused.status == 303, await refused.text()
            assert refused.headers["Location"] == "/signin?next=%2Ftopics&ended=yes"
            assert refused.cookies[SESSION_COOKIE].value == ""  # the browser is told to drop it
            assert admin.closes == 1  # the session ended and its client was closed
            again = await client.get(refused.headers["Location"])
            assert again.status == 200 and "Your session ended" in await again.text()
            client.session.cookie_jar.update_cookies({SESSION_COOKIE: signed.cookies[SESSION_COOKIE].value})
            assert (await client.get("/topics", allow_redirects=False)).status == 303  # dead on the server too

    asyncio.run(scenario())
