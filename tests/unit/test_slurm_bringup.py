"""Bring-up decisions that differ by Slurm release and host: cgroup.conf, and the slurmd a reboot starts again."""

import subprocess
import sys
from pathlib import Path

from sigma.slurm.cluster import cgroup_conf
from sigma.slurm.reboot import find_slurmd, slurmd_program
from tests.conftest import wait_for


def test_cgroup_conf_by_release_and_host():
    assert cgroup_conf((22, 5, 8), cgroup_fs=False) == ""  # 22.05 starts without one
    assert "CgroupPlugin=disabled" in cgroup_conf((24, 11, 5), cgroup_fs=False)
    real = cgroup_conf((26, 5, 5), cgroup_fs=True)
    assert "CgroupPlugin=autodetect" in real and "IgnoreSystemd=yes" in real and "26.05.5" in real


def test_reboot_restarts_the_program_slurmd_ran_as(tmp_path):
    # a stand-in process named like slurmd: started by an absolute path that is a link (as Debian's
    # /usr/sbin/slurmd -> /etc/alternatives/slurmd -> slurmd-wlm), it must be restarted by that path
    link = tmp_path / "slurmd"
    link.symlink_to(sys.executable)
    proc = subprocess.Popen([str(link), "-c", "import time; time.sleep(30)", "-N", "node7"])
    try:
        wait_for(lambda: b"node7" in Path(f"/proc/{proc.pid}/cmdline").read_bytes(), timeout=10, interval=0.01,
                 what="the stand-in's exec")
        assert slurmd_program(proc.pid) == str(link)
        assert find_slurmd(proc.pid) == (proc.pid, "node7")
    finally:
        proc.kill()
