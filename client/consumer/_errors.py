"""Consumer-only errors, rooted in dmq.client.errors.DMQError like every client error."""

from __future__ import annotations

from dmq.client.errors import DMQError


class InvalidConfigError(DMQError, ValueError):
    """A ConsumerConfig value is out of range; the message names the setting to change."""


class CorruptRecordError(DMQError):
    """Fetched records failed their CRC or format check; the message names the partition."""
