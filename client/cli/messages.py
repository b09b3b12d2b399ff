"""`dmq produce` and `dmq consume`: lines in, messages out.

produce: every input line (without its line ending) is one message; with --key-separator the text
before the first separator is the key. A summary goes to stderr (or, with -o json, to stdout:
{"topic", "messages" (stored), "bytes" (of the lines read), "failed", "not_sent", "lines_read",
"complete", "interrupted", "elapsed_s", "partitions": {"<p>": count}}). Every line read ends up
stored, failed (refused: too large, or the brokers gave up) or not sent (abandoned on Ctrl-C, or
the line reading stopped at); the exit code is 0 only when every line was stored.

consume: text prints each value on its own line (optionally key and partition/offset first);
json prints one object per line:
  {"topic", "partition", "offset", "timestamp", "key", "value", "headers": [{"name", "value"}]}
where key and values are UTF-8 text (invalid bytes replaced) and key is null when absent.
With --group the consumer joins the group G_<topic>_<APP>, commits exactly what it printed, and
leaves on exit; without it nothing is committed anywhere.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections.abc import Callable, Iterator
from typing import IO, Any

import click

from dmq.client.admin import check_topic_name
from dmq.client.cli._errors import bootstrap, explain, session
from dmq.client.cli._output import err_console, human_bytes, note, print_json
from dmq.client.cli._parse import jsonable_text, parse_headers
from dmq.client.cli._session import CLIError
from dmq.proto.offset_markers import EARLIEST, LATEST
from dmq.proto.values import parse_size_bytes

ACKS: dict[str, str | int] = {"all": "all", "1": 1, "leader": 1, "0": 0, "none": 0}
# How often a group consumer commits what it has printed while it keeps running.
COMMIT_INTERVAL_S = 1.0
# Bounds of the group consumer's final commit and close, so a dead broker or coordinator does
# not hold up the exit.
FINAL_COMMIT_TIMEOUT_S = 5.0
CLOSE_TIMEOUT_S = 5.0
# A signalled consume is gone this long after the first signal, whatever is stuck: the last poll
# (about a second at most), the final commit and the close fit well within it.
CONSUME_STOP_DEADLINE_S = FINAL_COMMIT_TIMEOUT_S + CLOSE_TIMEOUT_S + 5.0


def quiet_client_logs() -> None:
    """The client library logs through the standard `logging` module (silent by default):
    configure_logging() shows it through structlog on stderr at the level asked (`dmq -v`), and
    keeps it silent otherwise, since the command reports failures itself in one line and stdout
    must carry only data."""
    from dmq.client.cli.logging_setup import configure_logging

    level = os.environ.get("DMQ_CLIENT_LOG_LEVEL", "critical")
    configure_logging(level if level in ("debug", "info", "warning", "error", "critical") else "critical")


# -- produce --------------------------------------------------------------------------------------

# Records whose send() is refused (too large) are reported one line each, up to this many.
MAX_RECORD_ERRORS_SHOWN = 10
# After Ctrl-C, how long what was already read may take to be stored before it is abandoned.
INTERRUPT_FLUSH_S = 10.0
# How often the progress bar is refreshed while waiting for acknowledgements.
PROGRESS_POLL_S = 0.2


def _lines(stream: IO[bytes]) -> Iterator[bytes]:
    for raw in stream:
        if raw.endswith(b"\n"):
            raw = raw[:-1]
            if raw.endswith(b"\r"):
                raw = raw[:-1]
        yield raw


def _count_lines(path: str) -> int:
    """Lines in the file as _lines() splits them (the progress bar's total): one read pass."""
    count = 0
    last = b"\n"
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            count += chunk.count(b"\n")
            last = chunk[-1:]
    return count + (last != b"\n")


class _Tally:
    """What became of the records handed to the producer. on_done runs on the producer's sender
    thread (or, for records abandoned by close(), on the closing thread once the sender has
    stopped): one writer at a time, so plain counters are safe."""

    def __init__(self) -> None:
        self.stored = 0
        self.failed = 0  # refused by a broker, or gave up (delivery timeout)
        self.not_sent = 0  # abandoned when the command stopped: not sent, or sent without an answer
        self.partitions: dict[int, int] = {}
        self.first_error: BaseException | None = None

    def on_done(self, meta: Any, err: BaseException | None) -> None:
        from dmq.client.errors import ClientClosedError

        if err is None:
            self.stored += 1
            self.partitions[meta.partition] = self.partitions.get(meta.partition, 0) + 1
        elif isinstance(err, ClientClosedError):
            self.not_sent += 1
        else:
            self.failed += 1
            if self.first_error is None:
                self.first_error = err


class _Interrupts:
    """SIGINT / SIGTERM while producing. While a line is being read (possibly blocked on stdin)
    the signal raises KeyboardInterrupt at once; elsewhere (inside send()) it only asks the loop
    to stop, so no record is half-queued, and a second one raises (send() may be blocked on a
    full buffer for max_block_ms). While waiting for acknowledgements it raises, which abandons
    the wait."""

    def __init__(self) -> None:
        self.requested = False
        self.raise_now = False
        self._previous: dict[int, Any] = {}

    def __enter__(self) -> _Interrupts:
        import signal

        for sig in (signal.SIGINT, signal.SIGTERM):
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def __exit__(self, *exc: object) -> None:
        import signal

        for sig, handler in self._previous.items():
            signal.signal(sig, handler)

    def _handle(self, signum: int, frame: object) -> None:
        already = self.requested
        self.requested = True
        if self.raise_now or already:
            raise KeyboardInterrupt


class _ReadState:
    """How far reading the input got (the main thread's)."""

    def __init__(self) -> None:
        self.lines = 0  # lines read
        self.bytes = 0  # their bytes, line endings included
        self.queued = 0  # records handed to the producer
        self.rejected = 0  # lines send() refused (too large for the topic): reported, skipped
        self.unsent = 0  # the line reading stopped at (malformed, or send() failed): read, not sent
        self.eof = False
        self.stop_reason: str | None = None  # why reading stopped before the end of the input


def _send_lines(producer: Any, topic: str, stream: IO[bytes], sep: bytes | None, key_separator: str | None,
                header_list: Any, partition: int | None, tally: _Tally, read: _ReadState, intr: _Interrupts,
                bar: Any, bootstrap_address: str) -> None:
    """Read lines and hand them to the producer until the input ends, Ctrl-C, or an error that
    makes going on pointless (a malformed line, a failing cluster)."""
    from dmq.client.errors import DMQError, RecordTooLargeError

    lines = _lines(stream)
    while not intr.requested:
        intr.raise_now = True  # a blocked read of stdin must end on Ctrl-C
        line = next(lines, None)
        intr.raise_now = False
        if line is None:
            read.eof = True
            return
        read.lines += 1
        read.bytes += len(line) + 1
        key = None
        if sep is not None:
            key, found, value = line.partition(sep)
            if not found:
                read.stop_reason = (f"line {read.lines} has no key separator {key_separator!r}; with "
                                    f"--key-separator every line must be KEY{key_separator}VALUE")
                read.unsent = 1
                return
        else:
            value = line
        try:
            producer.send(topic, value, key=key, headers=header_list, partition=partition, callback=tally.on_done)
        except RecordTooLargeError as e:
            read.rejected += 1
            if read.rejected <= MAX_RECORD_ERRORS_SHOWN:
                note(f"[yellow]line {read.lines} skipped:[/] {explain(e, bootstrap_address)}")
            continue
        except DMQError as e:
            read.stop_reason = f"line {read.lines}: {explain(e, bootstrap_address)}"
            read.unsent = 1
            return
        read.queued += 1
        if bar is not None and read.queued % 1000 == 0:
            bar.update(tally.stored)
        if tally.failed:
            read.stop_reason = "the brokers refused records"  # the cluster is failing: stop reading
            return


def _size_option(ctx: click.Context, param: click.Parameter, value: str | None) -> int | None:
    """A size option in the topic settings' grammar (dmq.proto.values): 2097152, 2MiB, 2MB."""
    if value is None:
        return None
    try:
        return parse_size_bytes(value)
    except ValueError as e:
        raise click.BadParameter(str(e)) from None


@click.command("produce")
@click.argument("topic")
@click.option("-f", "--file", "path", type=click.Path(exists=True, dir_okay=False, allow_dash=True), default="-",
              show_default=True, help="Read lines from this file ('-' = stdin).")
@click.option("-k", "--key-separator", default=None, metavar="SEP",
              help="Split each line at the first SEP into KEY and VALUE; every line must contain it. "
                   "Without it messages have no key.")
@click.option("-H", "--header", "headers", multiple=True, metavar="NAME=VALUE",
              help="Add this header to every message (repeatable).")
@click.option("-p", "--partition", type=click.IntRange(0), default=None,
              help="Send everything to this partition. Default: by key hash, keyless messages spread in batches.")
@click.option("--acks", type=click.Choice(["all", "1", "0", "leader", "none"]), default="all", show_default=True,
              help="all: wait until stored durably; 1/leader: until written; 0/none: do not wait.")
@click.option("--compression", type=click.Choice(["none", "zstd", "lz4"]), default="none", show_default=True,
              help="Compress each batch.")
@click.option("--linger-ms", type=click.FloatRange(0), default=5, show_default=True,
              help="Wait up to this long to fill a batch.")
@click.option("--batch-size", type=click.IntRange(1024, 8 * 1024 * 1024), default=1024 * 1024, show_default=True,
              help="Bytes per batch at most (encoded; a topic's max_message_bytes caps it further).")
@click.option("--max-record-bytes", default=None, metavar="SIZE", callback=_size_option,
              help="Refuse a line whose key + value + headers exceed SIZE (e.g. 2MiB). "
                   "Default: the topic's max_message_bytes alone.")
@click.option("--progress/--no-progress", default=None,
              help="Show a progress bar of the records stored. Default: for files, when stderr is a terminal.")
@click.option("-o", "--output", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: a summary line on stderr; json: the summary as JSON on stdout.")
@click.pass_context
def produce(ctx: click.Context, topic: str, path: str, key_separator: str | None, headers: tuple[str, ...],
            partition: int | None, acks: str, compression: str, linger_ms: float, batch_size: int,
            max_record_bytes: int | None, progress: bool | None, output: str) -> None:
    """Send lines from stdin (or --file) to TOPIC, one message per line.

    A line the topic cannot take (too large) is reported and skipped; the others are sent. On
    Ctrl-C (or SIGTERM) reading stops, what was read is given up to 10 s to be stored (Ctrl-C
    again abandons it), and the summary says how many records were stored, failed and not sent.
    The exit code is 0 only when every line was stored (130 after Ctrl-C).

    \b
    Examples:
      echo 'hello' | dmq produce orders
      printf 'alice:order-1\\nbob:order-2\\n' | dmq produce orders --key-separator :
      dmq produce orders --file orders.txt --header source=backfill
    """
    header_list = parse_headers(headers) or None
    if key_separator == "":
        raise click.BadParameter("must not be empty", param_hint="--key-separator")
    sep = key_separator.encode() if key_separator is not None else None
    check_topic_name(topic)
    sess = session(ctx)
    info = sess.admin.describe_topic(topic)  # clear errors (unknown topic, server down) before reading input
    if partition is not None and partition >= info.partition_count:
        raise CLIError(f"topic {topic!r} has partitions 0..{info.partition_count - 1}; no partition {partition}")

    quiet_client_logs()
    from dmq.client.errors import DMQTimeoutError
    from dmq.client.producer import Producer

    is_file = path != "-"
    show_progress = progress if progress is not None else (is_file and sys.stderr.isatty())
    tally = _Tally()
    try:
        producer = Producer(bootstrap(ctx), acks=ACKS[acks], compression=None if compression == "none" else compression,
                            linger_ms=linger_ms, batch_size=batch_size, max_record_bytes=max_record_bytes,
                            client_id="dmq-cli-produce",
                            request_timeout_ms=int(sess.timeout_s * 1000),
                            # send() waits for metadata or buffer space at most one --timeout
                            max_block_ms=int(sess.timeout_s * 1000),
                            # An operator waits at most about two --timeouts (after the linger) for a
                            # broker that went away.
                            delivery_timeout_ms=int(sess.timeout_s * 2000 + linger_ms))
    except ValueError as e:
        hint = next((f"--{name.replace('_', '-')}" for name in ("batch_size", "max_record_bytes") if name in str(e)), None)
        raise click.BadParameter(str(e), param_hint=hint) from None
    read = _ReadState()
    interrupted = False
    started = time.monotonic()
    stream: IO[bytes] = open(path, "rb") if is_file else sys.stdin.buffer  # noqa: SIM115 - closed below
    bar = None
    try:
        with _Interrupts() as intr:
            try:
                if show_progress:
                    bar = _records_progress(_count_lines(path) if is_file else None)
                try:
                    _send_lines(producer, topic, stream, sep, key_separator, header_list, partition, tally, read,
                                intr, bar, bootstrap(ctx))
                except KeyboardInterrupt:
                    pass  # Ctrl-C while reading: what was read is still flushed below
                if intr.requested:
                    interrupted = True
                    note(f"Interrupted: waiting up to {INTERRUPT_FLUSH_S:.0f} s for the records read to be "
                         "stored (Ctrl-C again abandons them)…")
                intr.raise_now = True  # from here on Ctrl-C abandons the wait
                wait_s = INTERRUPT_FLUSH_S if interrupted else sess.timeout_s * 2 + 5
                deadline = time.monotonic() + wait_s
                while True:
                    try:
                        producer.flush(timeout=max(0.0, min(PROGRESS_POLL_S, deadline - time.monotonic())))
                        break
                    except DMQTimeoutError:
                        if bar is not None:
                            bar.update(tally.stored)
                        if time.monotonic() >= deadline:
                            break
            except KeyboardInterrupt:
                interrupted = True
            finally:
                # A further Ctrl-C during close() only flags: close(timeout=0) is bounded itself.
                intr.raise_now = intr.requested = False
                # Whatever is still unacknowledged is abandoned now (counted as not sent).
                producer.close(timeout=0)
                if bar is not None:
                    bar.update(tally.stored)
                    bar.close()
    finally:
        if is_file:
            stream.close()
    elapsed = time.monotonic() - started
    failed = tally.failed + read.rejected
    not_sent = tally.not_sent + read.unsent
    lost = failed + not_sent
    eof, lines_read, sent_bytes, stop_reason = read.eof, read.lines, read.bytes, read.stop_reason
    unread = "" if eof else f"; reading stopped after line {lines_read}"
    if output == "json":
        print_json({"topic": topic, "messages": tally.stored, "bytes": sent_bytes, "failed": failed,
                    "not_sent": not_sent, "lines_read": lines_read, "complete": eof and not lost,
                    "interrupted": interrupted, "elapsed_s": round(elapsed, 3),
                    "partitions": {str(p): n for p, n in sorted(tally.partitions.items())}})
    counts = (f"{tally.stored} stored, {failed} failed, {not_sent} not sent, "
              f"of {lines_read} line{'s' if lines_read != 1 else ''} read{unread}")
    if interrupted:
        note(f"Interrupted: {counts}.")
        ctx.exit(130)
    if lost or not eof:
        cause = stop_reason or ""
        if tally.first_error is not None:
            first = explain(tally.first_error, bootstrap(ctx))
            if first not in cause:
                cause = f"{cause}: {first}" if cause else first
        elif read.rejected and not cause:
            cause = f"{read.rejected} line{'s were' if read.rejected != 1 else ' was'} too large for the topic"
        raise CLIError(f"not every line was stored: {counts}" + (f". {cause}" if cause else ""))
    if output != "json":
        rate = f", {tally.stored / elapsed:,.0f} msgs/s" if elapsed > 0 and tally.stored >= 1000 else ""
        note(f"Produced {tally.stored} message{'s' if tally.stored != 1 else ''} ({human_bytes(sent_bytes)}) to "
             f"{topic} in {elapsed:.2f} s{rate}.")


class _records_progress:
    """A rich progress bar of records stored (acknowledged), on stderr; total = lines of the file."""

    def __init__(self, total: int | None) -> None:
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(TextColumn("stored"), BarColumn(), MofNCompleteColumn(), TextColumn("records"),
                                  TimeRemainingColumn(), console=err_console(), transient=False)
        self._task = self._progress.add_task("produce", total=total)
        self._progress.start()

    def update(self, completed: int) -> None:
        self._progress.update(self._task, completed=completed)

    def close(self) -> None:
        self._progress.stop()


# -- consume --------------------------------------------------------------------------------------


def record_doc(r: Any) -> dict[str, Any]:
    """A record as JSON data (the schema in the module docstring; `dmq trace` prints the same)."""
    return {
        "topic": r.topic,
        "partition": r.partition,
        "offset": r.offset,
        "timestamp": r.timestamp,
        "key": jsonable_text(r.key),
        "value": jsonable_text(r.value),
        "headers": [{"name": k, "value": jsonable_text(v)} for k, v in (r.headers or ())],
    }


def _record_json(r: Any) -> str:
    return json.dumps(record_doc(r), ensure_ascii=False)


def _record_printer(fmt: str, print_key: bool, print_offset: bool, separator: str) -> Callable[[Any], str]:
    if fmt == "json":
        return _record_json

    def text(r: Any) -> str:
        parts = []
        if print_offset:
            parts.append(f"{r.partition}:{r.offset}")
        if print_key:
            parts.append("" if r.key is None else r.key.decode("utf-8", errors="replace"))
        parts.append(r.value.decode("utf-8", errors="replace"))
        return separator.join(parts)

    return text


def _parse_start_offset(text: str) -> int:
    low = text.strip().lower()
    if low in ("earliest", "beginning"):
        return -2
    if low in ("latest", "end"):
        return -1
    try:
        value = int(low)
    except ValueError:
        raise click.BadParameter(f"{text!r}: use an offset >= 0, 'earliest' or 'latest'", param_hint="--offset") from None
    if value < 0:
        raise click.BadParameter(f"{text!r}: use an offset >= 0, 'earliest' or 'latest'", param_hint="--offset")
    return value


@click.command("consume")
@click.argument("topic")
@click.option("-g", "--group", "app", default=None, metavar="APP",
              help="Consume as application APP in consumer group G_<topic>_<APP>, committing what is printed. "
                   "The full group id is accepted too.")
@click.option("-p", "--partition", type=click.IntRange(0), default=None, help="Read only this partition (no group).")
@click.option("--offset", "offset_text", default=None, metavar="O",
              help="With --partition: start at offset O, 'earliest' or 'latest'.")
@click.option("--from-beginning", is_flag=True,
              help="No group: start at each partition's log start (default: only new messages). "
                   "With --group: a new group starts at the log start (subscription mode all).")
@click.option("-n", "--max-messages", type=click.IntRange(1), default=None,
              help="Exit after printing this many messages.")
@click.option("--timeout-ms", "idle_timeout_ms", type=click.IntRange(1), default=None,
              help="Exit when no message arrives for this long. Default: wait until Ctrl-C or --max-messages.")
@click.option("--format", "fmt", type=click.Choice(["text", "json"]), default="text", show_default=True,
              help="text: one value per line; json: one JSON object per line with every field.")
@click.option("--print-key", is_flag=True, help="text format: print KEY<separator>VALUE.")
@click.option("--print-offset", is_flag=True, help="text format: print PARTITION:OFFSET<separator> first.")
@click.option("--separator", default="\t", show_default="tab", help="text format: between the printed fields.")
@click.pass_context
def consume(ctx: click.Context, topic: str, app: str | None, partition: int | None, offset_text: str | None,
            from_beginning: bool, max_messages: int | None, idle_timeout_ms: int | None, fmt: str,
            print_key: bool, print_offset: bool, separator: str) -> None:
    """Print messages of TOPIC: as a consumer group, from a partition and offset, or from the start.

    \b
    Examples:
      dmq consume orders --group billing --max-messages 10
      dmq consume orders --from-beginning --format json
      dmq consume orders --partition 2 --offset 1500 --print-key --print-offset
    """
    if app is not None and (partition is not None or offset_text is not None):
        raise click.UsageError("--group cannot be combined with --partition/--offset (a group gets its partitions assigned)")
    if offset_text is not None and partition is None:
        raise click.UsageError("--offset needs --partition")
    if offset_text is not None and from_beginning:
        raise click.UsageError("--offset and --from-beginning contradict each other; pick one")
    start = _parse_start_offset(offset_text) if offset_text is not None else None
    check_topic_name(topic)
    sess = session(ctx)
    info = sess.admin.describe_topic(topic)
    if partition is not None and partition >= info.partition_count:
        raise CLIError(f"topic {topic!r} has partitions 0..{info.partition_count - 1}; no partition {partition}")
    render = _record_printer(fmt, print_key, print_offset, separator)
    out = sys.stdout
    printed = 0

    stop = _StopSignals()

    def emit(records: list[Any]) -> list[Any]:
        nonlocal printed
        if max_messages is not None:
            records = records[: max_messages - printed]
        if records:
            text = "".join(render(r) + "\n" for r in records)
            with stop.raising():  # a write blocked on a full pipe is abandoned at once
                out.write(text)
                out.flush()
            printed += len(records)
        return records

    def done() -> bool:
        return stop.requested or (max_messages is not None and printed >= max_messages)

    quiet_client_logs()
    idle_s = idle_timeout_ms / 1000 if idle_timeout_ms else None
    stop.install()
    try:
        if app is not None:
            _consume_group(ctx, topic, app, from_beginning, max_messages, idle_s, emit, done)
        else:
            _consume_offsets(sess, info, partition, start, from_beginning, idle_s, emit, done)
    except KeyboardInterrupt:
        pass
    finally:
        note(f"Processed {printed} message{'s' if printed != 1 else ''}.")


class _StopSignals:
    """SIGINT / SIGTERM (Ctrl-C, `timeout`, a process manager) while consuming: the first asks the
    loop to stop; it looks between polls, each of which returns within about a second, and the
    group consumer then commits what it printed and leaves instead of waiting out its session
    timeout. The handlers are installed whatever the inherited disposition: a shell starts a
    background job with SIGINT ignored, and `kill -INT` must stop it all the same.

    The signal does not raise KeyboardInterrupt wherever it lands: an exception raised at an
    arbitrary instruction can leave a lock held for good, e.g. in threading.Condition.__exit__
    (Python code) of a Future whose done() the poll loop was asking, or of the consumer's wake-up
    Event. The fetch thread that completes that Future, or sets that Event, then blocks for ever,
    and the interpreter's exit joins it (concurrent.futures waits for its threads): a consume that
    never ended. It raises only where nothing of the client is held: while a batch is written
    (the write may be blocked on a full pipe).

    Bounds, kept by a watchdog thread that needs nothing of the main thread (the interpreter's C
    handler writes each signal to the wake-up fd it reads): the process is gone
    CONSUME_STOP_DEADLINE_S after the first signal whatever is stuck (a group join waiting for an
    unreachable coordinator, say), and at once on a second one (exit 130: the output is flushed
    after every batch; what was printed but not committed is delivered again, never lost)."""

    def __init__(self) -> None:
        self.requested = False
        self._raise_now = False

    def install(self) -> None:
        import signal
        import threading

        read_fd, write_fd = os.pipe()
        os.set_blocking(write_fd, False)  # the C handler must never block on it
        for sig in (signal.SIGINT, signal.SIGTERM):
            signal.signal(sig, self._handle)
        signal.set_wakeup_fd(write_fd, warn_on_full_buffer=False)
        wanted = {int(signal.SIGINT), int(signal.SIGTERM)}
        threading.Thread(target=_stop_watchdog, args=(read_fd, wanted, CONSUME_STOP_DEADLINE_S),
                         name="dmq-consume-stop-watchdog", daemon=True).start()

    @contextlib.contextmanager
    def raising(self) -> Iterator[None]:
        """A signal raises KeyboardInterrupt in this block (which must hold no lock of the
        client's), or at its start if one came before."""
        if self.requested:
            raise KeyboardInterrupt
        self._raise_now = True
        try:
            yield
        finally:
            self._raise_now = False

    def _handle(self, signum: int, frame: object) -> None:
        self.requested = True
        if self._raise_now:
            raise KeyboardInterrupt


def _stop_watchdog(read_fd: int, signals: set[int], deadline_s: float) -> None:
    """Wait for a stop signal on the wake-up fd, then end the process deadline_s later, or at
    the next stop signal. Uses nothing but the fd and os._exit: no lock the main thread may hold."""
    import select

    deadline = None
    while True:
        wait_s = None if deadline is None else max(0.0, deadline - time.monotonic())
        readable, _, _ = select.select([read_fd], [], [], wait_s)
        if not readable:
            _exit_now(f"dmq: did not stop within {deadline_s:g}s of the signal; exiting now\n", 1)
        for signum in os.read(read_fd, 64):
            if signum not in signals:
                continue
            if deadline is not None:
                _exit_now("dmq: second signal; exiting without the final commit\n", 130)
            deadline = time.monotonic() + deadline_s


def _exit_now(message: str, code: int) -> None:
    with contextlib.suppress(OSError, ValueError):
        os.set_blocking(2, False)  # stderr may be the full pipe that blocks everything else
        os.write(2, message.encode())
    os._exit(code)


def _consume_offsets(sess: Any, info: Any, partition: int | None, start: int | None, from_beginning: bool,
                     idle_s: float | None, emit: Callable[[list[Any]], list[Any]], done: Callable[[], bool]) -> None:
    from dmq.client._tail import TopicTail

    parts = [partition] if partition is not None else [p.partition for p in info.partitions]
    if start is None:
        start = EARLIEST if from_beginning else LATEST
    if start >= 0:
        bounds = sess.admin.list_partition_offsets({(info.name, p): LATEST for p in parts})
        for p in parts:
            lo, hi = bounds[(info.name, p)].log_start_offset, bounds[(info.name, p)].log_end_offset
            if not lo <= start <= hi:
                raise CLIError(f"offset {start} is outside {info.name}[{p}]'s log {lo}..{hi} "
                               "(use --offset earliest or latest, or an offset in that range)")
    # EARLIEST / LATEST are looked up by the tail partition by partition: a broker that is down
    # delays only its own partitions.
    tail = TopicTail(sess.admin.cluster, info.name, dict.fromkeys(parts, start), warn=lambda m: note(f"[yellow]warning:[/] {m}"))
    try:
        last_data = time.monotonic()
        while not done():
            records = tail.poll()
            if records:
                emit(records)
                last_data = time.monotonic()
            elif idle_s is not None and time.monotonic() - last_data >= idle_s:
                return
    finally:
        tail.close()  # the cluster is the session's: closed with it


def _consume_group(ctx: click.Context, topic: str, app: str, from_beginning: bool, max_messages: int | None,
                   idle_s: float | None, emit: Callable[[list[Any]], list[Any]], done: Callable[[], bool]) -> None:
    from dmq.client.consumer import DMQConsumer, TopicPartition
    from dmq.proto.names import app_id_in

    app = app_id_in(app, topic) or app  # the full group id was given
    consumer = DMQConsumer(
        metadata_service_url=bootstrap(ctx),
        group_id=app,
        client_id="dmq-cli-consume",
        enable_auto_commit=False,  # commit exactly what was printed, not what was fetched
        max_poll_records=min(500, max_messages or 500),
        subscription_mode="all" if from_beginning else None,
        request_timeout_ms=int(session(ctx).timeout_s * 1000),
    )
    from dmq.client.errors import CommitFailedError, DMQError

    pending: dict[Any, int] = {}
    last_commit = time.monotonic()
    warned: set[str] = set()

    def commit_sync(timeout_s: float) -> None:
        try:
            consumer.commit_sync(pending, timeout=timeout_s)
        except DMQError as e:
            note(f"[yellow]warning:[/] the last commit failed: {e}")
        pending.clear()

    def commit_async() -> None:
        # Periodic commits do not wait: a broker that is down must not pause the printing of
        # the others' partitions. What a failed commit did not record stays pending and goes
        # with the next one (commits are idempotent).
        offsets = dict(pending)

        def done(_committed: Any, error: Exception | None) -> None:
            if error is None or isinstance(error, CommitFailedError):
                for tp, o in offsets.items():
                    if pending.get(tp) == o:
                        del pending[tp]
            if error is not None and type(error).__name__ not in warned:
                warned.add(type(error).__name__)
                note(f"[yellow]warning:[/] commit failed: {error}")

        consumer.commit_async(offsets, callback=done)

    try:
        consumer.subscribe(topic)
        last_data = time.monotonic()
        while not done():
            wait_s = 0.5 if idle_s is None else max(0.0, min(0.5, idle_s - (time.monotonic() - last_data)))
            batch = list(consumer.poll(wait_s * 1000))
            if batch:
                for r in emit(batch):
                    pending[TopicPartition(r.topic, r.partition)] = r.offset + 1
                last_data = time.monotonic()
            elif idle_s is not None and time.monotonic() - last_data >= idle_s:
                break
            if pending and time.monotonic() - last_commit >= COMMIT_INTERVAL_S:
                commit_async()
                last_commit = time.monotonic()
    finally:
        try:
            if pending:
                commit_sync(FINAL_COMMIT_TIMEOUT_S)
        finally:
            consumer.close(timeout=CLOSE_TIMEOUT_S)
