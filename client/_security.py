"""The clients' security settings: TLS files and a token, from keywords or the environment.

Every client takes the same keywords (kafka-python's names where it has them):
  ``security_protocol``  "PLAINTEXT" or "SSL" (implied by any ssl_* setting);
  ``ssl_cafile``         the CA that signed the servers' certificates;
  ``ssl_certfile`` / ``ssl_keyfile``  a client certificate (clusters with mutual TLS);
  ``token``              a signed token naming the principal (``dmq tokens create``).
Each falls back to an environment variable (DMQ_TOKEN, DMQ_SSL_CAFILE, DMQ_SSL_CERTFILE,
DMQ_SSL_KEYFILE), so a container or a Spark executor is configured once. They reach the one place
channels are made, ``Cluster`` (dmq.client._cluster), which asks the environment itself when a
client passes nothing. The token is never logged or shown in a repr.
"""

from __future__ import annotations

from collections.abc import MutableMapping
from typing import Any

from dmq.client.errors import InvalidConfigError
from dmq.proto.security.settings import ClientSecurity, SecurityConfigError

__all__ = ["SECURITY_SETTINGS", "client_security", "pop_security"]

SECURITY_SETTINGS = frozenset({"security_protocol", "ssl_cafile", "ssl_certfile", "ssl_keyfile", "token"})


def client_security(settings: dict[str, Any] | None = None) -> ClientSecurity | None:
    """ClientSecurity from the given security keywords over the environment; None when neither
    names any. InvalidConfigError names the bad setting."""
    try:
        return ClientSecurity.from_settings(settings)
    except SecurityConfigError as e:
        raise InvalidConfigError(str(e)) from None


def pop_security(settings: MutableMapping[str, Any]) -> ClientSecurity | None:
    """Take the security keywords out of a client's extra keywords (before the unknown ones are
    refused) and make them into ClientSecurity (see client_security)."""
    return client_security({k: settings.pop(k) for k in list(settings) if k in SECURITY_SETTINGS})
