"""`dmq broker ...` whose replica fetcher never fetches internal offsets logs (dmq.broker.offsets):
a follower that keeps up with the data but not with the commits beside it (issue 28), for
test_offsets_isr_restart.py. Arguments: those of `python -m dmq.client.cli`."""

from __future__ import annotations

from dmq.broker.offsets import is_offsets_log
from dmq.broker.replication import fetcher
from dmq.client.cli import main

_ready = fetcher.LeaderFetcher._ready


def _data_only(self: fetcher.LeaderFetcher) -> list[fetcher.Replica]:
    return [r for r in _ready(self) if not is_offsets_log(r.topic)]


fetcher.LeaderFetcher._ready = _data_only  # type: ignore[method-assign]
main()
