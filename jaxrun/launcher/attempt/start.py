"""Starting one life of one process: its files, its spawn, its output, its waiter.

Local backends let each child write its own log files, so no byte of a
flood passes through jaxrun unless the console shows it; the pump follows
those files.  Other backends hand back pipes, which the pump reads into the
logs (through the child's ``stream_filter``, which takes out what a far end
sends in-band).  A waiter thread per child turns its end into an
``Exited`` event, with the marks the process left (``child.watch.marks``: read
here from its file, or brought home by its far end); its join and activity come as events through the
spawn's ``News``, or, for a child that does not report them, from the
joined and activity files that the joins and the activity watch follow.
"""

from __future__ import annotations

import dataclasses
import os
import queue
import time
from collections.abc import Callable

from jaxrun import contract
from jaxrun.core.backend import Backend, Child, News, RunHooks, StreamFilter, start_thread
from jaxrun.core.events import Activity, Exited, Joined, Stream
from jaxrun.core.logfiles import open_log, open_pumped_log
from jaxrun.launcher.attempt.activity import ActivityWatch, activity_path
from jaxrun.launcher.attempt.joins import Joins, joined_path
from jaxrun.launcher.attempt.profiling import work_folder
from jaxrun.launcher.attempt.slots import Slot
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.launcher.output.pump import OutputPump, enlarge_pipe


class Starter:
    def __init__(self, backend: Backend, printer: ConsolePrinter, pump: OutputPump, log_dir: str,
                 events: queue.SimpleQueue, hooks: RunHooks, joins: Joins, activity: ActivityWatch,
                 lifeline_r: int, clock: Callable[[], float]):
        self.backend, self.printer, self.pump, self.log_dir = backend, printer, pump, log_dir
        self.events, self.hooks, self.clock = events, hooks, clock
        self.joins, self.activity = joins, activity
        self.lifeline_r = lifeline_r  # kept open to the attempt's end: a process started again alone gets it too
        self.open_streams = 0  # pumped or followed streams not yet at their end

    def start(self, slot: Slot) -> None:
        record, rank = slot.record, slot.rank
        joined_file = joined_path(self.log_dir, rank)
        activity_file, marks_file = activity_path(self.log_dir, rank), marks_path(self.log_dir, rank)
        for stale in (record.error_file, joined_file, activity_file, marks_file):
            if os.path.lexists(stale):
                os.unlink(stale)
        env = {contract.ERROR_FILE: record.error_file, contract.JOINED_FILE: joined_file,
               contract.PROFILE_DIR: work_folder(self.log_dir, rank), contract.MARKS_FILE: marks_file}
        if self.activity.active or self.activity.accounting:  # the watchdog's state, the account's TIME line
            env[contract.ACTIVITY_FILE] = activity_file
        news = News(lambda recoverable=False: self.events.put(Joined(rank, recoverable)),
                    lambda state: self.events.put(Activity(rank, state)))
        if self.backend.writes_log_files:
            child = self._spawn_into_files(slot, env, news)
        else:
            child = self.backend.spawn(record.spec, self.lifeline_r, env, None, news)
            for pipe, path, stream in ((child.stdout, record.stdout_log, Stream.STDOUT),
                                       (child.stderr, record.stderr_log, Stream.STDERR)):
                self._pump(pipe, path, rank, stream, child.stream_filter(stream))
        slot.started(child)
        record.started_at = time.time()
        if not child.reports_joins:  # else it tells its News: Joined and Activity events
            self.joins.watch(rank, joined_file)
            self.activity.watch(rank, activity_file)
        start_thread(f"process-waiter:{rank}", self._wait, rank, child, None if child.reports_joins else marks_file,
                     hooks=self.hooks)

    def _spawn_into_files(self, slot: Slot, env: dict[str, str], news: News) -> Child:
        record = slot.record
        fds = (open_log(record.stdout_log), open_log(record.stderr_log))
        try:
            child = self.backend.spawn(record.spec, self.lifeline_r, env, fds, news)
        finally:
            for fd in fds:
                os.close(fd)
        if self.printer.shows(slot.rank):  # else nobody needs the bytes until the end
            for path, stream in ((record.stdout_log, Stream.STDOUT), (record.stderr_log, Stream.STDERR)):
                self.open_streams += 1
                self.pump.follow(path, slot.rank, stream)
        return child

    def _pump(self, pipe, path: str, rank: int, stream: Stream, stream_filter: StreamFilter | None) -> None:
        log = open_pumped_log(path)
        enlarge_pipe(pipe.fileno())

        def close() -> None:
            log.close()
            pipe.close()

        self.open_streams += 1
        self.pump.add(pipe.fileno(), log, rank, stream, close, show=self.printer.shows(rank), path=path,
                      stream_filter=stream_filter)

    def _wait(self, rank: int, child: Child, marks_file: str | None) -> None:
        """``marks_file``: where the process left its marks, for a child whose far end does not bring them."""
        end = child.wait()
        if marks_file is not None:
            end = dataclasses.replace(end, marks=contract.Marks.read(marks_file))
            contract.remove_private(marks_file)
        self.events.put(Exited(rank, end, self.clock()))


def marks_path(log_dir: str, rank: int) -> str:
    """Where a local process writes its compiles and checkpoint saves (``child.watch.marks``)."""
    return os.path.join(log_dir, f"process-{rank}.marks")
