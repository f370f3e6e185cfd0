"""The Spark application a runner (or a standby) works in: one builder for every run,
and the pipeline's own settings applied as runtime SQL confs, so that a standby's warm
session can serve any run it fits. No Django import."""
from __future__ import annotations

import os
import shlex
import sys
import tempfile
from pathlib import Path
from typing import Any

from pipelines.runtime.spec import definition
from pipelines.runtime.cluster import standalone
from pipelines.runtime.cluster.standalone import SECRET_ENV, read_secret

PROJECT_ROOT = Path(__file__).resolve().parents[3]
# The scheduler pools of a live re-plan's generations, by role (replan.pool_for).
FAIR_POOLS = Path(__file__).with_name("fairscheduler.xml")
EXECUTOR_WAIT_S = 90.0
# The executors' Python daemon: PySpark's, with the workers' imports done before it
# forks them (pydaemon.py); ``$STREAMWISE_PYTHON_DAEMON=pyspark.daemon`` restores
# PySpark's own.
PYTHON_DAEMON_ENV = "STREAMWISE_PYTHON_DAEMON"
PYTHON_DAEMON_MODULE = "pipelines.runtime.query.pydaemon"
# After the initial executors registered: how long to wait for the rest of
# spark.cores.max (they start together; one that comes later still is released by the
# late-executor check between batches).
EXTRA_EXECUTOR_WAIT_S = 3.0

STATE_STORE_PROVIDERS = {
    "rocksdb": "org.apache.spark.sql.execution.streaming.state.RocksDBStateStoreProvider",
    "hdfs": "org.apache.spark.sql.execution.streaming.state.HDFSBackedStateStoreProvider",
}

# How queries write their checkpoints and state files (offsets, commits, state deltas
# and changelogs): ``$STREAMWISE_CHECKPOINT_FILES``. Spark's default (``filecontext``)
# goes through Hadoop's FileContext, whose rename asks the local file system whether
# the target is a symlink; without Hadoop's native library (PySpark ships none) that,
# like each new file's permission, is a process the JVM forks: `readlink` and `chmod`,
# ~15 per micro-batch of a keyed count on 4 key groups. Through the FileSystem API
# (``filesystem``, ours) only the `chmod`s are left. Measured on 2 cores, one 1-core
# executor, batches back to back, the two alternated (``bench checkpoint-files``): a
# keyed count's batch 0.99 -> 0.69 CPU s, NEXMark Q5's 1.60 -> 1.01, the kernel's time
# about halved (docs/benchmarks.md). What it gives up is the rename's own refusal of an
# existing target: Spark checks, then renames (``FileSystemBasedCheckpointFileManager``),
# which differs only while two queries write one checkpoint at once; a run's checkpoints
# have one writer at a time (a re-plan's generations each have their own; a transfer's
# is resumed once it ended), in local directories, where rename(2) is atomic. On HDFS,
# ``filecontext`` keeps the atomic refusal. (The classes moved in Spark 4.1;
# requirements.txt pins PySpark.)
CHECKPOINT_FILES_ENV = "STREAMWISE_CHECKPOINT_FILES"
CHECKPOINT_FILE_MANAGERS = {
    "filesystem": "org.apache.spark.sql.execution.streaming.checkpointing."
                  "FileSystemBasedCheckpointFileManager",
    "filecontext": "org.apache.spark.sql.execution.streaming.checkpointing."
                   "FileContextBasedCheckpointFileManager",
}


def checkpoint_file_manager() -> str:
    """The class ``$STREAMWISE_CHECKPOINT_FILES`` names (default ``filesystem``)."""
    name = os.environ.get(CHECKPOINT_FILES_ENV, "").strip() or "filesystem"
    if name not in CHECKPOINT_FILE_MANAGERS:
        raise ValueError(f"{CHECKPOINT_FILES_ENV} must be one of "
                         f"{', '.join(CHECKPOINT_FILE_MANAGERS)}, not {name!r}")
    return CHECKPOINT_FILE_MANAGERS[name]


def driver_host() -> str:
    """The address executors reach the driver at: ``$SPARK_DRIVER_HOST``, else loopback
    (right only while every worker runs on this machine)."""
    return os.environ.get("SPARK_DRIVER_HOST") or "127.0.0.1"


