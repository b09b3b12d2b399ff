"""The Broker service served by one servicer per room (dmq.broker.servicers): every method of the
service has exactly one servicer, the rooms keep their own methods, and the security interceptor's
RPC table names every method the servicers serve."""

from __future__ import annotations

import pytest

from dmq.broker.events.service import EventStoreServicer
from dmq.broker.queue.service import QueueServicer
from dmq.broker.service import BrokerService
from dmq.broker.servicers import BROKER_METHODS, BrokerRpcs
from dmq.proto.server.security.rpc_table import RULES
from dmq.proto.wire import BROKER_SERVICE


class _Host:
    """What the servicers' constructors read before any call (nothing but these)."""

    broker_id = 7
    notifier = object()
    traffic = object()


def _servicers() -> tuple[BrokerService, QueueServicer, EventStoreServicer]:
    host = _Host()
    return BrokerService(host), QueueServicer(host), EventStoreServicer(host)  # type: ignore[arg-type]


def test_every_broker_method_is_served_by_exactly_one_servicer() -> None:
    data, queue, events = _servicers()
    rpcs = BrokerRpcs(data, queue, events)
    assert set(rpcs.owners) == set(BROKER_METHODS)
    assert {n for n, s in rpcs.owners.items() if s is queue} == {n for n in BROKER_METHODS if n.startswith("Queue")}
    assert {n for n, s in rpcs.owners.items() if s is events} == {n for n in BROKER_METHODS if n.startswith("Event")}
    assert rpcs.owners["Produce"] is data and rpcs.owners["UpdatePartitionStates"] is data
    # what the generated registration reads: the owner's bound handler
    assert rpcs.QueuePop.__self__ is queue and rpcs.EventAppend.__self__ is events and rpcs.Fetch.__self__ is data


def test_a_method_with_no_servicer_or_two_fails_registration() -> None:
    data, queue, events = _servicers()
    with pytest.raises(RuntimeError, match=r"Broker\.QueuePop must be served by exactly one servicer, got none"):
        BrokerRpcs(data, events)
    with pytest.raises(RuntimeError, match=r"Broker\.QueuePop .* got QueueServicer, QueueServicer"):
        BrokerRpcs(data, queue, events, QueueServicer(_Host()))  # type: ignore[arg-type]


def test_the_rpc_table_knows_every_method_the_servicers_serve() -> None:
    data, queue, events = _servicers()
    served = {f"/{BROKER_SERVICE}/{name}" for name in BrokerRpcs(data, queue, events).owners}
    assert served - set(RULES) == set()
