"""Shared readers of live job logs: one per file per server process, woken when the file's directory changes.

Every viewer of a file in this process subscribes to the file's one `LogFileReader` (`log_file_followed`): the
first starts it, the last to leave stops it. A reader does not hand out bytes: it `lstat`s its file when the
file may have changed and wakes its viewers when what it saw differs from the last time, and each viewer then
reads from its own offset with its own `LogTailer` (which keeps every guarantee of the protocol: symlink and
FIFO refusals, truncation, UTF-8 at chunk edges). A viewer far behind thus still gets every byte.

What tells a reader to look is one watch per event loop over the directories of all its readers (inotify
through watchfiles' Rust notifier, in a thread of its own, so a thousand viewed files cost one thread, not a
thousand): a change in a directory wakes the readers of the files named in it. A directory that does not
exist yet is watched through its deepest existing ancestor until it appears. As filesystems such as NFS do
not notify changes made on other hosts, and an event can be missed while the watch is being rebuilt, every
reader also looks every `JOB_LOG_POLL_SECONDS`. `JOB_LOG_FORCE_POLLING` turns inotify off and leaves only that
poll. (watchfiles' own polling mode is not used: it compares modification times to the second and, watching a
directory non-recursively, reports no appends to the files in it, so a log written twice a second would stall.)
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import stat
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from django.conf import settings
from watchfiles._rust_notify import RustNotify

logger = logging.getLogger(__name__)

# Once a change is seen the notifier waits a step for more before it reports, and reports within the
# debounce at the latest while changes keep coming: a line reaches the readers 10-20 ms after its write.
WATCH_STEP_MILLISECONDS = 10
WATCH_DEBOUNCE_MILLISECONDS = 50
MIN_POLL_SECONDS = 0.05

# What `lstat` said of a file (mode, device, inode, size, mtime), None while it does not exist: a viewer is
# woken only when this changes.
FileSnapshot = tuple[int, int, int, int, int] | None


def file_snapshot(path: str) -> FileSnapshot:
    try:
        info = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError:
        return (-1, -1, -1, -1, -1)  # the viewers' own reads say what is wrong
    return (stat.S_IFMT(info.st_mode), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _existing_ancestor(directory: str) -> tuple[str, int, int]:
    """`directory` itself when it exists, else the deepest directory above it that does; with its identity.

    The identity (device, inode) tells a directory removed and made again, whose old watch hears nothing.
    """
    while True:
        try:
            info = os.stat(directory)
        except OSError:
            info = None
        parent = os.path.dirname(directory)
        if (info is not None and stat.S_ISDIR(info.st_mode)) or parent == directory:
            return directory, info.st_dev if info else 0, info.st_ino if info else 0
        directory = parent


@dataclass(eq=False)
class LogFileReader:
    """The process's one follower of a log file: wakes the file's viewers when the file changes."""

    path: str
    snapshot: FileSnapshot = None
    viewers: set[asyncio.Event] = field(default_factory=set)  # each viewer's wake-up call

    @property
    def directory(self) -> str:
        return os.path.dirname(self.path)

    def saw(self, snapshot: FileSnapshot) -> None:
        if snapshot == self.snapshot:
            return
        self.snapshot = snapshot
        for wake in self.viewers:
            wake.set()


class _DirectoryWatch:
    """The readers of one event loop and the watch over their directories, rebuilt when the set changes."""

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.readers: dict[str, LogFileReader] = {}
        self.rebuild = asyncio.Event()  # the notifier's thread checks it every step: set, the watch ends
        self.task: asyncio.Task[None] | None = None

    def reader_add(self, reader: LogFileReader) -> None:
        self.readers[reader.path] = reader
        self.rebuild.set()
        if self.task is None or self.task.done():
            self.task = self.loop.create_task(self._run(), name="job log watch")

    def reader_remove(self, reader: LogFileReader) -> None:
        del self.readers[reader.path]
        self.rebuild.set()

    async def _run(self) -> None:
        executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="job-log-watch")
        try:
            while self.readers:
                try:
                    await self._watch(executor)
                except Exception:  # the readers' own polls keep the viewers going meanwhile
                    logger.exception("watching the job log directories failed; trying again")
                    await asyncio.sleep(self._poll_seconds())
        finally:
            await asyncio.to_thread(executor.shutdown)  # its thread is idle by now: the notifier is closed
            if _watches.get(self.loop) is self and not self.readers:
                del _watches[self.loop]

    def _poll_seconds(self) -> float:
        return max(MIN_POLL_SECONDS, float(settings.JOB_LOG_POLL_SECONDS))

    def _wanted(self) -> set[tuple[str, int, int]]:
        return {_existing_ancestor(reader.directory) for reader in self.readers.values()}

    async def _watch(self, executor: ThreadPoolExecutor) -> None:
        """One watch over the directories the readers need now, until they need others (or none)."""
        self.rebuild = rebuild = asyncio.Event()
        wanted = await asyncio.to_thread(self._wanted)
        notifier: RustNotify | None = None
        if not settings.JOB_LOG_FORCE_POLLING:
            notifier = await self.loop.run_in_executor(
                executor, lambda: RustNotify(sorted({path for path, _, _ in wanted}), False, False, 0, False, True)
            )
        try:
            # Whatever changed before the watch began was not reported: look at every file once now, and at
            # the directories (one made meanwhile is watched only through its parent, which reported nothing).
            await self._look(list(self.readers.values()))
            if notifier is not None and await asyncio.to_thread(self._wanted) != wanted:
                return
            poll_at = self.loop.time() + self._poll_seconds()
            while not rebuild.is_set():
                changed = await self._changes(notifier, executor, rebuild, timeout=poll_at - self.loop.time())
                await self._look([self.readers[path] for path in changed if path in self.readers])
                moved = any(self._on_a_readers_way(path) for path in changed)
                if self.loop.time() >= poll_at:
                    await self._look(list(self.readers.values()))
                    poll_at = self.loop.time() + self._poll_seconds()
                    moved = notifier is not None
                if moved and await asyncio.to_thread(self._wanted) != wanted:
                    return  # a directory appeared or went: watch the new set
        finally:
            rebuild.set()  # on cancellation too: the notifier's thread returns within a step
            if notifier is not None:
                await self.loop.run_in_executor(executor, notifier.close)

    async def _changes(
        self, notifier: RustNotify | None, executor: ThreadPoolExecutor, rebuild: asyncio.Event, *, timeout: float
    ) -> set[str]:
        """The paths that changed within `timeout` seconds (none when it passed, or the watch is to be rebuilt)."""
        if notifier is None:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(rebuild.wait(), timeout=max(0.0, timeout))
            return set()
        changes = await self.loop.run_in_executor(
            executor,
            notifier.watch,
            WATCH_DEBOUNCE_MILLISECONDS,
            WATCH_STEP_MILLISECONDS,
            max(1, int(timeout * 1000)),
            rebuild,
        )
        return {path for _, path in changes} if isinstance(changes, set) else set()

    def _on_a_readers_way(self, path: str) -> bool:
        """Whether `path` is the directory of a reader's file or one above it."""
        prefix = path.rstrip("/") + "/"
        return any((reader.directory + "/").startswith(prefix) for reader in self.readers.values())

    async def _look(self, readers: list[LogFileReader]) -> None:
        if not readers:
            return
        snapshots = await asyncio.to_thread(lambda: [file_snapshot(reader.path) for reader in readers])
        for reader, snapshot in zip(readers, snapshots, strict=True):
            reader.saw(snapshot)


