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


@pytest.mark.parametrize("line,actions", [
    ("NVRM: API mismatch: the client has the version 570.153.02, but", ["drain"]),
    ("NVRM: API mismatch: the client has the version 535.54.03, but#012NVRM: this kernel module has the version "
     "530.30.02.  Please#012NVRM: make sure that this kernel module and all NVIDIA driver#012NVRM: components have "
     "the same version.", ["drain"]),  # rsyslog's escape of the driver's multi-line notice
    ("NVRM: API mismatch: the client 'kwin_wayland' (pid 1005)", ["drain"]),
    ("nvidia 0000:07:00.0: Direct firmware load for nvidia/570.144/gsp_ga10x.bin failed with error -2", ["drain"]),
    ("NVRM: RmFetchGspRmImages: No firmware image found", ["drain"]),
    ("iwlwifi 0000:00:14.3: Direct firmware load for iwlwifi-so-a0-gf-a0-89.ucode failed with error -2", []),
    ("NVRM: loading NVIDIA UNIX x86_64 Kernel Module  570.148.06  Mon May  5 11:36:21 UTC 2025", []),
])
def test_an_inconsistent_nvidia_driver_install_drains_without_blaming_the_gpu(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("md/raid:md2: Disk failure on sdb6, disabling device.", ["notify"]),  # degraded: the data is still served
    ("md/raid1:md0: Disk failure on sdb1, disabling device.", ["notify"]),
    ("md/raid:md2: Too many read errors, failing device sdc1.", ["notify"]),
    ("md/raid:md2: Cannot continue operation (2/4 failed).", ["drain+ticket"]),  # the array failed
    ("md/raid:md2: read error not correctable (sector 2208 on sdb6).", ["drain+ticket"]),
    ("md/raid10:md1: sdc: unrecoverable I/O read error for block 81920", ["drain+ticket"]),
    ("md/raid1:md0: Operation continuing on 1 devices.", []),
    ("md/raid:md2: read error corrected (8 sectors at 2208 on sdb6)", []),
    ("md/raid1:md0: active with 2 out of 2 mirrors", []),
])
def test_software_raid_notifies_on_a_lost_member_and_drains_when_the_array_fails(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("sd 0:1:0:0: rejecting I/O to offline device", ["drain+ticket"]),
    ("sd 2:0:0:0: Device offlined - not ready after error recovery", ["drain+ticket"]),
    ("connection5:0: ping timeout of 5 secs expired, recv timeout 5, last rx 4798244803, last ping 4798249856, "
     "now 4798255104", ["notify"]),
    ("connection1:0: detected conn error (1022)", ["notify"]),
    ("session1: session recovery timed out after 120 secs", ["notify"]),
    ("scsi host4: iSCSI Initiator over TCP/IP", []),
])
def test_an_offlined_disk_drains_and_an_iscsi_connection_error_notifies(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("clocksource: timekeeping watchdog on CPU2: Marking clocksource 'tsc' as unstable because the skew is too "
     "large:", ["notify"]),
    ("clocksource: timekeeping watchdog on CPU3: Marking clocksource 'tsc-early' as unstable because the skew is "
     "too large:", ["notify"]),
    ("tsc: Marking TSC unstable due to clocksource watchdog", ["notify"]),
    ("clocksource: Switched to clocksource tsc", []),
    ("hrtimer: interrupt took 6663395 ns", []),
])
def test_an_unstable_tsc_notifies(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("mce: [Hardware Error]: Machine check: Processor context corrupt", ["drain+ticket"]),
    ("mce: [Hardware Error]: Machine check: Action required: data load in error recoverable area of kernel",
     ["drain+ticket"]),
    ("mce: [Hardware Error]: Machine check events logged", []),  # a corrected event: counted, not acted on alone
])
def test_the_kernels_panic_grade_machine_check_drains(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("nvidia 0000:63:00.0: AER: can't recover (no error_detected callback)", ["drain+reboot"]),
    ("snd_hda_intel 0000:03:00.1: AER: can't recover (no error_detected callback)", ["drain+reboot"]),
    ("pcieport 0000:00:1c.5: AER: Corrected error received: 0000:00:1c.5", []),
])
def test_aer_that_cannot_recover_a_device_reboots(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,kinds", [
    ("[sh03-01n01:26318:0:26318] ib_mlx5_log.c:139  Remote QP on mlx5_0:1/IB (synd 0x14 vend 0x89 hw_synd 0/0)",
     ["nccl_error"]),  # the peer's side failed the work request
    ("[node2:1:0:1] ib_mlx5_log.c:177  Remote access on mlx5_1:1/IB (synd 0x13 vend 0x88 hw_synd 0/0)",
     ["nccl_error"]),
    ("[cn0244:260472] pml_ucx.c:421  Error: ucp_ep_create(proc=47) failed: Input/output error", ["nccl_error"]),
    ("[cn0244:260472] pml_ucx.c:472  Error: Failed to resolve UCX endpoint for rank 19", ["nccl_error"]),
    ("user:16901:16967 [2] misc/socket.cc:441 NCCL WARN socketFinalizeAccept: wrong type 4 != 3", ["nccl_error"]),
    ("gpu004:2200689:2200706 [3] misc/socket.cc:49 NCCL WARN socketProgress: Connection closed by remote peer "
     "gpu004<55693>", ["nccl_error"]),
    # the job's own bug on its own side: kept as output, no event
    ("[a670n1:162239:0:162239] ib_mlx5_log.c:177  Local protection on mlx5_0:1/IB (synd 0x4 vend 0x51 hw_synd 0/2)",
     []),
    ("ng30903:3063025:3066048 [0] NCCL INFO misc/socket.cc:749 -> 6", []),
])
def test_a_peer_the_job_cannot_reach_restarts_it_and_a_local_work_request_bug_does_not(line, kinds):
    assert decide(line, job=True) == (kinds, ["requeue"] if kinds else [])


