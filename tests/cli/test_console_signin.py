"""`dmq console` over a cluster with security on (TLS and tokens): each viewer signs in with their
own token, and every page reads with that viewer's principal, so the servers' ACLs decide what
each one sees. A real `dmq console` process over a real secured cluster (in-process servers on
loopback, as tests/security starts them), reached with real HTTP (a cookie jar per viewer).

  - no session: every page redirects to the sign-in form;
  - two principals with different ACLs, signed in to the same console at once, see different
    topic and group lists, and a page of the other's topic or group is 403;
  - a bad token (another key, expired) gets a sign-in error that says why, and no session;
  - the session cookie is HttpOnly and SameSite=Strict; the token is in no URL, page or log line;
  - signing out ends the session (the old cookie no longer works);
  - a reset needs --allow-writes AND a principal the servers allow: the viewer's, not the console's.
Without security (tests/cli/test_console_cli.py) nothing changes: no sign-in.
"""

from __future__ import annotations

import http.cookiejar
import re
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Iterator
from typing import Any

import jwt
import pytest

from dmq.client import AdminClient, Producer
from dmq.client.cli.runner import ClusterThread
from dmq.proto import dmq_pb2 as pb
from dmq.proto.security.acls import CLUSTER_RESOURCE, Acl
from tests.cli._console import HTTP_TIMEOUT_S, ConsoleProcess, secure_cluster
from tests.security.conftest import SECRET, token_for

SESSION_COOKIE = "dmq_console_session"


class _NoRedirect(urllib.request.HTTPRedirectHandler):
    def redirect_request(self, *args: Any, **kwargs: Any) -> None:
        return None  # a 303 is returned as it is, so the test sees where it points


class Viewer:
    """One browser: its own cookie jar, redirects not followed."""

    def __init__(self, console: ConsoleProcess) -> None:
        self.base = console.url.rstrip("/")
        self.jar = http.cookiejar.CookieJar()
        self.opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(self.jar), _NoRedirect())
        self.set_cookies: list[str] = []

    def call(self, path: str, form: dict[str, str] | None = None) -> tuple[int, str, dict[str, str]]:
        data = urllib.parse.urlencode(form).encode() if form is not None else None
        request = urllib.request.Request(self.base + path, data=data, method="POST" if form is not None else "GET")
        try:
            with self.opener.open(request, timeout=HTTP_TIMEOUT_S) as answer:
                status, body, headers = answer.status, answer.read().decode(), answer.headers
        except urllib.error.HTTPError as e:
            status, body, headers = e.code, e.read().decode(), e.headers
        self.set_cookies += headers.get_all("Set-Cookie") or []
        return status, body, dict(headers)

    def get(self, path: str) -> tuple[int, str]:
        status, body, _ = self.call(path)
        return status, body

    def form_token(self, path: str) -> str:
        status, body = self.get(path)
        found = re.search(r'name="form_token" value="([^"]+)"', body)
        assert status == 200 and found is not None, (status, body)
        return found.group(1)

    def sign_in(self, token: str, next_path: str = "/") -> tuple[int, str, dict[str, str]]:
        form = {"token": token, "form_token": self.form_token("/signin"), "next": next_path}
        return self.call("/signin", form)

    def session(self) -> str | None:
        return next((c.value for c in self.jar if c.name == SESSION_COOKIE), None)


@pytest.fixture(scope="module")
def secured(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[ClusterThread, str]]:
    """TLS and tokens (and the CA's path); alice may describe the alpha topic (and read it) and
    group, bob the beta ones."""
    with secure_cluster(tmp_path_factory.mktemp("secure-cluster")) as (thread, ca):
        with AdminClient(thread.bootstrap, ssl_cafile=ca, token=token_for("admin")) as admin:
            for name in ("alpha", "beta"):
                admin.create_topic(f"{name}-orders", partitions=1)
                admin.cluster.group_stub().FindOrCreateGroup(
                    pb.FindOrCreateGroupRequest(topic=f"{name}-orders", app_id="app"), timeout=HTTP_TIMEOUT_S)
            with Producer(thread.bootstrap, ssl_cafile=ca, token=token_for("admin")) as p:
                for i in range(4):
                    p.send("alpha-orders", b"a%d" % i, partition=0).get(HTTP_TIMEOUT_S)
            admin.add_acls([
                Acl.parse(who, "cluster", CLUSTER_RESOURCE, "describe") for who in ("alice", "bob")
            ] + [
                Acl.parse("alice", "topic", "alpha-orders", "describe"),
                Acl.parse("alice", "topic", "alpha-orders", "read"),  # the message browser
                Acl.parse("alice", "group", "G_alpha-orders_app", "describe"),
                Acl.parse("bob", "topic", "beta-orders", "describe"),
                Acl.parse("bob", "group", "G_beta-orders_app", "describe"),
            ])
        yield thread, ca


