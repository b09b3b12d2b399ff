"""The brokers' replication settings and their defaults (`dmq broker --replica-...`), apart from the
replica manager so the CLI can show them without importing gRPC."""

# A follower not caught up with its leader for this long leaves the in-sync set (Kafka's
# replica.lag.time.max.ms, whose default is 30 s; 10 s here, as the session timeout is 6 s).
REPLICA_LAG_TIME_MAX_MS_DEFAULT = 10_000
# An acks=all produce waits at most this long for the in-sync set (less when its deadline is
# nearer), then fails retriable: the client retries, an idempotent producer without duplicates.
REPLICA_ACK_TIMEOUT_MS_DEFAULT = 15_000
