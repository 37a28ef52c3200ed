"""`cem.processes.stop_pool`: a pool stopped after an interrupt never keeps its command from exiting."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest

pytestmark = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="the spawn-and-pipe behaviour tested is Linux's")

# A worker that dies half-way through sending its result, as a worker terminated by `stop_pool` while it
# sends a result larger than a pipe's buffer: the pool's manager thread has read the message's length
# and waits for the rest. The script then stops the pool and exits; before the fix, Python's exit joined
# the manager thread forever.
SCRIPT = textwrap.dedent("""
    import os, struct, sys, time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from cem.processes import stop_pool


    def half_a_result():
        result_queue = sys._getframe(1).f_locals["result_queue"]  # the worker loop's queue
        os.write(result_queue._writer.fileno(), struct.pack("!i", 1_000_000) + b"x" * 1000)
        time.sleep(600)


    if __name__ == "__main__":
        pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"))
        future = pool.submit(half_a_result)
        manager = pool._executor_manager_thread
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # until the manager thread is inside the read of that message
            frame = sys._current_frames().get(manager.ident)
            names = set()
            while frame is not None:
                names.add(frame.f_code.co_name)
                frame = frame.f_back
            if "_recv" in names:
                break
            time.sleep(0.01)
        else:
            sys.exit("the manager thread never started reading the half-sent result")
        t0 = time.monotonic()
        stop_pool(pool, timeout=2.0)
        print(f"stopped in {time.monotonic() - t0:.1f} s; manager alive: {manager.is_alive()}", flush=True)
""")


def _run(script: str, tmp_path) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of the Python `script`; a failure if it has not exited after 60 s."""
    path = tmp_path / "script.py"
    path.write_text(script, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(path)], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        out, err = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        out, err = proc.communicate()
        pytest.fail(f"the script did not exit after stopping its pool: {out!r} {err[-2000:]!r}")
    return proc.returncode, out, err


def test_a_pool_whose_worker_died_mid_result_does_not_hang_the_exit(tmp_path):
    code, out, err = _run(SCRIPT, tmp_path)
    assert code == 0, out + err
    assert "manager alive: False" in out, out + err


# Futures cancelled by the caller (as the prepare did when Ctrl-C stopped it) while the worker runs a task and
# the call queue's pipe is full (a 200 kB task waits in it), then the pool is stopped; each worker is seen dead
# by the manager thread before anything else happens (the patched terminate waits: a main thread descheduled
# right after it, as on a busy machine). Before the fix the manager thread died of InvalidStateError failing a
# cancelled future (CPython 3.11), and Python's exit joined the call queue's feeder thread forever.
CANCELLED = textwrap.dedent("""
    import multiprocessing.process, time
    from concurrent.futures import ProcessPoolExecutor
    from multiprocessing import get_context

    from cem.processes import stop_pool


    def terminate_then_wait(proc, terminate=multiprocessing.process.BaseProcess.terminate):
        terminate(proc)
        proc.join(5.0)
        time.sleep(0.3)


    if __name__ == "__main__":
        pool = ProcessPoolExecutor(1, mp_context=get_context("spawn"))
        running = pool.submit(time.sleep, 600)
        queued = [pool.submit(len, b"x" * 200_000) for _ in range(6)]
        deadline = time.monotonic() + 60
        while not running.running() and time.monotonic() < deadline:
            time.sleep(0.01)
        time.sleep(0.5)  # the worker has taken its task
        assert sum(f.cancel() for f in queued) == 5, [f._state for f in queued]  # one is in the call queue already
        multiprocessing.process.BaseProcess.terminate = terminate_then_wait
        manager = pool._executor_manager_thread
        stop_pool(pool, timeout=2.0)
        print(f"manager alive: {manager.is_alive()}", flush=True)
""")


def test_a_pool_with_cancelled_futures_stops_and_exits(tmp_path):
    assert _run(CANCELLED, tmp_path) == (0, "manager alive: False\n", "")
