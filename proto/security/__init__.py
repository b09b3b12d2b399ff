"""Security shared by servers and clients (DESIGN.md "Security").

  settings     ServerSecurity / ClientSecurity, credentials and channels (TLS, tokens)
  token_channels  channels that send the bearer token with every call
  tokens       signed tokens (JWT): issuing and verifying
  acls         access-control entries and the allow/deny decision
  rpc_table    the one table of what every RPC needs
  quotas       token buckets per principal (throttling by delay)
  interceptor  the server interceptor: authenticate, authorize, throttle, audit
"""
