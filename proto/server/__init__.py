"""The runtime both servers share, beside the wire contract (DESIGN.md "Layout").

The broker and the coordinator never import each other, so what they both run lives here: the
server interceptors (security in security/, per-address connection limits, the decode guard, RPC
metrics) and the wrapping they share (handlers), the servers' gRPC options, the one error mapping
(server_errors: DomainError and FieldError -> gRPC status), the domain error base, and the data
directory lock. The client library never imports this package (tests/unit/test_import_rules.py);
only the programs that start servers in-process (dmq.client.cli.runner, dmq.client.cli.servers) do.
"""
