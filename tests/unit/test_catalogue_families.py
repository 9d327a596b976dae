"""Message families of the fault catalogue, one test each: every wording of a family gets the family's action, and
its look-alikes do not (the sidecar's log sections of configs/telemetry.yaml, then the rules of configs/rules)."""

from __future__ import annotations

import pytest

from sigma.paths import configs_dir
from sigma.rules.catalogue import sidecar_sections, try_line
from sigma.rules.loader import load_rules

RULES = load_rules(configs_dir() / "rules")
BY_ID = {r.id: r for r in RULES}
SECTIONS = sidecar_sections(configs_dir() / "telemetry.yaml")


def decide(line: str, *, job: bool = False) -> tuple[list[str], list[str]]:
    """(event kinds, actions) for one line: job output as a rank wrote it, or a kernel line as rsyslog writes it."""
    rule, fmt = (BY_ID["nccl-system-error"], "plain") if job else (BY_ID["disk-io-error"], "rfc3164")
    outcome = try_line(RULES, rule, line, fmt, SECTIONS)
    return [e["kind"] for e in outcome.events], sorted({f.action for f in outcome.findings})


@pytest.mark.parametrize("tag", ["", "worker-1: ", "rdma-test-gpu-worker-1: ", "[rank7]: ", "[default0]:",
                                 "[1,30]<stderr>:", "(RayWorker pid=7046) ", "3: ", "2025-02-18 12:54 [rank13]: ",
                                 "Sun Oct  1 17:01:10 2017[1,30]<stdout>:"])
def test_nccl_last_error_behind_any_launcher_tag_restarts_the_job(tag):
    """PyTorch repeats NCCL's last error at the start of a line ("Last error:"); a launcher may tag it first."""
    for text in ("ncclUnhandledCudaError: Call to CUDA function failed.", "Cuda failure 'initialization error'",
                 "Cuda failure 1 'invalid argument'", "ncclSystemError: System call (e.g. socket, malloc) or "
                 "external library call failed or device error."):
        assert decide(tag + text, job=True) == (["nccl_error"], ["requeue"]), tag + text


def test_a_launcher_tag_naming_the_rank_keeps_it_as_the_culprit():
    outcome = try_line(RULES, BY_ID["nccl-system-error"], "[rank7]: Cuda failure 1 'invalid argument'", "plain",
                       SECTIONS)
    assert outcome.events[0]["fields"]["rank"] == 7


@pytest.mark.parametrize("line", [
    "RuntimeError: retrying after a Cuda failure in the data loader",  # a program's own words mid-line
    "epoch 3: ncclSystemError counts are logged below",  # not the error's name at the start of the text
    "usage: set NCCL_IB_RETRY_CNT to change the transport retry count",
])
def test_the_same_words_elsewhere_in_a_line_make_no_event(line):
    assert decide(line, job=True) == ([], [])


@pytest.mark.parametrize("line,kind", [
    ("node3:4242:4300 [0] NCCL WARN NET/IB : Got completion with error 12, opcode 0, len 0, vendor err 129",
     "nccl_error"),  # NCCL before 2.19: no peer named
    ("[g07r1n14:27251:0:27251] ib_mlx5_log.c:143  Transport retry count exceeded on mlx5_0:1/IB (synd 0x15 vend 0x81)",
     "nccl_error"),  # UCX over mlx5
    ("[1506866470.744682] [host-065:1411 :0]  dc_verbs.c:633  UCX  ERROR Send completion with error on qp 0x10e55: "
     "transport retry counter exceeded syndrome 0x81", "nccl_error"),
    ("[rank1]:[E1002 18:16:40.662691402 ProcessGroupNCCL.cpp:756] [Rank 1] Work WorkNCCL(SeqNum=2521, "
     "OpType=ALLREDUCE, NumelIn=1, NumelOut=1, Timeout(ms)=600000) timed out in blocking wait.", "nccl_timeout"),
])
def test_older_nccl_ucx_and_pytorch_wordings_restart_the_job(line, kind):
    assert decide(line, job=True) == ([kind], ["requeue"])


def test_a_job_that_cannot_load_the_cuda_driver_notifies_and_restarts_nothing():
    for line in ("host-0:4163:4163 [0] misc/cudawrap.cc:179 NCCL WARN Failed to find CUDA library libcuda.so "
                 "(NCCL_CUDA_PATH='') : libcuda.so: cannot open shared object file: No such file or directory",
                 "[rank0]: RuntimeError: Found no NVIDIA driver on your system."):
        assert decide(line, job=True) == (["cuda_driver_unusable"], ["notify"])


