"""A rank that SLURM terminates leaves at once, after the checkpoint in flight, even while blocked in C code."""

import signal
import subprocess
import sys
import textwrap
import time

CHILD = textwrap.dedent("""
    import signal, socket, sys, threading, time
    from pathlib import Path

    import numpy  # its OpenBLAS threads start now, with SIGTERM unblocked: the kernel may deliver it to them
    threading.Thread(target=time.sleep, args=(600,), daemon=True).start()  # so may it to this one
    signal.signal(signal.SIGTERM, lambda *a: print("bypassed", flush=True))  # what submitit installs
    from sigma.train.terminate import exit_on_sigterm, finish_before_exit

    assert exit_on_sigterm()
    done = Path(sys.argv[1])

    def finish_save():  # a checkpoint in flight: finished before the exit
        time.sleep(0.5)
        done.write_text("written")

    finish_before_exit(finish_save)
    finish_before_exit(lambda: None)()  # unregistered at once: must not matter
    a, b = socket.socketpair()
    print("blocked", flush=True)
    a.recv(1)  # blocked in C, as a rank in a collective with a hung peer: no Python handler could run here
    print("not reached", flush=True)
""")


def test_sigterm_ends_a_blocked_rank_after_the_save_in_flight(tmp_path):
    done = tmp_path / "save"
    child = subprocess.Popen([sys.executable, "-c", CHILD, str(done)], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "blocked"
    time.sleep(0.2)  # the socket call has begun
    child.send_signal(signal.SIGTERM)
    out, err = child.communicate(timeout=60)  # a hang guard: before the fix it would block forever
    assert child.returncode == 128 + signal.SIGTERM, err
    assert done.read_text() == "written"
    assert "bypassed" not in out and "not reached" not in out
    assert "SIGTERM from SLURM" in err and "finishing what was in flight" in err


def test_without_it_the_submitit_handler_keeps_the_rank_alive(tmp_path):
    """The control: with only submitit's handler the same process ignores SIGTERM (and waits for SIGKILL)."""
    child = subprocess.Popen([sys.executable, "-c", CHILD.replace("assert exit_on_sigterm()", "pass"),
                              str(tmp_path / "save")], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "blocked"
    time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    try:
        assert child.stdout.readline().strip() == "bypassed"  # the handler ran once recv was interrupted ...
        assert child.poll() is None  # ... and the process lives on
    finally:
        child.kill()
        child.communicate()
