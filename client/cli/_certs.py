"""Development certificates: a CA, a server certificate and client certificates (cryptography).

`dmq certs create DIR` writes, all PEM, keys readable by the owner only:
  ca.pem / ca.key            a self-signed CA (10 years);
  server.pem / server.key    CN = the cluster principal ("dmq-cluster"), SAN 127.0.0.1, ::1,
                             localhost and any --host given; usable as a server certificate and as
                             the nodes' client certificate for mutual TLS between them;
  <name>.pem / <name>.key    one client certificate per --client NAME (CN = NAME, the principal).
For trying TLS in one command; a production cluster takes its certificates from its own CA.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
import pathlib
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

CA_DAYS = 3650
LEAF_DAYS = 825


@dataclass(frozen=True)
class Issued:
    certfile: pathlib.Path
    keyfile: pathlib.Path


def _key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _write(directory: pathlib.Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey) -> Issued:
    certfile, keyfile = directory / f"{name}.pem", directory / f"{name}.key"
    certfile.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    fd = os.open(keyfile, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return Issued(certfile, keyfile)


def _builder(subject: str, issuer: x509.Name, public_key: ec.EllipticCurvePublicKey, days: int) -> x509.CertificateBuilder:
    now = datetime.datetime.now(datetime.UTC)
    return (x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, subject)]))
            .issuer_name(issuer)
            .public_key(public_key)
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=days)))


def create_ca(directory: pathlib.Path, name: str = "DMQ development CA") -> tuple[Issued, x509.Certificate, ec.EllipticCurvePrivateKey]:
    key = _key()
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    cert = (_builder(name, subject, key.public_key(), CA_DAYS)
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                                         content_commitment=False, key_encipherment=False, data_encipherment=False,
                                         key_agreement=False, encipher_only=False, decipher_only=False), critical=True)
            .sign(key, hashes.SHA256()))
    return _write(directory, "ca", cert, key), cert, key


def issue(directory: pathlib.Path, file_name: str, common_name: str, ca_cert: x509.Certificate,
          ca_key: ec.EllipticCurvePrivateKey, *, hosts: tuple[str, ...] = (), server: bool = False) -> Issued:
    key = _key()
    usages = [ExtendedKeyUsageOID.CLIENT_AUTH] + ([ExtendedKeyUsageOID.SERVER_AUTH] if server else [])
    builder = (_builder(common_name, ca_cert.subject, key.public_key(), LEAF_DAYS)
               .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
               .add_extension(x509.ExtendedKeyUsage(usages), critical=False))
    if server:
        names: list[x509.GeneralName] = []
        for host in dict.fromkeys(("127.0.0.1", "::1", "localhost", *hosts)):
            try:
                names.append(x509.IPAddress(ipaddress.ip_address(host)))
            except ValueError:
                names.append(x509.DNSName(host))
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return _write(directory, file_name, builder.sign(ca_key, hashes.SHA256()), key)


def create_dev_certs(directory: pathlib.Path, *, clients: tuple[str, ...] = ("admin",), hosts: tuple[str, ...] = (),
                     cluster_principal: str = "dmq-cluster") -> dict[str, Issued]:
    """The CA, the server certificate and the client certificates in `directory` (see the module)."""
    directory.mkdir(parents=True, exist_ok=True)
    ca, ca_cert, ca_key = create_ca(directory)
    issued = {"ca": ca, "server": issue(directory, "server", cluster_principal, ca_cert, ca_key, hosts=hosts, server=True)}
    for name in clients:
        if name in issued or not name.replace("-", "").replace("_", "").replace(".", "").isalnum():
            raise ValueError(f"client name {name!r}: use letters, digits, '-', '_' or '.', and not 'ca' or 'server'")
        issued[name] = issue(directory, name, name, ca_cert, ca_key)
    return issued