@pytest.mark.parametrize("line,actions", [
    ("ata3.00: error: { UNC }", ["drain+ticket"]),  # an uncorrectable read
    ("ata1.00: error: { IDNF }", ["drain+ticket"]),  # the sector was not found
    ("ata1.00: error: { ICRC ABRT }", []),  # a transfer CRC error: the cable or link, not the medium
    ("ata1: hard resetting link", ["notify"]),
    ("ata2: COMRESET failed (errno=-16)", ["notify"]),
    ("ata1: limiting SATA link speed to 3.0 Gbps", ["notify"]),
    ("ata1: SATA link up 6.0 Gbps (SStatus 133 SControl 300)", []),
])
def test_libata_media_errors_drain_link_resets_notify(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("EXT4-fs (dm-25): previous I/O error to superblock detected", ["drain"]),
    ("EXT4-fs (sda1): I/O error while writing superblock", ["drain"]),
    ("EXT4-fs (sdb1): error loading journal", ["drain"]),
    ("EXT4-fs (sda1): mounted filesystem with ordered data mode. Quota mode: none.", []),
])
def test_ext4_superblock_and_journal_io_errors_drain(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("mlx5_core: probe of 0000:3b:00.0 failed with error -22", ["drain"]),
    ("mlx5_core 0000:03:00.0: mlx5_load_one failed with error code -22", ["drain"]),
    ("mlx5_core 0000:01:00.0: handle_hca_cap failed", ["drain"]),
    ("mlx5_core 0000:03:00.0: firmware version: 14.32.1010", []),
    ("mlx5_core 0000:03:00.0: enabling device (0000 -> 0002)", []),
])
def test_a_fabric_nic_that_cannot_come_up_drains(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("mpt2sas3: attempting device reset! scmd(ffff8814605d2100)", ["notify"]),
    ("mpt2sas3: attempting target reset! scmd(ffff8814605d2100)", ["notify"]),
    ("pm80xx pm8001_mpi_task_abort_resp 3742:task abort failed status 0x6 ,tag = 0x1, scp= 0x0", ["notify"]),
    ("ata2.00: exception Emask 0x3 SAct 0x8001ffff SErr 0x0 action 0x6 frozen", ["notify"]),
    ("sd 4:0:1:0: attempting task abort! scmd(ffff880204baee80)", []),  # one command aborted: kept, no action
    ("mpt2sas3: device reset: SUCCESS scmd(ffff8814605d2100)", []),
])
def test_scsi_error_handling_past_one_abort_notifies(line, actions):
    assert decide(line)[1] == actions


def test_a_parallel_filesystem_client_that_cannot_mount_drains():
    assert decide("beegfs: mount(1516568): Configuration error: Initialization of common objects failed.")[1] == \
        ["drain"]
    assert decide("beegfs: mount(1516568): Built without NVFS RDMA support.")[1] == []


def test_a_bad_line_prefix_is_refused_naming_the_setting():
    from sigma.telemetry.collectors.logtail import LogTailCollector

    with pytest.raises(ValueError, match=r"line_prefix: bad regex '\[rank'"):
        LogTailCollector.Params(files=["x.log"], line_prefix="[rank")


@pytest.mark.parametrize("line,actions", [
    ("sd 1:0:1:0: [sdg] tag#1 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_SENSE", ["notify"]),
    ("sd 2:0:0:0: [sdb] tag#3 FAILED Result: hostbyte=DID_OK driverbyte=DRIVER_OK cmd_age=0s", ["notify"]),
    ("sd 7:0:0:1: [sdf] tag#2 Sense Key : Medium Error [current]", ["drain+ticket"]),
    ("sd 0:0:2:0: [sdc] tag#0 Sense Key : Hardware Error [current] [descriptor]", ["drain+ticket"]),
    ("sd 2:0:0:0: [sda] tag#5 Add. Sense: Unrecovered read error - auto reallocate failed", ["drain+ticket"]),
    ("sd 1:0:1:0: [sdg] tag#1 Sense Key : Illegal Request [current]", []),  # a spun-down disk: fine
    ("sd 6:0:0:0: [sdb] tag#0 Sense Key : Not Ready [current]", []),
    ("sd 6:0:0:0: [sdb] Sense Key : Unit Attention [current]", []),
    ("sd 0:0:0:0: [sda] tag#7 Sense Key : Recovered Error [current] [descriptor]", []),
])
def test_a_scsi_commands_sense_key_decides_not_its_failed_result(line, actions):
    kinds, decided = decide(line)
    assert decided == actions
    if not actions:
        assert kinds == ["scsi_sense"]


@pytest.mark.parametrize("line,actions", [
    ("nvme0n1: I/O Cmd(0x2) @ LBA 131209936, 200 blocks, I/O Error (sct 0x3 / sc 0x71)", ["drain+ticket"]),
    ("nvme0n1: Write(0x1) @ LBA 100492368, 2048 blocks, Data Transfer Error (sct 0x0 / sc 0x4)", ["drain+ticket"]),
    ("nvme1: Async Event(0xc), Host Aborted Command (sct 0x3 / sc 0x71)", []),  # aborted by a controller reset
])
def test_an_nvme_status_drains_for_an_io_command_not_an_admin_one(line, actions):
    assert decide(line)[1] == actions