@pytest.mark.parametrize("message,actions", [
    ("Device: /dev/sdc [SAT], 8 Currently unreadable (pending) sectors", ["notify"]),
    ("Device: /dev/sda [SAT], 1370 Offline uncorrectable sectors", ["notify"]),
    ("Device: /dev/sg1 [cciss_disk_02] [SCSI], SMART Failure: HARDWARE IMPENDING FAILURE GENERAL HARD DRIVE FAILURE",
     ["notify"]),
    ("Device: /dev/nvme0, Critical Warning (0x04): Reliability", ["notify"]),
    ("Device: /dev/sda [SAT], SMART Usage Attribute: 194 Temperature_Celsius changed from 64 to 63", []),
])
def test_smartd_reporting_a_disk_degrading_notifies_and_never_drains(message, actions):
    outcome = try_line(RULES, BY_ID["disk-health-warning"], f"May  4 15:09:40 node1 smartd[15638]: {message}",
                       "rfc3164", SECTIONS)
    assert sorted({f.action for f in outcome.findings}) == actions


@pytest.mark.parametrize("line,actions", [
    # a ring or engine stopped the job's work and the driver reset the GPU itself: the job restarts
    ("[drm:amdgpu_job_timedout [amdgpu]] *ERROR* ring gfx_0.0.0 timeout, signaled seq=9910, emitted seq=9912",
     ["requeue"]),
    ("amdgpu 0000:03:00.0: amdgpu: ring comp_1.1.0 timeout, signaled seq=7, emitted seq=9", ["requeue"]),
    ("amdgpu 0000:03:00.0: amdgpu: IP block:gfx_v11_0 is hung!", ["requeue"]),
    ("[drm:gfx_v11_0_bad_op_irq [amdgpu]] *ERROR* Illegal opcode in command stream", ["requeue"]),
    ("[drm] VRAM is lost due to GPU reset!", ["requeue"]),
    # the recovery is going badly: an admin hears of it before the driver's full reset decides
    ("amdgpu 0000:28:00.0: Ring gfx_0.0.0 reset failed", ["notify"]),
    ("amdgpu 0000:c5:00.0: amdgpu: MES failed to respond to msg=SUSPEND", ["notify"]),
    ("amdgpu 0000:08:00.0: amdgpu: MES(1) failed to respond to msg=REMOVE_QUEUE", ["notify"]),
    ("[drm:mes_v11_0_submit_pkt_and_poll_completion.constprop.0 [amdgpu]] *ERROR* MES failed to response msg=3",
     ["notify"]),
    ("amdgpu 0000:c5:00.0: amdgpu: MES might be in unrecoverable state, issue a GPU reset", ["notify"]),
    ("amdgpu: The cp might be in an unrecoverable state due to an unsuccessful queues preemption", ["notify"]),
    # a GPU the driver cannot reset, start or trust: the node reboots
    ("amdgpu 0000:0b:00.0: amdgpu: GPU reset(1) failed", ["drain+reboot"]),
    ("amdgpu 0000:03:00.0: amdgpu: Fatal error during GPU init", ["drain+reboot"]),
    ("amdgpu 0000:e3:00.0: amdgpu: uncorrectable hardware error(ERREVENT_ATHUB_INTERRUPT) detected!",
     ["drain+reboot"]),
    ("amdgpu 0000:01:00.0: amdgpu: 2 uncorrectable hardware errors detected in umc block", ["drain+reboot"]),
    # look-alikes: recovery that worked, RAS all-clear and totals, corrected errors, set-up lines
    ("amdgpu 0000:08:00.0: amdgpu: GPU reset(2) succeeded!", []),
    ("amdgpu 0000:03:00.0: amdgpu: Ring comp_1.1.0 reset succeeded", []),
    ("amdgpu 0000:c3:00.0: amdgpu: no uncorrectable hardware errors detected in umc block", []),
    ("amdgpu 0000:01:00.0: amdgpu: 1 correctable hardware errors detected in gfx block", []),
    ("amdgpu 0000:83:00.0: amdgpu: ring gfx_0.0.0 uses VM inv eng 0 on hub 0", []),
])
def test_amd_gpu_hangs_restart_the_job_bad_recoveries_notify_and_failed_gpus_reboot(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("habanalabs hl2: Failed to communicate with Device CPU (CPU-CP timeout)", ["drain+reboot"]),
    ("habanalabs 0000:1a:00.0: Failed to initialize hl2. Device is NOT usable !", ["drain+reboot"]),
    ("habanalabs hl0: Device heartbeat failed! PCI link is healthy", ["drain+reboot"]),
    ("habanalabs hl1: Successfully loaded firmware to device", []),
])
def test_a_gaudi_its_driver_cannot_use_reboots(line, actions):
    assert decide(line)[1] == actions


