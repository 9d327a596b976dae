import os

from setuptools import find_packages, setup
from setuptools.command.build_py import build_py

# The files a site deploys beside the code (configs, rules, playbooks, systemd units, prolog/epilog wrappers, job
# scripts): kept at the top of the checkout, carried in the wheel as sigma/share/<dir> (sigma/paths.py finds both).
SHIPPED_DIRS = ("configs", "daemons", "prolog", "epilog", "sbatch")
HERE = os.path.dirname(os.path.abspath(__file__))


class BuildWithShippedFiles(build_py):
    def run(self):
        super().run()
        if self.editable_mode:  # an editable install reads them in the checkout
            return
        for name in SHIPPED_DIRS:
            self.copy_tree(os.path.join(HERE, name), os.path.join(self.build_lib, "sigma", "share", name),
                           preserve_mode=True)

setup(
    name="sigma-slurm",
    version="0.1.0",
    description="Keep GPU training clusters on SLURM productive: node validation, telemetry, "
    "fault detection and recovery, and a resilient MoE trainer.",
    long_description=open("README.md", encoding="utf-8").read(),
    long_description_content_type="text/markdown",
    python_requires=">=3.11",
    packages=find_packages(include=["sigma", "sigma.*"]),
    include_package_data=True,
    package_data={"sigma.telemetry": ["months.json"]},  # month names of every locale (logformats)
    install_requires=[
        "PyYAML>=6.0,<7",
        "numpy>=1.26,<3",
        "psutil>=5.9,<8",
        "rich>=13,<16",
        "submitit==1.5.4",
        "prometheus-client>=0.20,<1",
        "matplotlib>=3.8,<4",  # the plots of `sigma report --html`
        "nvidia-ml-py>=12.535",
        "sqlglot>=25",
        "drain3>=0.9.11,<0.10",  # log template mining for rule learning
        "regex>=2023.0",  # bounded-time probes of rule regexes
        "crc32c>=2.4,<3",  # hardware CRC-32C of in-memory replicas (sigma/train/replica.py)
        # CPU wheel on the build machines; a looser pin pulls a multi-GB CUDA build.
        "torch==2.13.0",
        "tokenizers>=0.19,<1",  # the BPE tokenizer `sigma train prepare` trains on the corpus
    ],
    extras_require={
        # transformers + accelerate and lightning: the trainers of tests/integration/test_own_trainer.py
        "test": ["pytest>=8", "transformers>=4.45", "accelerate>=1.0", "lightning>=2.4,<3",
                 "openai>=1.40", "psycopg[binary]>=3.1,<4", "cysystemd>=2.0.5,<3"],
        # the sidecar reads the systemd journal through libsystemd (else through journalctl); a manylinux_2_34 wheel
        "journal": ["cysystemd>=2.0.5,<3"],
        "llm": ["openai>=1.40"],
        "postgres": ["psycopg[binary]>=3.1,<4"],  # the controller database on PostgreSQL (db: postgresql://...)
    },
    entry_points={"console_scripts": ["sigma=sigma.cli:main"]},
    # next to `sigma` in the environment's bin/: slurm.conf's Prolog= and Epilog= (docs/deploy.md)
    scripts=["prolog/sigma-prolog", "epilog/sigma-epilog"],
    cmdclass={"build_py": BuildWithShippedFiles},
)