@pytest.fixture(scope="module")
def cluster(secured: tuple[ClusterThread, str]) -> ClusterThread:
    return secured[0]


@pytest.fixture(scope="module")
def ca(secured: tuple[ClusterThread, str]) -> str:
    return secured[1]


@pytest.fixture(scope="module")
def console(cluster: ClusterThread, ca: str) -> Iterator[ConsoleProcess]:
    """Started as an operator would on a secured cluster: the CA, no token of its own."""
    proc = ConsoleProcess(cluster.bootstrap, env={"DMQ_SSL_CAFILE": ca})
    try:
        yield proc
    finally:
        assert proc.stop() == 0, proc.stderr


def test_without_a_session_every_page_redirects_to_sign_in(console: ConsoleProcess) -> None:
    viewer = Viewer(console)
    for path in ("/", "/topics", "/groups", "/groups/G_alpha-orders_app", "/topics/alpha-orders/messages?limit=5"):
        status, _body, headers = viewer.call(path)
        assert status == 303, (path, status)
        target = urllib.parse.urlsplit(headers["Location"])
        assert target.path == "/signin" and urllib.parse.parse_qs(target.query)["next"] == [path], headers
    status, body = viewer.get("/signin")
    assert status == 200 and 'type="password"' in body and 'name="token"' in body
    # A write without a session is not taken either.
    status, _body, _headers = viewer.call("/groups/G_alpha-orders_app/reset", {"to": "earliest"})
    assert status == 303


def test_two_principals_see_what_their_own_acls_allow(console: ConsoleProcess) -> None:
    alice, bob = Viewer(console), Viewer(console)
    status, _body, headers = alice.sign_in(token_for("alice"), next_path="/groups")
    assert status == 303 and headers["Location"] == "/groups", (status, headers)
    assert bob.sign_in(token_for("bob"))[0] == 303
    assert alice.session() is not None and bob.session() is not None and alice.session() != bob.session()
    # Both sessions are live at once: each page reads with its own viewer's principal.
    for viewer, mine, theirs in ((alice, "alpha", "beta"), (bob, "beta", "alpha"), (alice, "alpha", "beta")):
        status, topics = viewer.get("/topics")
        assert status == 200 and f"{mine}-orders" in topics and f"{theirs}-orders" not in topics, topics
        status, groups = viewer.get("/groups")
        assert status == 200 and f"G_{mine}-orders_app" in groups and f"{theirs}-orders" not in groups, groups
        status, body = viewer.get(f"/topics/{theirs}-orders")
        assert status == 403 and "may not" in body, body
        assert viewer.get(f"/groups/G_{theirs}-orders_app")[0] == 403
        assert viewer.get(f"/topics/{mine}-orders")[0] == 200
        assert viewer.get(f"/groups/G_{mine}-orders_app")[0] == 200
    status, page = alice.get("/")
    assert status == 200 and "alice" in page and 'action="/signout"' in page  # who is signed in, and a way out
    # Signed in or not, this console was started read-only.
    status, body, _ = alice.call("/groups/G_alpha-orders_app/reset", {"to": "earliest", "execute": "yes",
                                                                      "form_token": alice.form_token("/")})
    assert status == 403 and "--allow-writes" in body, body


def test_a_bad_token_gets_a_sign_in_error_and_no_session(console: ConsoleProcess) -> None:
    for token, why in ((token_for("alice", secret="another-secret-that-is-long-enough-0123"), "signature"),
                       (_expired_token("alice"), "expired"),
                       ("not-a-jwt", "token")):
        viewer = Viewer(console)
        status, body, _headers = viewer.sign_in(token)
        assert status == 401, (status, body)
        assert "Sign in" in body and why in body.lower() and 'class="error"' in body, body
        assert token not in body
        assert viewer.session() is None
        assert viewer.call("/topics")[0] == 303
    status, body, _headers = Viewer(console).sign_in("")
    assert status == 400 and "token" in body