def test_the_nvidia_driver_refusing_work_until_a_reset_reboots():
    assert decide("NVRM: nvAssertOkFailedNoLog: Assertion failed: Reset required [NV_ERR_RESET_REQUIRED] "
                  "(0x00000062) returned from status @ kernel_channel.c:2874") == (["gpu_reset_required"],
                                                                                  ["drain+reboot"])


@pytest.mark.parametrize("line,actions", [
    ("SError Interrupt on CPU5, code 0x00000000be000000 -- SError", ["drain+ticket"]),  # the hardware's error
    ("SError Interrupt on CPU3, code 0xbe000011 -- SError", ["drain+ticket"]),
    ("Kernel panic - not syncing: Asynchronous SError Interrupt", ["drain+reboot"]),  # the panic that follows
])
def test_an_arm64_serror_drains_for_the_hardware_and_its_panic_reboots(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("amdgpu 0000:06:00.0: device has no AER-aware driver", ["drain+reboot"]),  # older kernels' wording
    ("pcieport 0000:00:1c.4: AER: Device recovery failed", ["drain+reboot"]),
    ("pcieport 0000:00:1c.4: AER: Device recovery successful", []),
])
def test_aer_that_cannot_recover_a_device_reboots_in_older_kernels_words_too(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("Feb 02 09:52:07 node1 slurmd[12912]: slurmd: fatal: can't stat gres.conf file /dev/nvidia0: No such file or "
     "directory", ["notify"]),
    ("Feb 20 18:59:13 node1 slurmd[57977]: fatal: gres.conf duplicate records for gpu", ["notify"]),
    ("Feb 22 17:46:38 node1 slurmd[13562]: spank-epilog: error: pyxis: mkdir: cannot create directory "
     "'/opt/enroot/data': Permission denied", ["notify"]),
    ("May 10 05:42:37 node1 systemd[1]: slurm.service: main process exited, code=exited, status=1/FAILURE",
     ["notify"]),  # older systemd's lower-case wording
    ("Dec 14 09:44:56 node1 slurmstepd[4242]: error: *** STEP 63532.0 STEPD TERMINATED ON node1 AT "
     "2020-12-14T09:44:56 DUE TO JOB NOT ENDING WITH SIGNALS ***", ["notify"]),  # unkillable: SLURM drains itself
    ("Dec 14 09:44:56 node1 slurmstepd[4242]: [63532.0] error: *** STEP 63532.0 ON node1 CANCELLED AT "
     "2020-12-14T09:44:56 ***", []),  # a user's scancel
    ("Feb 02 09:51:48 node1 slurmd[12912]: slurmd: slurmd version 23.02.7 started", []),
    ("Feb 02 09:51:48 node1 slurmd[12912]: error: Node configuration differs from hardware: CPUs=64:128(hw)", []),
    ("Feb 02 09:52:07 node1 kernel: slurmd: fatal: not slurmd's own line", []),  # the kernel does not speak for it
])
def test_slurmds_own_failures_notify_and_never_drain(line, actions):
    outcome = try_line(RULES, BY_ID["slurm-daemon-error"], line, "rfc3164", SECTIONS)
    assert sorted({f.action for f in outcome.findings}) == actions