def build_session(master_url: str, app_name: str, max_workers: int,
                  executor_memory: str, locality_wait: str | None = None,
                  host: str | None = None) -> Any:
    """A SparkSession on the cluster with what every run needs (1-core executors,
    decommissioning, no AQE); what differs between pipelines is set by
    ``apply_run_conf`` (runtime SQL confs), so a standby's session fits any run.

    The driver binds to ``host`` (default :func:`driver_host`), where executors on
    other hosts connect. Executors need no file of this machine: the project's code is
    on PYTHONPATH (every worker host runs the same installation, as PySpark needs the
    same Python there), and the data files a definition names are read here and travel
    inside the source's reader (``source.GeneratorStreamReader``)."""
    from pyspark.sql import SparkSession

    from pipelines.runtime.query import py4jnames

    py4jnames.install()  # a driver's per-batch Python calls look JVM names up again
    host = host or driver_host()
    os.environ["PYSPARK_PYTHON"] = sys.executable
    os.environ["SPARK_LOCAL_IP"] = host
    builder = (
        SparkSession.builder.master(master_url)
        .appName(app_name)
        .config("spark.driver.host", host)
        .config("spark.driver.bindAddress", host)
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.ui.killEnabled", "false")  # no kill links on the driver's UI
        .config("spark.cores.max", str(max_workers))
        .config("spark.executor.cores", "1")
        .config("spark.executor.memory", executor_memory)
        .config("spark.pyspark.python", sys.executable)
        .config("spark.executorEnv.PYTHONPATH", str(PROJECT_ROOT))
        # One core per executor: a BLAS thread pool would only compete for it.
        .config("spark.executorEnv.OPENBLAS_NUM_THREADS", "1")
        .config("spark.python.daemon.module",
                os.environ.get(PYTHON_DAEMON_ENV, "").strip() or PYTHON_DAEMON_MODULE)
        .config("spark.sql.adaptive.enabled", "false")
        # A live re-plan runs a second query beside the first (runner.handover.ReplanHandover):
        # FAIR shares the executors between the pools task by task, and the pool of the
        # generation whose output is forwarded comes first (FAIR_POOLS), so its batches
        # are neither queued behind the new one's catch-up nor stretched by it. One
        # query alone is one pool, as with FIFO.
        .config("spark.scheduler.mode", "FAIR")
        .config("spark.scheduler.allocation.file", str(FAIR_POOLS))
        .config("spark.sql.streaming.noDataMicroBatches.enabled", "false")
        .config("spark.sql.streaming.checkpointFileManagerClass", checkpoint_file_manager())
        .config("spark.sql.streaming.stateStore.rocksdb.changelogCheckpointing.enabled",
                "true")
        .config("spark.decommission.enabled", "true")
        .config("spark.storage.decommission.enabled", "true")
        .config("spark.storage.decommission.shuffleBlocks.enabled", "true")
        .config("spark.storage.decommission.replicationReattemptInterval", "5s")
        .config("spark.standalone.executorRemoveDelayOnDisconnection", "0s")
        # The monitor reads each batch's tasks from the status store: keep enough
        # (the defaults retain 1,000 stages/jobs, far more than needed).
        .config("spark.ui.retainedJobs", "300")
        .config("spark.ui.retainedStages", "300")
        .config("spark.sql.ui.retainedExecutions", "50")
    )
    if locality_wait is not None:
        builder = builder.config("spark.locality.wait", locality_wait)
    java_options = standalone.jvm_options()
    if java_options:
        builder = (builder.config("spark.driver.extraJavaOptions", java_options)
                   .config("spark.executor.extraJavaOptions", java_options))
    secret_file = os.environ.get(SECRET_ENV)
    if not secret_file or master_url.startswith("local"):
        return builder.getOrCreate()
    return _with_secret(builder, read_secret(secret_file))


def _with_secret(builder: Any, secret: str) -> Any:
    """Start the driver with the cluster's shared secret (cluster.py). PySpark passes a
    builder's settings to the driver JVM as ``--conf`` arguments, which ``ps`` shows to
    every user: the secret goes in a private properties file instead, read by the JVM
    as it starts and deleted once it has (Spark redacts the value in its UI)."""
    fd, props = tempfile.mkstemp(prefix="spark-auth-", suffix=".conf")  # mode 0600
    with os.fdopen(fd, "w") as f:
        f.write(f"spark.authenticate true\nspark.authenticate.secret {secret}\n")
    previous = os.environ.get("PYSPARK_SUBMIT_ARGS")
    os.environ["PYSPARK_SUBMIT_ARGS"] = f"--properties-file {shlex.quote(props)} pyspark-shell"
    try:
        return builder.getOrCreate()
    finally:
        if previous is None:
            os.environ.pop("PYSPARK_SUBMIT_ARGS", None)
        else:
            os.environ["PYSPARK_SUBMIT_ARGS"] = previous
        os.unlink(props)


def set_locality_wait(spark: Any, wait: str | None) -> None:
    """``spark.locality.wait`` of a running application (None: Spark's default, 3 s).

    The scheduler reads it from the SparkContext's own conf each time it creates a task
    set (``TaskSetManager.getLocalityWait``), so a change applies from the next stage
    on. PySpark has no public setter: a SparkConf is fixed once its context starts
    (``getConf`` returns a copy), and ``spark.conf.set`` only sets SQL confs. So a
    standby's session serves a run with a wait of its own, and its reset undoes it."""
    conf = spark.sparkContext._jsc.sc().conf()
    if wait is None:
        conf.remove("spark.locality.wait")
    else:
        conf.set("spark.locality.wait", wait)


def apply_run_conf(spark: Any, spec: definition.PipelineSpec) -> None:
    """The pipeline's own settings, as runtime SQL confs (read when its query starts)."""
    spark.conf.set("spark.sql.shuffle.partitions", str(spec.key_groups))
    spark.conf.set("spark.sql.streaming.stateStore.providerClass",
                   STATE_STORE_PROVIDERS[spec.state_store])
    # The verifier needs every batch's offsets: keep the whole metadata log (Spark purges
    # all but the last 100 batches by default).
    spark.conf.set("spark.sql.streaming.minBatchesToRetain",
                   "100000000" if spec.keep_output else "100")
