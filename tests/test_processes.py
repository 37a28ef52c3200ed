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


def test_a_pool_whose_worker_died_mid_result_does_not_hang_the_exit(tmp_path):
    script = tmp_path / "half_sent.py"
    script.write_text(SCRIPT, encoding="utf-8")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen([sys.executable, str(script)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=60)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, 9)
        output, _ = proc.communicate()
        pytest.fail(f"the script did not exit after stopping its pool: {output.decode(errors='replace')!r}")
    text = output.decode(errors="replace")
    assert proc.returncode == 0, text
    assert "manager alive: False" in text, text
