"""Rule and detector ids in words a researcher understands: the knowledge base's own descriptions, and one line
for each built-in detector."""

from __future__ import annotations

from functools import lru_cache

DETECTORS = {
    "watchdog-hang": "the job stopped making progress (no training step within the hang timeout)",
    "watchdog-proc-hang": "the job's processes stopped or made no CPU progress (a job without KPI lines, seen from its "
                          "nodes)",
    "watchdog-throughput-drop": "the job slowed down against its own earlier throughput",
    "watchdog-crash-loop": "the job kept crashing right after each restart",
    "watchdog-straggler": "every other node of the job kept waiting for one node that was held off the CPU",
    "watchdog-throughput-jitter": "the job's step times jittered: a local noise source slowed some steps",
    "isolation-outlier": "one node was slower or odder than the job's other nodes and was taken out",
    "slurm-node-not-responding": "a node stopped answering SLURM (its slurmd or the machine died)",
}


@lru_cache(maxsize=1)
def _descriptions() -> dict[str, str]:
    try:
        from sigma.paths import configs_dir
        from sigma.rules.loader import load_rules

        return {r.id: r.description for r in load_rules(configs_dir() / "rules") if r.description}
    except Exception:  # the words are a courtesy: a broken knowledge base must not break an answer
        return {}


def plain(rule_id: str) -> str:
    """'GPU has fallen off the bus (Xid 79); ...' for gpu-xid-79; the id itself when nothing better is known."""
    return DETECTORS.get(rule_id) or _descriptions().get(rule_id) or rule_id
