"""The token leeway is a setting (`--token-leeway-s`, default 30 s): a token that expired a few
seconds ago is still accepted with the default and refused with 0, through the real CLI against
real `dmq server` processes."""

from __future__ import annotations

import pathlib
import time

import pytest

from dmq.proto.security.tokens import create_token
from tests.cli.conftest import run_dmq, wait_for
from tests.cli.test_tls_mismatch_cli import Server

SECRET = "s3cret-for-tests-only-0123456789abcdef"


@pytest.mark.parametrize("leeway_args, accepted", [((), True), (("--token-leeway-s", "0"), False)])
def test_a_token_just_expired_is_judged_by_the_leeway(tmp_path: pathlib.Path, leeway_args: tuple[str, ...],
                                                       accepted: bool) -> None:
    (tmp_path / "secret").write_text(SECRET)
    srv = Server(tmp_path, "--token-secret-file", str(tmp_path / "secret"), "--super-users", "admin", *leeway_args)
    try:
        fresh = create_token("admin", ttl_s=3600, secret=SECRET)
        wait_for(lambda: run_dmq("--token", fresh, "health", bootstrap=srv.bootstrap).returncode == 0,
                 "the server to be healthy")
        # expired 5 s ago: well inside the default 30 s, outside a leeway of 0
        stale = create_token("admin", ttl_s=60, secret=SECRET, now_s=time.time() - 65)
        result = run_dmq("--token", stale, "topics", "list", bootstrap=srv.bootstrap)
        if accepted:
            assert result.returncode == 0, result
        else:
            assert result.returncode == 1 and "expired" in result.stderr, result
    finally:
        srv.stop()


def test_the_leeway_is_bounded() -> None:
    result = run_dmq("server", "--port", "0", "--token-leeway-s", "601")
    assert result.returncode == 2 and "--token-leeway-s" in result.stderr, result
