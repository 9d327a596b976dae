"""A site as sigma finds it, on emulated hosts (tests/integration/hosts.py): a head node running munge, MariaDB,
slurmdbd and slurmctld, and compute nodes running munge, journald (their kernel log) and slurmd; the site's own
slurm.conf on every host, its munge key, its /etc/hosts, and /home shared. Nothing of sigma: the deployment test
puts sigma there by docs/deploy.md.

Each host boots with /etc/rc.boot, as its init system would start its services, and starts sigma's systemd units
an admin enabled (/etc/systemd/system/multi-user.target.wants/sigma-*.service; the machine's own enabled units,
SLURM's among them, are rc.boot's business) through tests/integration/unitrun.py. A
reboot runs it again (`slurmd -b`: "rebooted now"); the site's RebootProgram asks the host's init for one.
"""

from __future__ import annotations

import secrets
import time
from pathlib import Path

from tests.integration.hosts import Host, Network

CLUSTER = "deploytest"

SLURM_CONF = """# the site's slurm.conf (sigma's lines are added by the admin: docs/deploy.md)
ClusterName={cluster}
SlurmctldHost={head}
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
StateSaveLocation=/var/spool/slurmctld
SlurmdSpoolDir=/var/spool/slurmd
SlurmctldPidFile=/run/slurmctld.pid
SlurmdPidFile=/run/slurmd.pid
SlurmctldLogFile=/var/log/slurm/slurmctld.log
SlurmdLogFile=/var/log/slurm/slurmd.log
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
SlurmdParameters=config_overrides
SchedulerType=sched/backfill
RebootProgram=/usr/local/sbin/reboot-host
ResumeTimeout=120
ReturnToService=1
SlurmctldTimeout=30
SlurmdTimeout=10
MessageTimeout=10
InactiveLimit=0
KillWait=5
MinJobAge=600
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost={head}
JobAcctGatherType=jobacct_gather/none
JobCompType=jobcomp/none
NodeName={nodes} CPUs=2 RealMemory=1000 State=UNKNOWN
PartitionName=batch Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""

SLURMDBD_CONF = """AuthType=auth/munge
DbdHost={head}
SlurmUser=root
PidFile=/run/slurmdbd.pid
LogFile=/var/log/slurm/slurmdbd.log
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=slurm
StoragePass={password}
StorageLoc=slurm_acct_db
"""

COMMON_BOOT = """#!/bin/sh
# what this host's init system starts at boot
how=$1
mkdir -p /run/munge /var/log/munge /var/lib/munge /var/log/slurm
chown munge:munge /run/munge /var/log/munge /var/lib/munge
runuser -u munge -- /usr/sbin/munged
"""

UNITS_BOOT = """for unit in /etc/systemd/system/multi-user.target.wants/sigma-*.service; do
  [ -e "$unit" ] && setsid python3 /usr/local/lib/unitrun.py "$unit" </dev/null >/dev/null 2>&1 &
done
"""

HEAD_BOOT = COMMON_BOOT + """mkdir -p /var/spool/slurmctld /run/mysqld
if [ ! -d /var/lib/site-db/mysql ]; then
  mariadb-install-db --no-defaults --user=root --datadir=/var/lib/site-db --auth-root-authentication-method=socket \
    --skip-test-db --innodb-log-file-size=8M > /var/log/site-db-install.log 2>&1
  first=1
fi
setsid mariadbd --no-defaults --user=root --datadir=/var/lib/site-db --socket=/run/mysqld/mysqld.sock \
  --skip-networking --innodb-buffer-pool-size=32M --innodb-log-file-size=8M --skip-name-resolve \
  --innodb-flush-log-at-trx-commit=2 </dev/null >/var/log/site-db.log 2>&1 &
for i in $(seq 300); do mariadb --socket=/run/mysqld/mysqld.sock -uroot -e 'select 1' >/dev/null 2>&1 && break; sleep 0.2; done
mariadb --socket=/run/mysqld/mysqld.sock -uroot -e "CREATE USER IF NOT EXISTS 'slurm'@'localhost' \
  IDENTIFIED BY '{password}'; GRANT ALL ON slurm_acct_db.* TO 'slurm'@'localhost';"
slurmdbd
for i in $(seq 150); do sacctmgr -n -P show cluster >/dev/null 2>&1 && break; sleep 0.2; done
sacctmgr -n -P show cluster format=cluster | grep -qx {cluster} || sacctmgr -i add cluster {cluster}
slurmctld
""" + UNITS_BOOT

NODE_BOOT = COMMON_BOOT + """mkdir -p /var/spool/slurmd /run/log/journal
# journald reads this machine's kernel ring buffer (the emulated hardware's, /mnt/kmsg) as /dev/kmsg
setsid unshare -m --propagation private sh -c 'mount --bind /mnt/kmsg /dev/kmsg && \
  SYSTEMD_LOG_TARGET=console exec /lib/systemd/systemd-journald' </dev/null >/var/log/journald.log 2>&1 &
