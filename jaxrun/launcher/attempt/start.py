"""Starting one life of one process: its files, its spawn, its output, its waiter.

Local backends get a pipe for each of the child's stdout and stderr, which
the log writer moves into the log files in the kernel (``output.logwriter``),
so no byte of a flood passes through jaxrun's memory unless the console shows
it, and a log that cannot be written never fails the process's own writes;
the pump follows those files for the console.  Other backends hand back
pipes, which the pump reads into the logs (through the child's
``stream_filter``, which takes out what a far end sends in-band).  Either way
a log file's loss (``LogLoss``) lands in the life's record.  A waiter thread per child turns its end into an
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
from jaxrun.launcher.attempt.activity import ActivityWatch, activity_path
from jaxrun.launcher.attempt.joins import Joins, joined_path
from jaxrun.launcher.attempt.profiling import work_folder
from jaxrun.launcher.attempt.slots import Slot
from jaxrun.launcher.output.logwriter import LogFile, LogWriter
from jaxrun.launcher.output.printer import ConsolePrinter
from jaxrun.launcher.output.pump import OutputPump, enlarge_pipe


class Starter:
    def __init__(self, backend: Backend, printer: ConsolePrinter, pump: OutputPump, writer: LogWriter,
                 log_dir: str, events: queue.SimpleQueue, hooks: RunHooks, joins: Joins, activity: ActivityWatch,
                 lifeline_r: int, clock: Callable[[], float]):
        self.backend, self.printer, self.pump, self.writer, self.log_dir = backend, printer, pump, writer, log_dir
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
                self._pump(pipe, self._log(slot, path, stream), child.stream_filter(stream))
        slot.started(child)
        record.started_at = time.time()
        if not child.reports_joins:  # else it tells its News: Joined and Activity events
            self.joins.watch(rank, joined_file)
            self.activity.watch(rank, activity_file)
        start_thread(f"process-waiter:{rank}", self._wait, rank, child, None if child.reports_joins else marks_file,
                     hooks=self.hooks)

    def _log(self, slot: Slot, path: str, stream: Stream) -> LogFile:
        return LogFile(path, slot.rank, stream, self.events, slot.record.losses.append)

    def _spawn_into_files(self, slot: Slot, env: dict[str, str], news: News) -> Child:
        """A local child: its stdout and stderr are pipes into the log writer."""
        record, logs, pipes = slot.record, [], []
        try:
            for path, stream in ((record.stdout_log, Stream.STDOUT), (record.stderr_log, Stream.STDERR)):
                logs.append(self._log(slot, path, stream))
                pipes.append(os.pipe())
            child = self.backend.spawn(record.spec, self.lifeline_r, env, tuple(w for _, w in pipes), news)
        except BaseException:
            for log in logs:
                log.close()
            for fd in (fd for pipe in pipes for fd in pipe):
                os.close(fd)
            raise
        shown = self.printer.shows(slot.rank)  # else nobody needs the bytes until the end
        for log, (read, write) in zip(logs, pipes):
            os.close(write)
            spill = done = None
            if shown:
                self.open_streams += 1
                spill, done = self.pump.follow(log.path, slot.rank, log.stream)
            self.open_streams += 1
            self.writer.add(read, log, spill, done)
        return child

    def _pump(self, pipe, log: LogFile, stream_filter: StreamFilter | None) -> None:
        enlarge_pipe(pipe.fileno())

        def close() -> None:
            log.close()
            pipe.close()

        self.open_streams += 1
        self.pump.add(pipe.fileno(), log, log.rank, log.stream, close, show=self.printer.shows(log.rank),
                      path=log.path, stream_filter=stream_filter)

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
