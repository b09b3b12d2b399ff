"""EventAppendStream answers a refused append in the answer's status fields, where the unary
EventAppend ends its call with that status: tests that check every RPC's status read a streamed
refusal through this, as the RpcError the unary call would raise."""

from __future__ import annotations

import grpc

from dmq.proto import dmq_pb2 as pb


class AnswerRefused(grpc.RpcError):
    """A stream's answer carrying a status (EventAppendStream), as the unary call's RpcError."""

    def __init__(self, answer: pb.EventAppendResponse) -> None:
        super().__init__(answer.status_message)
        self._answer = answer

    def code(self) -> grpc.StatusCode:
        return next(c for c in grpc.StatusCode if c.value[0] == self._answer.status_code)

    def details(self) -> str:
        return self._answer.status_message
