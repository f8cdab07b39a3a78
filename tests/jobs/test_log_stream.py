"""The log tailer on real files: byte offsets, exact resume, UTF-8 at chunk edges, truncation, refusals; and
the shared readers that wake a file's viewers when it changes."""

from __future__ import annotations

import asyncio
import base64
import os
import threading
from pathlib import Path
from typing import Any

import pytest

from jobs.log_readers import followed_paths, log_file_followed, watch_stopped
from jobs.log_stream import (
    LogChunk,
    LogFileRefused,
    LogMissing,
    LogTailer,
    LogTruncated,
    chunk_payload,
    open_log_file,
)


def drain(tailer: LogTailer, *, final: bool = False) -> list[LogChunk]:
    """Every chunk the tailer has now; fails on anything but chunks."""
    chunks = []
    while (event := tailer.poll(final=final)) is not None:
        assert isinstance(event, LogChunk), event
        chunks.append(event)
    return chunks


def payload_bytes(chunk: LogChunk) -> bytes:
    """What a client rebuilds from the chunk's message."""
    payload = chunk_payload(chunk.data)
    if "data" in payload:
        return payload["data"].encode("utf-8")
    return base64.b64decode(payload["data_b64"])


def test_chunks_are_bounded_and_tagged_with_the_byte_offsets_they_cover(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"x" * 150_000)
    chunks = drain(LogTailer(str(log), chunk_bytes=65_536))
    assert [(chunk.offset, chunk.next_offset) for chunk in chunks] == [
        (0, 65_536),
        (65_536, 131_072),
        (131_072, 150_000),
    ]
    assert b"".join(chunk.data for chunk in chunks) == log.read_bytes()


def test_new_output_is_picked_up_where_the_last_chunk_ended(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"step 1\n")
    tailer = LogTailer(str(log))
    assert drain(tailer) == [LogChunk(offset=0, next_offset=7, data=b"step 1\n")]
    assert tailer.poll() is None
    with log.open("ab") as output:
        output.write(b"step 2\n")
    assert drain(tailer) == [LogChunk(offset=7, next_offset=14, data=b"step 2\n")]


