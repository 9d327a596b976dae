from setuptools import find_packages, setup

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
        "test": ["pytest>=8", "transformers>=4.45", "openai>=1.40", "psycopg[binary]>=3.1,<4", "cysystemd>=2.0.5,<3"],
        # the sidecar reads the systemd journal through libsystemd (else through journalctl); a manylinux_2_34 wheel
        "journal": ["cysystemd>=2.0.5,<3"],
        "llm": ["openai>=1.40"],
        "postgres": ["psycopg[binary]>=3.1,<4"],  # the controller database on PostgreSQL (db: postgresql://...)
    },
    entry_points={"console_scripts": ["sigma=sigma.cli:main"]},
)
