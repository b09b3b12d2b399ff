"""Safe defaults (issue 18): loopback without security as today; anything else needs TLS and
authentication, or --insecure (with a warning)."""

from __future__ import annotations

from click.testing import CliRunner

from dmq.client.cli import cli


def test_dmq_server_refuses_a_public_address_without_security(tmp_path):
    result = CliRunner().invoke(cli, ["server", "--host", "0.0.0.0", "--port", "0", "--data-dir", str(tmp_path / "d")])
    assert result.exit_code == 1
    assert "without TLS and authentication" in result.output and "--insecure" in result.output
    assert not (tmp_path / "d").exists()  # refused before anything was created


def test_server_security_flags_are_checked_before_starting(tmp_path):
    (tmp_path / "short").write_text("too-short")
    result = CliRunner().invoke(cli, ["server", "--port", "0", "--data-dir", str(tmp_path / "d"),
                                      "--token-secret-file", str(tmp_path / "short")])
    assert result.exit_code == 2 and "at least 32 characters" in result.output
    (tmp_path / "cert.pem").write_text("x")
    result = CliRunner().invoke(cli, ["server", "--port", "0", "--data-dir", str(tmp_path / "d"),
                                      "--tls-cert", str(tmp_path / "cert.pem")])
    assert result.exit_code == 2 and "tls_keyfile" in result.output
