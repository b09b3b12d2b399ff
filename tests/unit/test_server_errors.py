"""dmq.proto.server.server_errors: the one error type and wrapper every service uses."""

from __future__ import annotations

import asyncio

import grpc
import pytest
from _rpc_fakes import Log, call

from dmq.proto import error_details
from dmq.proto.server.server_errors import RpcAbort, fail, rpc_handler


class DomainError(Exception):
    pass


def _service(log: Log, *, serving: bool = True):
    def translate(service, e):
        return RpcAbort(grpc.StatusCode.NOT_FOUND, f"translated: {e}") if isinstance(e, DomainError) else None

    def before(service):
        if not service.serving:
            fail(grpc.StatusCode.UNAVAILABLE, "not serving yet")

    guarded = rpc_handler(log=log, translate=translate, before=before)

    class Service:
        def __init__(self) -> None:
            self.serving = serving

        @guarded
        async def Ok(self, request, context):  # noqa: N802
            return "answer"

        @guarded
        async def Fenced(self, request, context):  # noqa: N802
            fail(grpc.StatusCode.FAILED_PRECONDITION, "epoch 0 is stale", error_details.PRODUCER_FENCED)

        @guarded
        async def Domain(self, request, context):  # noqa: N802
            raise DomainError("no such thing")

        @guarded
        async def Bug(self, request, context):  # noqa: N802
            raise ValueError("x" * 10_000)

        @guarded
        async def Cancelled(self, request, context):  # noqa: N802
            raise asyncio.CancelledError

    return Service()


class Request:
    group_id = "G_t_app"


def _call(service, name: str):
    answer, aborted = call(getattr(service, name), Request())
    return aborted if aborted is not None else answer


def test_answers_pass_through():
    assert _call(_service(Log()), "Ok") == "answer"


def test_a_refusal_keeps_its_code_message_and_reason():
    code, message, metadata = _call(_service(Log()), "Fenced")
    assert (code, message) == (grpc.StatusCode.FAILED_PRECONDITION, "epoch 0 is stale")
    assert error_details.reason_of(metadata) == error_details.PRODUCER_FENCED


def test_domain_errors_go_through_the_services_translation():
    log = Log()
    assert _call(_service(log), "Domain") == (grpc.StatusCode.NOT_FOUND, "translated: no such thing", ())
    assert log.lines == []


def test_a_bug_is_logged_and_answered_internal_with_a_bounded_message():
    log = Log()
    code, message, metadata = _call(_service(log), "Bug")
    assert code == grpc.StatusCode.INTERNAL
    assert message.startswith("internal error in Bug: ValueError: xxx") and len(message) < 400
    assert metadata == ()
    assert log.lines == [("handler failed", {"rpc": "Bug", "group": "G_t_app"})]


def test_before_refuses_first():
    assert _call(_service(Log(), serving=False), "Ok") == (grpc.StatusCode.UNAVAILABLE, "not serving yet", ())


def test_cancellation_is_not_an_error():
    with pytest.raises(asyncio.CancelledError):
        _call(_service(Log()), "Cancelled")