@pytest.mark.parametrize("line,kinds,actions", [
    ("libfabric:451707:1708520807::efa:cq:efa_rdm_txe_handle_error():737<warn> err: 5, message: Invalid address",
     ["nccl_error"], ["requeue"]),  # EFA's provider failed a work request
    ("[1,13]<stderr>:libfabric:35:1668017255::efa:cq:rxr_cq_write_tx_error():243<warn> rxr_cq_write_tx_error: "
     "err: 20, prov_err: Not a directory (20)", ["nccl_error"], ["requeue"]),
    ("Unable to write to EQ: Missing or unavailable event queue. err: Input/output error (5) prov_errno: Unknown "
     "error -12 (-12) prov/efa/src/rxr/rxr.h:1343", ["nccl_error"], ["requeue"]),
    ("nccl_net_ofi_domain_get_ep:969 NCCL WARN NET/OFI Creating new endpoint for domain 0x7f9befa99380 failed: "
     "Invalid argument", ["nccl_error"], ["requeue"]),
    ("compute-dy-p4d-1: Test CUDA failure common.cu:1045 'unknown error'", ["nccl_error"], ["requeue"]),
    ("Test CUDA failure common.cu:1007 'CUDA-capable device(s) is/are busy or unavailable'", ["nccl_error"],
     ["requeue"]),
    (" [WARN] Kernel module nvidia_uvm is not loaded. Make sure the NVIDIA device driver is installed and loaded",
     ["cuda_driver_unusable"], ["notify"]),  # enroot's NVIDIA hook
    ("nvidia-container-cli: initialization error: nvml error: driver not loaded", ["cuda_driver_unusable"],
     ["notify"]),
    ("srun: error: Task launch for 23.0 failed on node node3: Job prolog failed", ["slurm_prolog_failed"],
     ["notify"]),
    ("salloc: Prolog failure on node k003-006", ["slurm_prolog_failed"], ["notify"]),
    ("slurmstepd: error: Prolog hung on node worker-3", ["slurm_prolog_failed"], ["notify"]),
    # look-alikes: the plugin's and libfabric's informational lines, a test that passed
    ("ip-172-31-69-127:451707:453373 [4] NCCL INFO NET/OFI Using aws-ofi-nccl 1.7.4-aws", [], []),
    ("libfabric:35:1668017255::efa:core:efa_device_init():120<info> EFA device 0 ready", [], []),
    ("8h200-2:6831:6840 [0] NCCL INFO TUNER/Plugin: Failed to find ncclTunerPlugin_v3 symbol.", [], []),
    ("# Out of bounds values : 0 OK", [], []),
])
def test_efa_and_nccl_tests_failures_restart_the_job_and_a_node_that_cannot_start_it_notifies(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


def test_a_slurm_prolog_failure_names_the_node():
    outcome = try_line(RULES, BY_ID["slurm-prolog-failed"], "salloc: Prolog failure on node k003-006", "plain",
                       SECTIONS)
    assert outcome.events[0]["fields"]["slurm_node"] == "k003-006"


@pytest.mark.parametrize("line,actions", [
    # an Intel GPU hung on a process's work and its driver reset it: the job restarts
    ("i915 0000:00:02.0: [drm] GPU HANG: ecode 12:1:85dffffb, in python3 [4121]", ["requeue"]),
    ("i915 0000:00:02.0: GPU HANG: ecode 6:1:0xfffffffe, in python3 [2483], hang on rcs0", ["requeue"]),
    ("[drm] GPU HANG: ecode 7:0:0x87c3ffff, reason: Ring hung, action: reset", ["requeue"]),  # older kernels
    ("i915 0000:00:02.0: [drm] python3[4121] context reset due to GPU hang", ["requeue"]),
    ("xe 0000:0b:00.0: [drm] Tile0: GT0: Engine reset: engine_class=ccs, logical_mask: 0x1, guc_id=2, state=0x3",
     ["requeue"]),
    # the GuC stops answering or cannot reset an engine: an admin hears of it before the full reset decides
    ("i915 0000:30:00.0: [drm] *ERROR* GT0 [GUC COMMUNICATION] CT: No response for request 0x5503 (fence 168)",
     ["notify"]),
    ("i915 0000:00:02.0: [drm] *ERROR* GT0: GUC: TLB invalidation response timed out for seqno 309", ["notify"]),
    ("i915 0000:00:02.0: [drm] *ERROR* GT0: GUC: CT: Communication stalled for 2175 ms, desc status=0x0,0x0",
     ["notify"]),
    ("i915 0000:00:02.0: [drm] Resetting chip for GuC failed to reset engine mask=0x1", ["notify"]),
    ("xe 0000:00:02.0: [drm] *ERROR* Tile0: GT0: GuC engine reset request failed on 0:0 because 0x00000000",
     ["notify"]),
    # a GPU its driver cannot reset or start, declared wedged: the node reboots
    ("i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to reset GuC, ret = -110", ["drain+reboot"]),
    ("xe 0000:00:02.0: [drm] *ERROR* Tile0: GT0: reset failed (-ETIMEDOUT)", ["drain+reboot"]),
    ("xe 0000:00:02.0: [drm] *ERROR* CRITICAL: Xe has declared device 0000:00:02.0 as wedged.", ["drain+reboot"]),
    ("i915 0000:00:02.0: [drm] *ERROR* GT0: Failed to initialize GPU, declaring it wedged!", ["drain+reboot"]),
    # firmware the driver refuses or cannot start: the node's install, drained without blaming the GPU
    ("xe 0000:00:02.0: [drm] *ERROR* GT0: Unsupported GuC v70.20.0! v70.29.2 or newer is required", ["drain"]),
    ("i915 0000:0d:00.0: [drm] GT0: GUC: load failed: status = 0x40000056, time = 0ms, freq = 2400MHz, ret = 0",
     ["drain"]),
    ("i915 0000:00:02.0: [drm] *ERROR* GT0: GuC initialization failed -ENXIO", ["drain"]),
    ("xe 0000:00:02.0: probe with driver xe failed with error -22", ["drain"]),
    # look-alikes: resets that worked, the driver's advice, firmware loaded, a GPU that recovered
    ("i915 0000:00:02.0: [drm] Resetting chip for stopped heartbeat on rcs0", []),
    ("drm/i915: Resetting chip after gpu hang", []),
    ("[drm] GPU hangs can indicate a bug anywhere in the entire gfx stack, including userspace.", []),
    ("xe 0000:00:02.0: [drm] Tile0: GT0: reset started", []),
    ("xe 0000:03:00.0: [drm] Using GuC firmware from xe/bmg_guc_70.bin version 70.36.0", []),
    ("amdgpu 0000:03:00.0: [drm] device wedged, but recovered through reset", []),
])
def test_intel_gpu_hangs_restart_the_job_guc_trouble_notifies_and_wedged_gpus_reboot(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("CIFS VFS: Error connecting to socket. Aborting operation.", ["notify"]),
    ("CIFS VFS: cifs_mount failed w/return code = -115", ["notify"]),
    ("CIFS: VFS: \\\\fileserver has not responded in 180 seconds. Reconnecting...", ["notify"]),
    ("nvme nvme0: queue 0: timeout cid 0xf000 type 4 opcode 0x18 (Admin Cmd)", ["notify"]),  # NVMe-oF keep-alive
    ("block nvme0n1: no usable path - requeuing I/O", ["notify"]),
    ("nvme nvme0: failed nvme_keep_alive_end_io error=10", ["notify"]),
    ("WARNING: Pool 'tank' has encountered an uncorrectable I/O failure and has been suspended.", ["drain"]),
    ("WARNING: MMP writes to pool 'tank' have not succeeded in over 5s; suspending pool", ["drain"]),
    ("CIFS: Attempting to mount //fileserver/share", []),
    ("nvme nvme0: creating 4 I/O queues.", []),
    ("ZFS: Loaded module v2.1.5-1, ZFS pool version 5000, ZFS filesystem version 5", []),
])
def test_network_storage_clients_losing_their_server_notify_and_a_suspended_zfs_pool_drains(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,kinds,actions", [
    ("[1595598109.293924] [cn007:58829:0]       ib_verbs.h:84   UCX  ERROR ibv_exp_query_device(mlx5_0) returned "
     "38: Inappropriate ioctl for device", ["rdma_device_unusable"], ["notify"]),
    ("2024-10-09 15:47:38.568412: E external/xla/xla/tsl/distributed_runtime/coordination/coordination_service.cc:1170]"
     " /job:jax_worker/replica:0/task:0 has been set to ERROR in coordination service: UNAVAILABLE: Task "
     "/job:jax_worker/replica:0/task:0 heartbeat timeout. This indicates that the remote task has failed, got "
     "preempted, or crashed unexpectedly.", ["coordination_lost"], ["requeue"]),
    ("2024-04-12 23:39:41.656900: E external/xla/xla/pjrt/distributed/client.cc:96] Coordination service agent in "
     "error status: DEADLINE_EXCEEDED: Deadline Exceeded", ["coordination_lost"], ["requeue"]),
    # look-alikes: a barrier a misconfigured launch never reaches, a setting, a UCX call the job got wrong
    ("jaxlib.xla_extension.XlaRuntimeError: DEADLINE_EXCEEDED: Barrier timed out. Barrier_id: PjRT_Client_Connect.",
     [], []),
    ("I0101 00:00:00.000000 coordination_service.cc:100] Setting heartbeat timeout to 100 seconds", [], []),
    ("[cn007:58829:0] ib_iface.c:1020 UCX  ERROR ibv_create_qp() failed: Cannot allocate memory", [], []),
])
def test_a_lost_jax_task_restarts_the_job_and_an_unusable_rdma_device_notifies(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


@pytest.mark.parametrize("line,message,why", [
    # a syslog template with the facility in brackets: the facility says whose line it is
    ("Feb  9 22:22:29 [kern.warning] [  377.489617] WARNING: Pool 'tank' has been suspended.",
     "WARNING: Pool 'tank' has been suspended.", ""),
    ("Feb  9 22:22:29 node1 [kern.err] kernel: [  377.4] XFS (sda1): Corruption detected.",
     "XFS (sda1): Corruption detected.", ""),
    ("Feb  9 22:22:29 [user.warning] kernel: WARNING: Pool 'tank' has been suspended.",
     "WARNING: Pool 'tank' has been suspended.", "facility user"),  # a user's `logger -t kernel`
    # dmesg -T in a CJK locale: the month leads with its number
    ("[三 9月  6 11:00:27 2017] [drm] GPU HANG: ecode 9:0:0x85dffffb, in x [1296]",
     "[drm] GPU HANG: ecode 9:0:0x85dffffb, in x [1296]", ""),
])
def test_envelopes_naming_the_facility_in_brackets_or_a_cjk_month_are_read(line, message, why):
    from sigma.telemetry.logformats import parse, unattributed

    parsed = parse(line)
    assert (parsed.message, unattributed(parsed, ["kernel"])) == (message, why)
    assert parsed.ts is not None


@pytest.mark.parametrize("line,actions", [
    # the NVIDIA driver's RPCs to the GPU's firmware processor failing (status 0xf: the GPU is lost) reboot
    ("NVRM: _issueRpcAndWait: rpcSendMessage failed with status 0x0000000f for fn 76!", ["drain+reboot"]),
    ("NVRM: _issueRpcAndWait: rpcRecvPoll failed with status 0x00000065 for fn 10!", ["drain+reboot"]),
    # die()'s header in any trap's words, and the kernel finding its own lists corrupted, reboot
    ("invalid opcode: 0000 [#1] SMP PTI", ["drain+reboot"]),
    ("stack segment: 0000 [#1] PREEMPT SMP NOPTI", ["drain+reboot"]),
    ("list_del corruption. prev->next should be ffff98679438a5d0, but was ca53e83f5e8cf5a8", ["drain+reboot"]),
    ("list_add corruption. next->prev should be prev (ffff8881), but was ffff8882. (next=ffff8883).",
     ["drain+reboot"]),
    # GPU page faults of drivers without Xids restart the job, as Xid 31 does
    ("*** gpu fault: ttbr0=000000018bbd9000 iova=0000000115af0000 dir=READ type=TRANSLATION source=CCU (0,0,0,1)",
     ["requeue"]),
    ("METAX.B10200.ATU.ERROR hwip DMAW0 fault code(7) perm code: 2", ["requeue"]),
    # look-alikes: another program's RPC, a USB device, the driver's informational lines
    ("rpcbind: rpcSendMessage failed with status 0x1", []),
    ("usb 1-1: device not accepting address 3, error -71", []),
    ("METAX.B10200.ATU.INFO atu 0x0 pde_base_addr 0x50016c0000", []),
])
def test_gsp_rpcs_failing_and_kernel_traps_reboot_and_gpu_page_faults_restart_the_job(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,kinds,actions", [
    ("NCCL error in: ProcessGroupNCCL.cpp:1269, internal error, NCCL version 2.14.3", ["nccl_error"], ["requeue"]),
    ("ncclInternalError: Internal check failed.", ["nccl_error"], ["requeue"]),
    ("-:6015:6224 [1] proxy.cc:884 NCCL WARN Proxy Call to rank 1 failed (Connect)", ["nccl_error"], ["requeue"]),
    ("torch.AcceleratorError: CUDA error: CUDA-capable device(s) is/are busy or unavailable", ["cuda_error"],
     ["requeue"]),
    # the same runtime errors in PyTorch's pre-1.0 envelopes and the runtime's older wording
    ("THCudaCheck FAIL file=/opt/conda/work/aten/src/THC/THCGeneral.cpp line=51 error=46 : all CUDA-capable devices "
     "are busy or unavailable", ["cuda_error"], ["requeue"]),
    ("RuntimeError: cuda runtime error (46) : all CUDA-capable devices are busy or unavailable at /pytorch/aten/src/"
     "THC/THCGeneral.cpp:51", ["cuda_error"], ["requeue"]),
    ("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCCachingHostAllocator.cpp line=265 error=39 : uncorrectable ECC "
     "error encountered", ["cuda_error"], ["requeue"]),
    # the job's own bugs in the same envelope: no event
    ("THCudaCheck FAIL file=/pytorch/aten/src/THC/THCGeneral.cpp line=405 error=11 : invalid argument", [], []),
    ("THCudaCheck FAIL file=/pytorch/aten/src/THC/generic/THCStorage.cu line=58 error=2 : out of memory", [], []),
    # gpu-burn: a GPU's worker died (its progress line), its verdict FAULTY: the node's GPU is suspect
    ("30.0%  proc'd: 1 (9 Gflop/s) - -1 (0 Gflop/s)   errors: 0 - -5337  (DIED!)  temps: 30 C - 30 C ",
     ["burn_in_failed"], ["notify"]),
    ("\tGPU 1: FAULTY", ["burn_in_failed"], ["notify"]),
    # look-alikes: the job's own misuse, the hint PyTorch prints after an error, a GPU that passed
    ("NCCL error in: ProcessGroupNCCL.cpp:1269, invalid usage, NCCL version 2.14.3", [], []),
    ("Search for `cudaErrorDevicesUnavailable' in https://docs.nvidia.com/cuda/cuda-runtime-api/group__CUDART__TYPES"
     ".html for more information.", [], []),
    ("\tGPU 0: OK", [], []),
    ("No clients are alive!  Aborting", [], []),
])
def test_nccl_internal_and_proxy_errors_and_a_busy_gpu_restart_the_job_and_a_failed_burn_in_notifies(line, kinds,
                                                                                                   actions):
    assert decide(line, job=True) == (kinds, actions)


