"""The servers' half of security (DESIGN.md "Security"); the half clients share (credentials,
tokens, ACL entries) is dmq.proto.security.

  rpc_table    the one table of what every RPC needs
  quotas       token buckets per principal (throttling by delay)
  interceptor  the server interceptor: authenticate, authorize, throttle, audit
"""
