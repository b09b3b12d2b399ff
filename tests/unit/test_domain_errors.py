"""The servers' one error contract (dmq.proto.server.domain_errors, dmq.proto.server.server_errors): every
DomainError code maps to the gRPC status of its name, rpc_handler answers a DomainError and a
FieldError in one place, and the domain errors of every layer carry a code of that scheme."""

from __future__ import annotations

import inspect

import grpc
import pytest
from _rpc_fakes import Log, Status, call

from dmq.broker.events import errors as event_errors
from dmq.broker.events import registry as event_registry
from dmq.broker.queue import errors as queue_errors
from dmq.client import errors as client_errors
from dmq.coordinator import broker_calls, membership, metadata, metadata_errors, principal_limits, topic_admin
from dmq.coordinator.controller import leadership, partition_states
from dmq.coordinator.group import errors as group_errors
from dmq.proto import error_details
from dmq.proto.names import FieldError, check_topic_name
from dmq.proto.server.domain_errors import DomainError, ErrorCode
from dmq.proto.server.server_errors import domain_status, rpc_handler, status_code


def _answer(error: Exception, log: Log | None = None) -> Status:
    class Service:
        @rpc_handler(log=log or Log())
        async def Call(self, request, context):  # noqa: N802
            raise error

    _, aborted = call(Service().Call, object())
    assert aborted is not None
    return aborted


@pytest.mark.parametrize("code", list(ErrorCode), ids=lambda c: c.name)
def test_every_domain_code_maps_to_the_status_of_its_name(code: ErrorCode) -> None:
    assert status_code(code) is grpc.StatusCode[code.name]
    assert _answer(DomainError("refused", code=code))[0] is grpc.StatusCode[code.name]


def test_every_status_but_ok_has_a_domain_code() -> None:
    # a broker's refusal the coordinator relays (broker_calls.BrokerRefusedError) may carry any of them
    assert {c.name for c in grpc.StatusCode if c is not grpc.StatusCode.OK} == {c.name for c in ErrorCode}


def test_a_domain_error_is_answered_with_its_message_reason_and_extra_metadata() -> None:
    error = event_errors.ConditionFailedError("an event after 7 matches", 9)
    code, message, trailing = _answer(error)
    assert code is grpc.StatusCode.FAILED_PRECONDITION and message == "an event after 7 matches"
    assert trailing == (
        (error_details.REASON_KEY, error_details.APPEND_CONDITION_FAILED),
        (error_details.CONFLICT_POSITION_KEY, "9"),
    )


def test_a_field_error_is_invalid_argument_naming_the_field() -> None:
    with pytest.raises(FieldError) as info:
        check_topic_name("", field="requests[3].topic")
    code, message, trailing = _answer(info.value)
    assert code is grpc.StatusCode.INVALID_ARGUMENT and message == "requests[3].topic: topic name must not be empty"
    assert trailing == ()


def test_an_internal_domain_error_is_logged_as_a_bug() -> None:
    log = Log()
    assert _answer(group_errors.IllegalStateTransitionError("STABLE -> EMPTY"), log)[0] is grpc.StatusCode.INTERNAL
    assert [event for event, _ in log.lines] == ["handler failed"]


def test_other_errors_are_not_domain_errors() -> None:
    assert domain_status(ValueError("x")) is None and domain_status(KeyError("x")) is None


def _domain_classes() -> list[type[DomainError]]:
    modules = (group_errors, broker_calls, membership, metadata, metadata_errors, principal_limits, topic_admin, leadership, partition_states, event_errors, event_registry, queue_errors)
    return sorted(
        {cls for m in modules for _, cls in inspect.getmembers(m, inspect.isclass) if issubclass(cls, DomainError)},
        key=lambda cls: f"{cls.__module__}.{cls.__qualname__}",
    )


@pytest.mark.parametrize("cls", _domain_classes(), ids=lambda cls: cls.__qualname__)
def test_every_domain_error_class_has_a_code_of_the_scheme_and_the_error_suffix(cls: type[DomainError]) -> None:
    assert isinstance(cls.code, ErrorCode)
    assert isinstance(status_code(cls.code), grpc.StatusCode)
    assert cls.__name__.endswith("Error"), f"{cls.__module__}.{cls.__name__}: error classes end in Error"


def test_server_error_classes_do_not_take_the_client_public_names() -> None:
    # one name, one class: a reader of a traceback or a test knows which layer raised it
    classes = _domain_classes()
    names = [cls.__name__ for cls in classes]
    assert len(names) == len(set(names)), sorted(n for n in names if names.count(n) > 1)
    client_names = {name for name, cls in inspect.getmembers(client_errors, inspect.isclass) if issubclass(cls, Exception)}
    assert not set(names) & client_names
