"""Security shared by servers and clients (DESIGN.md "Security").

  settings     ServerSecurity / ClientSecurity, credentials and channels (TLS, tokens)
  token_channels  channels that send the bearer token with every call
  tokens       signed tokens (JWT): issuing and verifying
  acls         access-control entries and the allow/deny decision

What only servers run (the RPC table, quotas, the interceptor) is dmq.proto.server.security.
"""