def test_the_session_cookie_is_http_only_and_same_site_strict_and_the_token_is_nowhere_else(
        cluster: ClusterThread, ca: str) -> None:
    console = ConsoleProcess(cluster.bootstrap, "--log-level", "debug", env={"DMQ_SSL_CAFILE": ca})
    token = token_for("alice")
    try:
        viewer = Viewer(console)
        status, body, headers = viewer.sign_in(token)
        assert status == 303 and token not in headers["Location"] and token not in body
        cookies = [c for c in viewer.set_cookies if c.startswith(SESSION_COOKIE + "=")]
        assert len(cookies) == 1, viewer.set_cookies
        attributes = {a.strip().split("=")[0].lower(): a.strip() for a in cookies[0].split(";")[1:]}
        assert "httponly" in attributes and attributes["samesite"].lower() == "samesite=strict", cookies
        assert token not in cookies[0]
        for path in ("/", "/topics", "/groups", "/topics/alpha-orders/messages"):
            status, page = viewer.get(path)
            assert status == 200 and token not in page, path
    finally:
        assert console.stop() == 0, console.stderr
    assert token not in console.stderr and token.split(".")[1] not in console.stderr


def test_signing_out_ends_the_session(console: ConsoleProcess) -> None:
    viewer = Viewer(console)
    assert viewer.sign_in(token_for("alice"))[0] == 303
    old = viewer.session()
    assert old is not None and viewer.get("/topics")[0] == 200
    status, _body, headers = viewer.call("/signout", {"form_token": viewer.form_token("/topics")})
    assert status == 303 and headers["Location"] == "/signin"
    assert viewer.session() is None
    assert viewer.call("/topics")[0] == 303
    # The old session id is dead on the server too, not only forgotten by this browser.
    replay = Viewer(console)
    replay.jar.set_cookie(_cookie(SESSION_COOKIE, old, urllib.parse.urlsplit(console.url).hostname or ""))
    assert replay.call("/topics")[0] == 303


def _expired_token(principal: str) -> str:
    """Signed with the cluster's secret, expired an hour ago (well past the servers' 30 s leeway)."""
    return jwt.encode({"sub": principal, "exp": int(time.time()) - 3600}, SECRET, algorithm="HS256")


def _cookie(name: str, value: str, host: str) -> http.cookiejar.Cookie:
    return http.cookiejar.Cookie(0, name, value, None, False, host, False, False, "/", True, False, None, False,
                                 None, None, {})


def test_resets_need_allow_writes_and_a_viewer_the_servers_allow(cluster: ClusterThread, ca: str) -> None:
    with AdminClient(cluster.bootstrap, ssl_cafile=ca, token=token_for("admin")) as a:
        group = a.cluster.group_stub().FindOrCreateGroup(
            pb.FindOrCreateGroupRequest(topic="alpha-orders", app_id="resets"), timeout=HTTP_TIMEOUT_S).group_id
        a.commit_group_offsets(group, {("alpha-orders", 0): 3})
        a.add_acls([Acl.parse("alice", "group", group, "describe")])
    writer = ConsoleProcess(cluster.bootstrap, "--allow-writes", env={"DMQ_SSL_CAFILE": ca})
    form = {"to": "earliest"}
    try:
        alice, admin = Viewer(writer), Viewer(writer)
        assert alice.sign_in(token_for("alice"))[0] == 303 and admin.sign_in(token_for("admin"))[0] == 303
        status, body, _ = alice.call(f"/groups/{group}/reset", {**form, "form_token": alice.form_token(f"/groups/{group}")})
        assert status == 200 and "Dry run" in body, body  # a preview reads only
        status, body, _ = alice.call(f"/groups/{group}/reset", {**form, "execute": "yes",
                                                                 "form_token": alice.form_token(f"/groups/{group}")})
        assert status == 403 and "delete" in body.lower(), body  # the servers refuse alice
        # Another viewer's form token is not this session's.
        status, body, _ = admin.call(f"/groups/{group}/reset", {**form, "execute": "yes",
                                                                 "form_token": alice.form_token(f"/groups/{group}")})
        assert status == 403 and "form_token" in body, body
        status, body, _ = admin.call(f"/groups/{group}/reset", {**form, "execute": "yes",
                                                                 "form_token": admin.form_token(f"/groups/{group}")})
        assert status == 200 and "Done" in body, body
    finally:
        assert writer.stop() == 0, writer.stderr
    with AdminClient(cluster.bootstrap, ssl_cafile=ca, token=token_for("admin")) as a:
        assert a.describe_group(group).committed() == {0: 0}


def test_off_loopback_the_warning_is_about_tokens_over_plain_http(cluster: ClusterThread, ca: str) -> None:
    console = ConsoleProcess(cluster.bootstrap, "--host", "0.0.0.0", env={"DMQ_SSL_CAFILE": ca})
    try:
        assert Viewer(console).get("/signin")[0] == 200
    finally:
        assert console.stop() == 0, console.stderr
    assert "tokens cross the network in clear" in console.stderr and "0.0.0.0" in console.stderr, console.stderr
    assert "no login of its own" not in console.stderr  # it has one