@pytest.mark.parametrize("line,kinds,actions", [
    # the block layer refusing what a stacked device sent past the limits of the device under it: the stack's setup
    ("bio too big device dm-13 (1944 > 1024)", ["block_io_rejected"], ["notify"]),
    ("bio too big for device dm-0 (256 > 255)", ["block_io_rejected"], ["notify"]),
    ("blk_cloned_rq_check_limits: over max size limit. (2048 > 1024)", ["block_io_rejected"], ["notify"]),
    # look-alikes: a device's limits as the kernel sets them, a program's own words
    ("device-mapper: table: 253:3: adding target device sdb caused an alignment inconsistency", [], []),
])
def test_a_stacked_device_past_its_limits_notifies(line, kinds, actions):
    assert decide(line) == (kinds, actions)


@pytest.mark.parametrize("line,kinds,actions", [
    # slurmstepd cannot run the batch script slurmd wrote into its own spool: the node's spool is gone or unusable
    ("slurmstepd: error: execve(): /tmp/slurmd/job00089/slurm_script: No such file or directory",
     ["slurm_batch_script_lost"], ["notify"]),
    ("slurmstepd-gpu3: error: execve(): /var/spool/slurmd/job4242/slurm_script: Permission denied",
     ["slurm_batch_script_lost"], ["notify"]),
    # look-alike: a program of the job's own that cannot be run is the job's bug
    ("slurmstepd: error: execve(): ./train.sh: No such file or directory", [], []),
    ("slurmstepd: error: execve(): python3: Permission denied", [], []),
])
def test_a_batch_script_lost_from_slurmds_spool_notifies_and_a_jobs_own_program_does_not(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


@pytest.mark.parametrize("line,kinds,actions", [
    # the driver's unknown error: the GPU was lost or hung under the job (the node is judged from its kernel log)
    ("[default3]:  what():  CUDA error: unknown error", ["cuda_error"], ["requeue"]),
    ("RuntimeError: CUDA error: unknown error", ["cuda_error"], ["requeue"]),
    ("[rank1]: torch.AcceleratorError: CUDA error: unknown error", ["cuda_error"], ["requeue"]),
    ("jax.errors.JaxRuntimeError: INTERNAL: CUDA_ERROR_UNKNOWN: unknown error", ["cuda_error"], ["requeue"]),
    ("cudaErrorUnknown returned by cudaStreamSynchronize", ["cuda_error"], ["requeue"]),
    # look-alikes: the job's own bugs, an unknown error code of a program's own
    ("RuntimeError: CUDA error: device-side assert triggered", [], []),
    ("RuntimeError: CUDA error: an illegal memory access was encountered", ["cuda_error"], []),
    ("ValueError: unknown error code 42", [], []),
])
def test_the_cuda_drivers_unknown_error_restarts_the_job(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


@pytest.mark.parametrize("line,kinds,actions", [
    # PyTorch's DataLoader workers out of the node's /dev/shm: the job dies, the node goes on
    ("ERROR: Unexpected bus error encountered in worker. This might be caused by insufficient shared memory (shm).",
     ["shm_exhausted"], ["requeue"]),
    ("RuntimeError: DataLoader worker (pid 30882) is killed by signal: Bus error. It is possible that dataloader's "
     "workers are out of shared memory. Please try to raise your shared memory limit.", ["shm_exhausted"], ["requeue"]),
    ("[rank0]: RuntimeError: unable to write to file </torch_2161_2933553693_0>: No space left on device (28)",
     ["shm_exhausted"], ["requeue"]),
    # look-alikes: a worker gone for another reason, the job's own crash, /dev/shm's usage, a checkpoint's disk full
    ("RuntimeError: DataLoader worker (pid(s) 1234) exited unexpectedly", [], []),
    ("Bus error (core dumped)", [], []),
    ("tmpfs            94G  336K   94G   1% /dev/shm", [], []),
    ("OSError: [Errno 28] No space left on device: '/checkpoints/global_step100'", [], []),
])
def test_dataloader_workers_out_of_shared_memory_restart_the_job(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


@pytest.mark.parametrize("line,kinds,actions", [
    ("srun: error: Node failure on jean-zay-iam37", ["slurm_node_failure"], ["requeue"]),
    ("salloc: error: Node failure on node[3-4]", ["slurm_node_failure"], ["requeue"]),
    ("3: srun: error: Node failure on node7", ["slurm_node_failure"], ["requeue"]),  # srun --label
    ("slurmstepd: error: *** STEP 1943824.0 ON jean-zay-iam17 CANCELLED AT 2023-03-06T03:17:51 DUE TO NODE FAILURE, "
     "SEE SLURMCTLD LOG FOR DETAILS ***", ["slurm_node_failure"], ["requeue"]),
    ("slurmstepd-node3: error: *** JOB 4242 ON node3 CANCELLED AT 2023-03-06T03:17:51 DUE TO NODE FAILURE, SEE "
     "SLURMCTLD LOG FOR DETAILS ***", ["slurm_node_failure"], ["requeue"]),
    # look-alikes: the step's own end, other cancels, a program's words, a task that merely ended
    ("srun: Job step aborted: Waiting up to 62 seconds for job step to finish.", [], []),
    ("slurmstepd: error: *** STEP 4242.0 ON node3 CANCELLED AT 2023-03-06T03:17:51 DUE TO TIME LIMIT ***", [], []),
    ("slurmstepd: error: *** JOB 4242 ON node3 CANCELLED AT 2023-03-06T03:17:51 DUE TO PREEMPTION ***", [], []),
    ("slurmstepd: error: *** STEP 4242.0 ON node3 CANCELLED AT 2023-03-06T03:17:51 ***", [], []),
    ("srun: error: jean-zay-iam06: task 0: Terminated", [], []),
    ("retrying: the data loader saw a node failure on shard 3", [], []),
])
def test_slurms_word_that_a_node_of_the_job_failed_restarts_the_job(line, kinds, actions):
    assert decide(line, job=True) == (kinds, actions)


def test_a_slurm_node_failure_names_the_failed_node():
    outcome = try_line(RULES, BY_ID["slurm-node-failure"], "srun: error: Node failure on node7", "plain", SECTIONS)
    assert outcome.events[0]["fields"]["slurm_node"] == "node7"


@pytest.mark.parametrize("line,actions", [
    ("NVRM: _kgspBootGspRm: unexpected WPR2 already up, cannot proceed with booting GSP", ["drain+reboot"]),
    ("NVRM: _kgspBootGspRm: (the GPU is likely in a bad state and may need to be reset)", ["drain+reboot"]),
    ("NVRM kgspInitRm_IMPL: cannot bootstrap riscv/gsp: 0x40", ["drain+reboot"]),  # 515-525: no colon after NVRM
    ("NVRM RmInitAdapter: Cannot initialize GSP firmware RM", ["drain+reboot"]),
    ("NVRM s_executeBooterUcode_TU102: Booter failed with non-zero error code: 0x3", ["drain+reboot"]),
    ("NVRM: GPU 0000:17:00.0: RmInitAdapter failed! (0x62:0x40:1941)", ["drain+reboot"]),
    ("NVRM cpuidInfoAMD: Unrecognized AMD processor in cpuidInfoAMD", []),
    ("NVRM: loading NVIDIA UNIX Open Kernel Module for x86_64  525.60.11  Release Build", []),
])
def test_a_gsp_that_cannot_boot_reboots_in_either_nvrm_prefix(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("NVRM: Open nvidia.ko is only ready for use on Data Center GPUs.", ["drain+ticket"]),
    ("NVRM: To force use of Open nvidia.ko on other GPUs, see the", []),  # the rest of the notice says nothing
])
def test_an_open_module_not_ready_for_the_gpu_is_a_refusal(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ("BUG: kernel NULL pointer dereference, address: 0000000000000008", ["drain+reboot"]),
    ("BUG: Kernel NULL pointer dereference on read at 0x00000000", ["drain+reboot"]),  # powerpc's words
    ("BUG: unable to handle kernel NULL pointer dereference at 0000000000000010", ["drain+reboot"]),
    ("#PF: supervisor write access in kernel mode", []),
    ("BUG: sleeping function called from invalid context at kernel/locking/mutex.c:580", []),
])
def test_the_kernel_faulting_on_a_bad_address_reboots_in_old_and_new_words(line, actions):
    assert decide(line)[1] == actions


@pytest.mark.parametrize("line,actions", [
    ('Nov 03 13:31:36 node1 kubelet[1601]: E1103 13:31:36.822843    1601 pod_workers.go:191] Error syncing pod 6d97 '
     '("nvidia-device-plugin-daemonset-x2_gpu-operator(6d97)"), skipping: failed to "StartContainer" for '
     '"nvidia-device-plugin" with CrashLoopBackOff: "back-off 5m0s restarting failed container"', ["notify"]),
    ('Nov 03 13:31:36 node1 kubelet[1601]: E1103 13:31:36.822843    1601 pod_workers.go:191] Error syncing pod 6d97 '
     '("web-7f_default(6d97)"), skipping: failed to "StartContainer" for "web" with CrashLoopBackOff: "back-off"', []),
    ('Nov 03 13:31:29 node1 kubelet[1601]: I1103 13:31:29.309279    1601 setters.go:73] Using node IP: "10.0.0.4"', []),
    ('Nov 03 13:31:36 node1 kernel: failed to "StartContainer" for "nvidia-driver-ctr" with CrashLoopBackOff', []),
])
def test_kubelet_restarting_a_crashing_nvidia_gpu_stack_container_notifies_and_never_drains(line, actions):
    outcome = try_line(RULES, BY_ID["service-failed"], line, "rfc3164", SECTIONS)
    assert sorted({f.action for f in outcome.findings}) == actions
