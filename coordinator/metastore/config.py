"""Which metadata store a coordinator uses: `--metadata-store` as a URL.

  (none) or `sqlite`                       <data_dir>/coordinator.sqlite, the embedded default
  etcd://host:port[,host:port...][/prefix] etcd, keys under /dmq/<prefix>/ (default prefix: default)
"""

from __future__ import annotations

import pathlib

from dmq.coordinator.metastore.base import MetadataStore
from dmq.coordinator.metastore.etcd import EtcdMetadataStore, EtcdSettings, EtcdUrlError, parse_etcd_url
from dmq.coordinator.store import CoordinatorStore

SQLITE_FILE = "coordinator.sqlite"


def make_metadata_store(
    url: str | None,
    data_dir: pathlib.Path,
    *,
    etcd_username: str | None = None,
    etcd_password: str | None = None,
    etcd_ca_file: pathlib.Path | None = None,
    etcd_cert_file: pathlib.Path | None = None,
    etcd_key_file: pathlib.Path | None = None,
) -> MetadataStore:
    """The store `url` names (not opened yet). ValueError (EtcdUrlError) names what is wrong."""
    if url is None or url == "sqlite":
        if any(v is not None for v in (etcd_username, etcd_password, etcd_ca_file, etcd_cert_file, etcd_key_file)):
            raise EtcdUrlError("the --etcd-* options need --metadata-store etcd://…")
        return CoordinatorStore(pathlib.Path(data_dir) / SQLITE_FILE)
    if not url.startswith("etcd://"):
        raise EtcdUrlError(f"--metadata-store {url!r}: expected 'sqlite' or etcd://host:port[,host:port...][/prefix]")
    if (etcd_username is None) != (etcd_password is None):
        raise EtcdUrlError("--etcd-user and --etcd-password go together")
    endpoints, prefix = parse_etcd_url(url)
    return EtcdMetadataStore(
        EtcdSettings(
            endpoints,
            prefix,
            username=etcd_username,
            password=etcd_password,
            ca_file=etcd_ca_file,
            cert_file=etcd_cert_file,
            key_file=etcd_key_file,
        )
    )
