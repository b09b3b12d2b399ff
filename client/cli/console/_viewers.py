"""Signed-in viewers: a server-side session per viewer, each with a client of its own principal.

With sign-in on (a cluster with security on), a viewer signs in with their own token; the
console keeps it here, in memory only, under a random session id, and the browser holds only that
id (an HttpOnly, SameSite=Strict cookie). Each session owns an AdminClient made with the viewer's
token, so every page reads with the viewer's principal and the servers' ACLs decide what it shows
(the console decides nothing about permissions itself).

Bounds, since each session holds a client with its channels:
  - at most `max_sessions`: a sign-in past that ends the least recently used session;
  - a session unused for `idle_s` ends (checked on every access and by the console's sweep).
An ended session's client is closed once no page is reading with it any more: a page that has
taken it keeps it until it is answered, and the last page out closes it. The decisions are made
under the lock; clients are closed outside it (a close waits for the channels).
"""

from __future__ import annotations

import collections
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from dmq.client.admin import AdminClient

__all__ = ["Session", "Sessions", "SESSIONS_MAX", "SESSION_IDLE_S"]

SESSIONS_MAX = 64
SESSION_IDLE_S = 1800.0


@dataclass(eq=False)
class Session:
    session_id: str = field(repr=False)
    principal: str
    admin: AdminClient = field(repr=False)
    form_token: str = field(repr=False)  # this session's guard on its forms (writes, sign-out)
    last_used: float
    pages: int = 0  # pages reading with `admin` now
    ended: bool = False


class Sessions:
    """The signed-in sessions, least recently used first; thread-safe (pages run on a pool)."""

    def __init__(self, max_sessions: int = SESSIONS_MAX, idle_s: float = SESSION_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        if max_sessions < 1 or idle_s <= 0:
            raise ValueError(f"max_sessions must be >= 1 and idle_s > 0, got {max_sessions} and {idle_s}")
        self.max_sessions = max_sessions
        self.idle_s = idle_s
        self._clock = clock
        self._lock = threading.Lock()
        self._sessions: collections.OrderedDict[str, Session] = collections.OrderedDict()

    def __repr__(self) -> str:
        return f"<Sessions {len(self)}/{self.max_sessions} idle_s={self.idle_s:g}>"

    def __len__(self) -> int:
        with self._lock:
            return len(self._sessions)

    def add(self, principal: str, admin: AdminClient) -> Session:
        """A new session owning `admin` (whose token the servers accepted)."""
        now = self._clock()
        session = Session(secrets.token_urlsafe(32), principal, admin, secrets.token_urlsafe(24), now)
        with self._lock:
            done = self._expire(now)
            while len(self._sessions) >= self.max_sessions:
                _id, oldest = self._sessions.popitem(last=False)
                done += self._end(oldest)
            self._sessions[session.session_id] = session
        _close(done)
        return session

    def take(self, session_id: str | None) -> Session | None:
        """The live session of this id for a page, or None (unknown, ended, idle too long). The
        page gives it back with give_back()."""
        now = self._clock()
        with self._lock:
            done = self._expire(now)
            session = self._sessions.get(session_id) if session_id else None
            if session is not None:
                session.pages += 1
                session.last_used = now
                self._sessions.move_to_end(session.session_id)
        _close(done)
        return session

    def peek(self, session_id: str | None) -> Session | None:
        """The live session of this id, not taken and not touched (sign-out reads its form token)."""
        with self._lock:
            return self._sessions.get(session_id) if session_id else None

    def give_back(self, session: Session) -> None:
        with self._lock:
            session.pages -= 1
            done = [session] if session.ended and session.pages == 0 else []
        _close(done)

    def end(self, session_id: str | None) -> None:
        """Sign-out, or the servers no longer accept the session's token."""
        with self._lock:
            session = self._sessions.pop(session_id, None) if session_id else None
            done = self._end(session) if session is not None else []
        _close(done)

    def sweep(self) -> int:
        """End the sessions idle too long; how many are left."""
        with self._lock:
            done = self._expire(self._clock())
            left = len(self._sessions)
        _close(done)
        return left

    def close(self) -> None:
        """End every session (the console stops; its pages are done)."""
        with self._lock:
            done = [s for session in self._sessions.values() for s in self._end(session)]
            self._sessions.clear()
        _close(done)

    # -- under the lock ------------------------------------------------------------------------

    def _expire(self, now: float) -> list[Session]:
        done: list[Session] = []
        while self._sessions:
            oldest = next(iter(self._sessions.values()))
            if now - oldest.last_used < self.idle_s:
                break
            del self._sessions[oldest.session_id]
            done += self._end(oldest)
        return done

    @staticmethod
    def _end(session: Session) -> list[Session]:
        """Mark it ended; it is closed now when no page holds it, else by the last page out."""
        session.ended = True
        return [session] if session.pages == 0 else []


def _close(sessions: list[Session]) -> None:
    for session in sessions:
        session.admin.close()