for i in $(seq 100); do ls /run/log/journal/*/system.journal >/dev/null 2>&1 && break; sleep 0.1; done
# the kernel's first line of this boot (a real journald finds the boot's lines in the ring buffer)
printf '6,1,0,-;Linux version %s (%s: emulated boot, %s)\n' "$(uname -r)" "$(hostname)" "$how" > /mnt/kmsg
if [ "$how" = reboot ]; then slurmd -b; else slurmd; fi
""" + UNITS_BOOT

JOURNALD_CONF = """[Journal]
Storage=volatile
ReadKMsg=yes
RateLimitBurst=0
ForwardToSyslog=no
ForwardToWall=no
"""

REBOOT_PROGRAM = """#!/bin/sh
# the site's RebootProgram: ask this machine's init for a reboot
kill -USR1 1
"""


class Site:
    def __init__(self, workdir: Path, head: str, nodes: list[str], *, image: Path | None, subnet: str = "10.34.0"):
        addresses = {head: f"{subnet}.1", **{n: f"{subnet}.{11 + i}" for i, n in enumerate(nodes)}}
        self.network = Network(f"s{secrets.token_hex(3)}", addresses)
        self.shared = workdir / "home"  # the cluster's shared file system, /home on every host
        self.shared.mkdir(parents=True, exist_ok=True)
        self.head_name, self.node_names = head, nodes
        password = secrets.token_hex(8)
        hosts_file = "127.0.0.1 localhost\n" + "".join(f"{a} {n}\n" for n, a in addresses.items())
        conf = SLURM_CONF.format(cluster=CLUSTER, head=head, nodes=",".join(nodes))
        self.hosts: dict[str, Host] = {}
        for name, address in addresses.items():
            host = Host(name, address, workdir / "hosts", netns=self.network.netns(name), shared=self.shared,
                        image=image)
            host.write("/etc/hosts", hosts_file)
            host.write("/etc/hostname", name + "\n")
            host.write("/etc/machine-id", secrets.token_hex(16) + "\n")
            host.write("/etc/slurm/slurm.conf", conf)
            if name == head:
                host.write("/etc/slurm/slurmdbd.conf", SLURMDBD_CONF.format(head=head, password=password), 0o600)
                host.write("/etc/rc.boot", HEAD_BOOT.format(password=password, cluster=CLUSTER), 0o755)
            else:
                host.write("/etc/systemd/journald.conf", JOURNALD_CONF)
                host.write("/usr/local/sbin/reboot-host", REBOOT_PROGRAM, 0o755)
                host.write("/etc/rc.boot", NODE_BOOT, 0o755)
            self.hosts[name] = host

    @property
    def head(self) -> Host:
        return self.hosts[self.head_name]

    def nodes(self) -> list[Host]:
        return [self.hosts[n] for n in self.node_names]

    def up(self, timeout: float = 180.0) -> "Site":
        self.network.up()
        for host in self.hosts.values():
            host.start()
        deadline = time.monotonic() + timeout
        while True:  # every node registered with slurmctld and idle
            out = self.head.run("sinfo -h -N -o '%N %t'", check=False).stdout.split()
            states = dict(zip(out[::2], out[1::2]))
            if all(states.get(n) == "idle" for n in self.node_names):
                return self
            if time.monotonic() > deadline:
                raise AssertionError(f"the site's SLURM did not come up: sinfo {states}\n"
                                     f"{self.head.read('/var/log/slurm/slurmctld.log')[-3000:]}\n"
                                     f"{self.head.read('/var/log/rc.boot.log')[-2000:]}")
            time.sleep(1)

    def down(self) -> None:
        for host in self.hosts.values():
            host.stop()
        self.network.down()

    def enable(self, host: Host, unit: str) -> None:
        """`systemctl daemon-reload && systemctl enable --now UNIT`, where systemd is not PID 1."""
        wants = "/etc/systemd/system/multi-user.target.wants"
        host.run(f"mkdir -p {wants} && ln -sf /etc/systemd/system/{unit} {wants}/{unit} && "
                 f"setsid python3 /usr/local/lib/unitrun.py /etc/systemd/system/{unit} </dev/null >/dev/null 2>&1 &")

    def reload(self, host: Host, unit: str) -> None:
        """`systemctl reload UNIT`: its ExecReload, kill -HUP $MAINPID."""
        name = unit.removesuffix(".service")
        host.run(f"kill -HUP $(cat /run/{name}.pid)")