def test_a_tailer_started_at_a_chunks_next_offset_continues_exactly(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    content = "".join(f"line {number} ✓ done\n" for number in range(5_000)).encode()
    log.write_bytes(content)
    first = LogTailer(str(log), chunk_bytes=1_000)
    received = [first.poll(), first.poll(), first.poll()]
    assert all(isinstance(chunk, LogChunk) for chunk in received)
    resumed = LogTailer(str(log), offset=first.offset, chunk_bytes=1_000)
    rest = drain(resumed)
    assert rest[0].offset == first.offset
    rebuilt = b"".join(chunk.data for chunk in received if isinstance(chunk, LogChunk))
    assert rebuilt + b"".join(chunk.data for chunk in rest) == content


def test_a_character_split_by_the_chunk_size_goes_whole_into_the_next_chunk(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes("ab€c".encode())  # € is 3 bytes: the first 4-byte read ends inside it
    chunks = drain(LogTailer(str(log), chunk_bytes=4))
    assert [(chunk.offset, chunk.next_offset, chunk_payload(chunk.data)) for chunk in chunks] == [
        (0, 2, {"data": "ab"}),
        (2, 6, {"data": "€c"}),
    ]


def test_a_character_half_written_is_held_back_until_its_last_bytes_arrive(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    euro = "€".encode()
    log.write_bytes(b"x" + euro[:2])
    tailer = LogTailer(str(log))
    assert drain(tailer) == [LogChunk(offset=0, next_offset=1, data=b"x")]
    assert tailer.offset == 1
    with log.open("ab") as output:
        output.write(euro[2:] + b"\n")
    chunks = drain(tailer)
    assert [(chunk.offset, chunk_payload(chunk.data)) for chunk in chunks] == [(1, {"data": "€\n"})]


def test_once_the_writer_is_done_an_incomplete_character_is_sent_as_bytes(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"end\xe2\x82")
    tailer = LogTailer(str(log))
    assert drain(tailer) == [LogChunk(offset=0, next_offset=3, data=b"end")]
    final = drain(tailer, final=True)
    assert final == [LogChunk(offset=3, next_offset=5, data=b"\xe2\x82")]
    assert chunk_payload(final[0].data) == {"data_b64": base64.b64encode(b"\xe2\x82").decode()}


def test_invalid_utf8_round_trips_byte_for_byte(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    content = b"ok\n" + bytes(range(256)) * 40 + b"\xff\xfe tail \xc3\x28 \xed\xa0\x80 ok\n" + "naïve\n".encode()
    log.write_bytes(content)
    chunks = drain(LogTailer(str(log), chunk_bytes=1_000), final=True)
    assert b"".join(payload_bytes(chunk) for chunk in chunks) == content
    assert any("data_b64" in chunk_payload(chunk.data) for chunk in chunks)
    assert chunk_payload(b"ok\n") == {"data": "ok\n"}


def test_a_one_megabyte_line_without_newline_streams_in_bounded_chunks(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    content = b"=" * 1_048_576
    log.write_bytes(content)
    chunks = drain(LogTailer(str(log)))
    assert len(chunks) == 16
    assert {len(chunk.data) for chunk in chunks} == {65_536}
    assert b"".join(chunk.data for chunk in chunks) == content


def test_a_file_that_shrinks_below_the_offset_is_reported_and_read_again_from_zero(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"a" * 100)
    tailer = LogTailer(str(log))
    drain(tailer)
    with log.open("r+b") as output:
        output.truncate(0)
        output.write(b"fresh\n")
    assert tailer.poll() == LogTruncated(previous_offset=100)
    assert tailer.offset == 0
    assert drain(tailer) == [LogChunk(offset=0, next_offset=6, data=b"fresh\n")]


def test_a_file_replaced_by_another_counts_as_truncated_even_when_larger(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"first run\n")
    tailer = LogTailer(str(log))
    drain(tailer)
    replacement = tmp_path / "new.log"
    replacement.write_bytes(b"second run, longer than the first\n")
    os.replace(replacement, log)
    assert tailer.poll() == LogTruncated(previous_offset=10)
    assert drain(tailer)[0].data == b"second run, longer than the first\n"


def test_resuming_beyond_the_end_of_the_file_is_reported_as_truncation(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    log.write_bytes(b"short\n")
    tailer = LogTailer(str(log), offset=5_000)
    assert tailer.poll() == LogTruncated(previous_offset=5_000)
    assert drain(tailer) == [LogChunk(offset=0, next_offset=6, data=b"short\n")]


def test_a_missing_file_is_reported_once_and_read_when_it_appears(tmp_path: Path) -> None:
    log = tmp_path / "job" / "stdout.log"
    tailer = LogTailer(str(log))
    assert tailer.poll() == LogMissing()
    assert tailer.poll() is None
    log.parent.mkdir()
    log.write_bytes(b"started\n")
    assert drain(tailer) == [LogChunk(offset=0, next_offset=8, data=b"started\n")]


def test_carriage_return_progress_bars_pass_through_untouched(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    content = "epoch 1\n 10%|█         |\r 50%|█████     |\r100%|██████████|\r\nsaved\n".encode()
    log.write_bytes(content)
    chunks = drain(LogTailer(str(log)))
    assert [chunk_payload(chunk.data) for chunk in chunks] == [{"data": content.decode()}]


def test_a_symlink_in_place_of_the_log_is_refused(tmp_path: Path) -> None:
    secret = tmp_path / "secret"
    secret.write_bytes(b"another tenant's output\n")
    log = tmp_path / "stdout.log"
    log.symlink_to(secret)
    with pytest.raises(LogFileRefused):
        LogTailer(str(log)).poll()
    with pytest.raises(LogFileRefused):
        open_log_file(str(log))


def test_a_fifo_in_place_of_the_log_is_refused_without_blocking(tmp_path: Path) -> None:
    log = tmp_path / "stdout.log"
    os.mkfifo(log)
    with pytest.raises(LogFileRefused):
        LogTailer(str(log)).poll()
    with pytest.raises(LogFileRefused):
        open_log_file(str(log))


# The shared readers ------------------------------------------------------------------------------------

# Long enough that a test passing within it was woken by the change itself, not by the poll.
NO_POLL = 60.0


async def woken(wake: asyncio.Event) -> None:
    await asyncio.wait_for(wake.wait(), timeout=5)
    wake.clear()


def watch_threads() -> set[threading.Thread]:
    """The watch threads alive now. Earlier tests' event loops may have closed with their watch still running
    (its thread then lingers): a test compares against what was there when it began."""
    return {thread for thread in threading.enumerate() if thread.name.startswith("job-log-watch")}


def test_one_reader_wakes_every_viewer_of_a_file_and_stops_with_the_last(tmp_path: Path, settings: Any) -> None:
    settings.JOB_LOG_POLL_SECONDS = NO_POLL
    log = tmp_path / "stdout.log"
    log.write_bytes(b"first\n")
    lingering = watch_threads()

    async def scenario() -> None:
        first, second = asyncio.Event(), asyncio.Event()
        with log_file_followed(str(log), wake=first) as reader, log_file_followed(str(log), wake=second) as same:
            assert same is reader
            assert followed_paths() == {str(log)}
            await woken(first)  # the first look, once the watch is up
            await woken(second)
            with log.open("ab") as output:
                output.write(b"second\n")
            await woken(first)
            await woken(second)
            assert reader.snapshot is not None
            assert reader.snapshot[3] == 13
        assert followed_paths() == set()
        await watch_stopped()
        assert watch_threads() == lingering

    asyncio.run(scenario())


def test_a_viewer_that_leaves_is_not_woken_and_the_others_still_are(tmp_path: Path, settings: Any) -> None:
    settings.JOB_LOG_POLL_SECONDS = NO_POLL
    log = tmp_path / "stdout.log"
    log.write_bytes(b"")

    async def scenario() -> None:
        staying, leaving = asyncio.Event(), asyncio.Event()
        with log_file_followed(str(log), wake=staying):
            with log_file_followed(str(log), wake=leaving):
                await woken(staying)
            leaving.clear()
            assert followed_paths() == {str(log)}
            with log.open("ab") as output:
                output.write(b"more\n")
            await woken(staying)
            assert not leaving.is_set()
        await watch_stopped()

    asyncio.run(scenario())


def test_a_file_whose_directory_does_not_exist_yet_wakes_its_viewer_when_it_appears(
    tmp_path: Path, settings: Any
) -> None:
    settings.JOB_LOG_POLL_SECONDS = NO_POLL
    log = tmp_path / "tenant" / "project" / "job" / "stdout.log"

    async def scenario() -> None:
        wake, other_wake = asyncio.Event(), asyncio.Event()
        other = tmp_path / "other.log"
        other.write_bytes(b"")
        with log_file_followed(str(log), wake=wake) as reader, log_file_followed(str(other), wake=other_wake):
            # The watch has looked at both files (only the other one exists): it now watches tmp_path for both.
            await woken(other_wake)
            assert reader.snapshot is None
            log.parent.mkdir(parents=True)
            log.write_bytes(b"started\n")
            while reader.snapshot is None:  # the watch moves down to the new directories, then sees the file
                await woken(wake)
            assert reader.snapshot[3] == 8
        await watch_stopped()

    asyncio.run(scenario())


def test_with_polling_forced_changes_are_seen_by_the_poll(tmp_path: Path, settings: Any) -> None:
    settings.JOB_LOG_FORCE_POLLING = True
    settings.JOB_LOG_POLL_SECONDS = 0.05
    log = tmp_path / "stdout.log"
    lingering = watch_threads()

    async def scenario() -> None:
        wake = asyncio.Event()
        with log_file_followed(str(log), wake=wake) as reader:
            for size in (3, 6, 9):  # appends within the same second: a poll of modification times would miss them
                with log.open("ab") as output:
                    output.write(b"ab\n")
                while reader.snapshot is None or reader.snapshot[3] != size:
                    await woken(wake)
            assert watch_threads() == lingering  # no notifier: the poll alone
        await watch_stopped()

    asyncio.run(scenario())