_watches: dict[asyncio.AbstractEventLoop, _DirectoryWatch] = {}


@contextlib.contextmanager
def log_file_followed(path: str, *, wake: asyncio.Event) -> Iterator[LogFileReader]:
    """Subscribes `wake` to the reader of `path` for the block: it is set whenever the file may have changed.

    Call it in the event loop of the viewer; the reader and the watch start with the first subscriber.
    """
    loop = asyncio.get_running_loop()
    watch = _watches.get(loop)
    if watch is None:
        watch = _watches[loop] = _DirectoryWatch(loop)
    reader = watch.readers.get(path)
    if reader is None:
        reader = LogFileReader(path)
        watch.reader_add(reader)
    reader.viewers.add(wake)
    try:
        yield reader
    finally:
        reader.viewers.discard(wake)
        if not reader.viewers and watch.readers.get(path) is reader:
            watch.reader_remove(reader)


def followed_paths() -> set[str]:
    """The files that have a reader in the running event loop."""
    watch = _watches.get(asyncio.get_running_loop())
    return set(watch.readers) if watch is not None else set()


async def watch_stopped() -> None:
    """Returns once the running event loop has no watch left (at once if it has none)."""
    watch = _watches.get(asyncio.get_running_loop())
    if watch is not None and watch.task is not None:
        await asyncio.shield(watch.task)
