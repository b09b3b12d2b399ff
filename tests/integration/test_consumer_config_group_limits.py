"""Issue 13: ConsumerConfig accepted a session_timeout_ms (or max_poll_interval_ms) the group
coordinator refuses, and the consumer then failed at its first subscribe. It is now refused when the
config is built, naming the setting and the coordinator's own range; the coordinator's JoinGroup
checks the same numbers (the limits are read from its GroupConfig, not restated here)."""

from __future__ import annotations

import dataclasses

import pytest

from dmq.client.consumer import ConsumerConfig, InvalidConfigError
from dmq.coordinator.group.group import GroupConfig


def coordinator_range(name: str) -> tuple[int, int]:
    defaults = {f.name: f.default for f in dataclasses.fields(GroupConfig)}
    return int(defaults[f"min_{name}"]), int(defaults[f"max_{name}"])  # type: ignore[call-overload]


def config(**kw: int) -> ConsumerConfig:
    kw.setdefault("heartbeat_interval_ms", 300)  # a third of the smallest session
    return ConsumerConfig(metadata_service_url="127.0.0.1:9091", group_id="app", **kw)


@pytest.mark.parametrize("name", ["session_timeout_ms", "max_poll_interval_ms"])
def test_group_timeouts_outside_the_coordinators_range_are_refused_naming_it(name: str) -> None:
    low, high = coordinator_range(name)
    for ok in (low, high):
        assert getattr(config(**{name: ok}), name) == ok
    for bad in (low - 1, high + 1):
        with pytest.raises(InvalidConfigError) as info:
            config(**{name: bad})
        assert f"{name} must be within {low}..{high} ms" in str(info.value), str(info.value)
        assert str(bad) in str(info.value)
