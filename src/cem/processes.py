"""Worker processes that never outlive the command that started them."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import time
from concurrent.futures import ProcessPoolExecutor

__all__ = ["die_with_parent", "stop_pool", "submit_quietly"]


def die_with_parent(parent: int, sig: int = signal.SIGTERM) -> None:
    """In a worker process started by `parent` (its pid): on Linux, ask for `sig` when that process dies,
    even by SIGKILL (PR_SET_PDEATHSIG), so that the worker does not run on, orphaned, holding what the
    command held (its output, a run directory's lock); and send it now if `parent` already died before the
    request took effect. Elsewhere nothing is asked."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    PR_SET_PDEATHSIG = 1
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, int(sig))
    if os.getppid() != parent:
        os.kill(os.getpid(), sig)


def stop_pool(pool: ProcessPoolExecutor, timeout: float = 5.0) -> None:
    """Shut `pool` down without waiting on its queues (after an interrupt or an error, when they may be in
    any state): have the pool's manager thread cancel what is queued, terminate the workers, join each for
    at most `timeout` seconds in all, then kill those still alive. Never blocks for longer than about
    `timeout` plus two seconds, and leaves nothing that blocks this process's exit.

    The order keeps CPython's manager thread alive to the end. Once a worker dies the manager fails every
    future still pending (`terminate_broken`); one cancelled by then, not by the manager itself, fails it with
    InvalidStateError (3.11): the thread died before closing the call queue, whose feeder thread, stuck
    writing tasks no worker reads, Python's exit then joined forever. So the workers are terminated only
    once the manager has taken the shutdown (it drops what it cancels), or the wait for it is over; and the
    call queue's feeder is never joined (`cancel_join_thread`: the tasks it holds are dropped anyway).

    A worker terminated while it sends a result larger than a pipe's buffer leaves the manager thread
    waiting for the rest of that message, and Python's exit joins that thread: the command would hang
    after its last line. This process holds the result pipe's write end too (the workers only ever write
    to it), so closing that once the workers are gone ends the read (end of file); the manager thread then
    takes the pool as broken and exits."""
    processes = list((getattr(pool, "_processes", None) or {}).values())
    call_queue = getattr(pool, "_call_queue", None)  # shutdown(wait=False) drops these references
    result_queue = getattr(pool, "_result_queue", None)
    manager = getattr(pool, "_executor_manager_thread", None)
    deadline = time.monotonic() + timeout
    if call_queue is not None:
        call_queue.cancel_join_thread()
    pool.shutdown(wait=False, cancel_futures=True)
    while manager is not None and manager.is_alive() and getattr(pool, "_cancel_pending_futures", False) and time.monotonic() < deadline:
        time.sleep(0.001)  # the manager thread clears the flag once it has cancelled what is queued
    for proc in processes:
        with contextlib.suppress(OSError, ValueError):
            proc.terminate()
    for proc in processes:
        with contextlib.suppress(OSError, ValueError, AssertionError):
            proc.join(max(0.0, deadline - time.monotonic()))
            if proc.is_alive():
                proc.kill()
                proc.join(1.0)
    if result_queue is not None:
        with contextlib.suppress(OSError, AttributeError):
            result_queue._writer.close()
    if manager is not None:
        manager.join(max(0.0, deadline - time.monotonic()) + 1.0)


def submit_quietly(pool: ProcessPoolExecutor, fn, *args):
    """`pool.submit(fn, *args)` with SIGINT blocked in this thread meanwhile, so that a worker the submit
    starts is born with SIGINT blocked: a terminal's Ctrl-C, sent to the whole process group, then reaches
    the command alone, which stops its workers (`stop_pool`), instead of printing a KeyboardInterrupt
    traceback from each worker. A Ctrl-C arriving during the submit is delivered to this thread right after."""
    if not hasattr(signal, "pthread_sigmask"):
        return pool.submit(fn, *args)
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    try:
        return pool.submit(fn, *args)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)
