"""Per-user, per-partition Slurm usage from accounting (sacct), in fixed hourly windows.

Nothing on a HyperPod cluster is billed per Slurm user, so per-user cost starts here: allocated
node-, CPU- and GPU-seconds per (user, partition) per window, which the stack multiplies by rates.
Runs where slurmctld runs (the controller group's node); the report shape is documented in
hpops_core.node_channel.contract.

Windows are whole UTC hours. Each run re-reads the still-open current window and every ended
window not yet final (see contract.USAGE_SETTLE_SECONDS), oldest first, one sacct call per window;
a small state file remembers up to where windows are final and shipped. Every record carries an
idempotency key (cluster, window start, user, partition), so re-reading or re-sending a window
replaces its records rather than adding to them.

Every report also says which instance group each partition's nodes belong to (from the
lifecycle's provisioning_parameters.json), so the stack can price a partition's node-seconds by
that group's instance type.

The parsing, clipping, aggregation and report functions are pure (time is an argument); the
system side (finding and running sacct/scontrol, the instance id, the state file, the
provisioning file) is at the bottom, in ``UsageCollector`` and the functions it calls. Standard
library only, Python 3.8.
"""

from __future__ import annotations

import collections
import datetime
import json
import os
import shutil
import subprocess
import time
from typing import Any, Callable, Dict, Iterable, List, NamedTuple, Optional, Tuple

from hpops_core.common import validation
from hpops_core.node_channel import contract

from . import cluster_layout

SACCT_FIELDS = ("User", "JobID", "Partition", "AllocNodes", "AllocTRES", "ElapsedRaw", "Start", "End", "State")
# HyperPod installs Slurm under /opt/slurm, which is not on a systemd service's PATH.
SACCT_FALLBACKS = ("/opt/slurm/bin/sacct", "/usr/local/bin/sacct", "/usr/bin/sacct")
SACCT_TIMEOUT_SECONDS = 120
# A run ships at most this many ended windows (one sacct call each) and looks back at most this far;
# a longer outage loses the oldest windows (logged), never floods slurmdbd.
MAX_ENDED_WINDOWS_PER_RUN = 24
MAX_BACKLOG_WINDOWS = 7 * 24
# Re-reading hours the stack voided (a replaced controller key's) restores rightly held users' spend,
# so it goes faster, once per marker: at most this many windows a run (four days) and this many seconds
# of sacct time, the current month first.
MAX_RECOLLECT_WINDOWS_PER_RUN = 4 * 24
MAX_RECOLLECT_SACCT_SECONDS_PER_RUN = 300
STATE_FILE = "usage-state.json"
REASON_MAX = 300
# What sacct prints when slurm.conf has AccountingStorageType=accounting_storage/none.
ACCOUNTING_DISABLED_MARKERS = ("accounting storage is disabled",)
UNSET_TIMES = ("", "Unknown", "None")
TIME_FORMAT = "%Y-%m-%dT%H:%M:%S"  # sacct with SLURM_TIME_FORMAT=standard
MAX_DIGITS = 12

SKIP_MALFORMED = "malformed line"
SKIP_USER = "invalid user"
SKIP_PARTITION = "invalid partition"
SKIP_NUMBER = "unparsable number"
SKIP_TIME = "unparsable time"


class SkippedLine(ValueError):
    """An sacct line the report leaves out; the message is one of the SKIP_* reasons, never the value."""


class JobAllocation(NamedTuple):
    user: str
    partition: str
    nodes: int
    cpus: int
    gpus: int
    start: int
    end: Optional[int]  # None: still allocated (End "Unknown")
    elapsed: Optional[int]


class Recollection(NamedTuple):
    """Where re-reading voided hours stands: all from ``since``; now the window ``cursor`` of the
    segment (one month) ending at ``until``; ``marker``: the stack's marker it obeys."""

    since: int
    cursor: int
    until: int
    marker: Any


class SacctResult(NamedTuple):
    returncode: int
    stdout: str
    stderr: str
    seconds: float


class PartitionGroups(NamedTuple):
    """{partition: instance group}, how many worker_groups entries were left out, and why the map is
    short or empty ("" when it is neither)."""
    groups: Dict[str, str]
    skipped: int
    reason: str


NO_PROVISIONING = PartitionGroups({}, 0, "no provisioning_parameters.json configured")


# ---------------------------------------------------------------------------- windows and times


def iso(epoch: float) -> str:
    return datetime.datetime.fromtimestamp(int(epoch), datetime.timezone.utc).strftime(TIME_FORMAT) + "Z"


def window_start_of(epoch: float, window_seconds: int = contract.USAGE_WINDOW_SECONDS) -> int:
    return int(epoch) // window_seconds * window_seconds


def due_windows(now: float, final_through: Optional[int], window_seconds: int = contract.USAGE_WINDOW_SECONDS,
                max_ended: int = MAX_ENDED_WINDOWS_PER_RUN,
                max_backlog: int = MAX_BACKLOG_WINDOWS) -> Tuple[List[int], int]:
    """(window starts to read this run, oldest first, ending with the current window; windows dropped).

    ``final_through`` is the end of the last window shipped as final (None on a fresh node: start
    with the previous window). Ended windows not yet final (settle delay) are read every run.
    Hours the stack voided are read again apart from these (recollect_segment).
    """
    current = window_start_of(now, window_seconds)
    first = current - window_seconds if final_through is None else window_start_of(final_through, window_seconds)
    oldest_kept = current - max_backlog * window_seconds
    dropped = max(0, (oldest_kept - first) // window_seconds)
    first = max(first, oldest_kept)
    ended = list(range(first, current, window_seconds))[:max_ended]
    return ended + [current], dropped


def month_start_of(epoch: int) -> int:
    moment = datetime.datetime.fromtimestamp(epoch, datetime.timezone.utc)
    return int(moment.replace(day=1, hour=0, minute=0, second=0).timestamp())


def last_final_end(now: float, window_seconds: int = contract.USAGE_WINDOW_SECONDS,
                   settle_seconds: int = contract.USAGE_SETTLE_SECONDS) -> int:
    """The end of the newest window that is final at ``now`` (is_final)."""
    return window_start_of(now - window_seconds - settle_seconds, window_seconds) + window_seconds


def recollect_segment(since: int, until: int) -> Optional[Tuple[int, int]]:
    """The newest month's part of the voided hours [since, until): (first window, end), re-read before
    older months' (the current month's spend is what holds users); None when nothing is left."""
    if until <= since:
        return None
    return max(since, month_start_of(until - 1)), until


def is_final(window_start: int, now: float, window_seconds: int = contract.USAGE_WINDOW_SECONDS,
             settle_seconds: int = contract.USAGE_SETTLE_SECONDS) -> bool:
    return now >= window_start + window_seconds + settle_seconds


def parse_time(text: str) -> Optional[int]:
    """Epoch seconds of an sacct time (UTC: sacct runs with TZ=UTC); None for Unknown/None/empty."""
    if text in UNSET_TIMES:
        return None
    try:
        moment = datetime.datetime.strptime(text, TIME_FORMAT)
    except ValueError:
        raise SkippedLine(SKIP_TIME) from None
    return int(moment.replace(tzinfo=datetime.timezone.utc).timestamp())


# ---------------------------------------------------------------------------- one sacct line


def count(text: str) -> int:
    # ASCII digits only ("٣".isdigit() is True), and no more than any real count or duration has.
    if not text.isdigit() or not text.isascii() or len(text) > MAX_DIGITS:
        raise SkippedLine(SKIP_NUMBER)
    return int(text)


def parse_tres(text: str) -> Dict[str, int]:
    """cpu, node and gpu counts from AllocTRES ("billing=2,cpu=2,gres/gpu=4,mem=8G,node=1").

    Untyped gres/gpu=N is the total; typed entries (gres/gpu:a100=N) are summed only without it.
    Other TRES (mem, billing, licenses) are not counted here and not checked."""
    found = {"cpu": 0, "node": 0}
    gpus, typed_gpus = None, 0
    for item in filter(None, text.split(",")):
        name, separator, value = item.partition("=")
        if not separator:
            raise SkippedLine(SKIP_NUMBER)
        if name in ("cpu", "node"):
            found[name] = count(value)
        elif name == "gres/gpu":
            gpus = count(value)
        elif name.startswith("gres/gpu:"):
            typed_gpus += count(value)
    found["gpu"] = typed_gpus if gpus is None else gpus
    return found


def parse_line(line: str) -> Optional[JobAllocation]:
    """One ``sacct --parsable2`` line (SACCT_FIELDS); None for a job that never started.

    Raises SkippedLine (reason only) for anything the report must not carry."""
    fields = line.split("|")
    if len(fields) != len(SACCT_FIELDS):
        raise SkippedLine(SKIP_MALFORMED)
    user, _job_id, partition, nodes, tres, elapsed, start_text, end_text, state = fields
    start = parse_time(start_text)
    end = parse_time(end_text)
    if start is None or state.split(" ")[0] == "PENDING":
        return None
    if not validation.is_posix_user(user):
        raise SkippedLine(SKIP_USER)
    if not contract.is_usage_partition(partition):
        raise SkippedLine(SKIP_PARTITION)
    allocated = parse_tres(tres)
    return JobAllocation(user=user, partition=partition, nodes=count(nodes), cpus=allocated["cpu"],
                         gpus=allocated["gpu"], start=start, end=end,
                         elapsed=count(elapsed) if elapsed else None)


def seconds_in_window(job: JobAllocation, window_start: int, window_end: int, now: float) -> int:
    """The job's allocated seconds inside [window_start, min(window_end, now)).

    A job still allocated counts up to now. ElapsedRaw caps the result: it excludes time the job
    spent suspended, which Start..End does not."""
    end = int(now) if job.end is None else job.end
    seconds = min(end, window_end, int(now)) - max(job.start, window_start)
    if seconds <= 0:
        return 0
    if job.elapsed is not None:
        seconds = min(seconds, job.elapsed)
    return seconds


def aggregate(lines: Iterable[str], window_start: int, window_end: int,
              now: float) -> Tuple[Dict[Tuple[str, str], Dict[str, int]], Dict[str, int]]:
    """({(user, partition): {"nodeSeconds", "cpuSeconds", "gpuSeconds", "jobs"}}, {skip reason: count}).

    "jobs": the jobs that started in this window."""
    totals: Dict[Tuple[str, str], Dict[str, int]] = {}
    skipped: Dict[str, int] = collections.Counter()
    for line in lines:
        if not line.strip():
            continue
        try:
            job = parse_line(line.rstrip("\r\n"))
        except SkippedLine as skip:
            skipped[str(skip)] += 1
            continue
        if job is None:
            continue
        seconds = seconds_in_window(job, window_start, window_end, now)
        if seconds == 0:
            continue
        entry = totals.setdefault((job.user, job.partition),
                                  {"nodeSeconds": 0, "cpuSeconds": 0, "gpuSeconds": 0, "jobs": 0})
        entry["nodeSeconds"] += job.nodes * seconds
        entry["cpuSeconds"] += job.cpus * seconds
        entry["gpuSeconds"] += job.gpus * seconds
        # A job spans many windows; it is counted once, in the window it started in, so that a
        # month's windows add up to the jobs that started in it (not job-hours).
        entry["jobs"] += 1 if window_start <= job.start < window_end else 0
    return totals, dict(skipped)


# ---------------------------------------------------------------------------- partitions -> instance groups


def partition_groups(provisioning: Any, limit: int = contract.USAGE_MAX_PARTITION_GROUPS) -> PartitionGroups:
    """The partitions provisioning_parameters.json names, each with its instance group.

    The lifecycle scripts' format: "worker_groups": [{"instance_group_name": ..., "partition_name": ...}].
    The login and controller groups are left out wherever they are listed (the Terraform module
    lists the login group as a worker of partition "dev")."""
    names = provisioning if isinstance(provisioning, dict) else {}
    pairs = cluster_layout.worker_partitions(provisioning, (names.get("login_group"), names.get("controller_group")))
    if pairs is None:
        return PartitionGroups({}, 0, "provisioning_parameters.json has no worker_groups list")
    return partition_groups_of_pairs(pairs, limit)


def partition_groups_of_pairs(pairs: Any, limit: int = contract.USAGE_MAX_PARTITION_GROUPS,
                              source: str = "provisioning_parameters.json") -> PartitionGroups:
    """{partition: instance group} from (partition, group) pairs.

    Left out and counted, never echoed: entries whose names break the partition or instance-group
    rule; a partition several groups serve (no one instance type prices its node-seconds); the
    partitions past ``limit`` (every report part carries the map)."""
    entries: Dict[str, List[str]] = {}
    invalid = 0
    for partition, group in pairs:
        if not contract.is_usage_partition(partition) or not validation.is_instance_group(group):
            invalid += 1
            continue
        entries.setdefault(partition, []).append(group)
    shared = sorted(partition for partition, groups in entries.items() if len(set(groups)) > 1)
    usable = sorted(partition for partition in entries if partition not in shared)
    over = usable[limit:]
    groups = {partition: entries[partition][0] for partition in usable[:limit]}
    skipped = invalid + sum(len(entries[partition]) for partition in shared + over)
    problems = []
    if invalid:
        problems.append("{} worker_groups entries without a valid partition_name and instance_group_name".format(
            invalid))
    if shared:
        problems.append("partitions served by more than one instance group: " + ", ".join(shared))
    if over:
        problems.append("{} partitions over the limit of {}".format(len(over), limit))
    reason = ("left out: " + "; ".join(problems)) if problems else ""
    if not groups and not problems:
        reason = "{} lists no worker_groups".format(source)
    return PartitionGroups(groups, skipped, reason[:REASON_MAX])


# ---------------------------------------------------------------------------- reports


def failure(stderr: str, accounting_type: Optional[str] = None) -> Tuple[str, str]:
    """(status, reason) for an sacct that exited non-zero.

    ``accounting_type`` is AccountingStorageType from ``scontrol show config`` when it could be read."""
    text = " ".join(stderr.split())
    if any(marker in text.lower() for marker in ACCOUNTING_DISABLED_MARKERS) or \
            accounting_type == "accounting_storage/none":
        return contract.USAGE_NOT_ENABLED, "Slurm accounting storage is disabled (AccountingStorageType)"
    errors = [line.strip() for line in stderr.splitlines() if line.strip()]
    # sacct's last line says what went wrong ("Problem talking to the database: Connection refused").
    reason = errors[-1] if errors else "sacct failed without a message"
    return contract.USAGE_SACCT_FAILED, "".join(ch if ch.isprintable() else "?" for ch in reason)[:REASON_MAX]


def accounting_type_of(scontrol_config: str) -> Optional[str]:
    """AccountingStorageType from ``scontrol show config`` output."""
    for line in scontrol_config.splitlines():
        name, separator, value = line.partition("=")
        if separator and name.strip() == "AccountingStorageType":
            return value.strip()
    return None


def build_report(cluster: str, instance_id: Optional[str], window_start: int, now: float, status: str,
                 reason: str = "", totals: Optional[Dict[Tuple[str, str], Dict[str, int]]] = None,
                 skipped: Optional[Dict[str, int]] = None, sacct_seconds: float = 0.0, agent_version: str = "",
                 window_seconds: int = contract.USAGE_WINDOW_SECONDS,
                 partitions: PartitionGroups = NO_PROVISIONING) -> Dict[str, Any]:
    start = iso(window_start)
    records = []
    for (user, partition), values in sorted((totals or {}).items()):
        record = {"key": contract.usage_record_key(cluster, start, user, partition), "user": user,
                  "partition": partition}
        record.update(values)
        records.append(record)
    skipped = dict(sorted((skipped or {}).items()))
    return {
        "format": contract.USAGE_FORMAT,
        "cluster": cluster,
        "instanceId": instance_id,
        "agentVersion": agent_version,
        "windowStart": start,
        "windowEnd": iso(window_start + window_seconds),
        "final": is_final(window_start, now, window_seconds),
        "status": status,
        "reason": reason,
        "records": records,
        "skipped": sum(skipped.values()),
        "skippedReasons": skipped,
        "collectedAt": iso(now),
        "sacctSeconds": round(sacct_seconds, 3),
        "partitionGroups": dict(sorted(partitions.groups.items())),
        "partitionGroupsSkipped": partitions.skipped,
        "partitionGroupsReason": partitions.reason,
        "part": 1,
        "parts": 1,
    }


def encoded(report: Dict[str, Any]) -> str:
    return json.dumps(report, sort_keys=True, separators=(",", ":"))


def split_report(report: Dict[str, Any], max_bytes: int = contract.MAX_USAGE_REPORT_BYTES) -> List[Dict[str, Any]]:
    """The report as parts of at most max_bytes each (encoded), split by records, same header on each."""
    header = dict(report, records=[])
    budget = max_bytes - len(encoded(header).encode("utf-8")) - 16  # room for part numbers
    chunks: List[List[Dict[str, Any]]] = [[]]
    used = 0
    for record in report["records"]:
        size = len(encoded(record).encode("utf-8")) + 1
        if chunks[-1] and used + size > budget:
            chunks.append([])
            used = 0
        chunks[-1].append(record)
        used += size
    return [dict(header, records=chunk, part=index, parts=len(chunks)) for index, chunk in enumerate(chunks, 1)]


# ---------------------------------------------------------------------------- the system side


def find_sacct(configured: str = "") -> Optional[str]:
    """The sacct to run: the configured path, else PATH, else where HyperPod and Debian put it."""
    if configured:
        return configured if os.access(configured, os.X_OK) else None
    found = shutil.which("sacct")
    if found:
        return found
    for candidate in SACCT_FALLBACKS:
        if os.access(candidate, os.X_OK):
            return candidate
    return None


def sacct_command(sacct: str, window_start: int, until: int) -> List[str]:
    # -X: one line per allocation, not per step. --duplicates: a requeued job's earlier runs held
    # their nodes too. Without -s, sacct returns every job eligible or running in the window.
    return [sacct, "--allusers", "-X", "--duplicates", "--parsable2", "--noheader",
            "--format=" + ",".join(SACCT_FIELDS), "-S", iso(window_start)[:-1], "-E", iso(until)[:-1]]


def slurm_env() -> Dict[str, str]:
    # Times in and out of sacct in UTC, in one known format, whatever the node's locale says.
    env = dict(os.environ, TZ="UTC", SLURM_TIME_FORMAT="standard", LC_ALL="C")
    env.pop("SACCT_FORMAT", None)
    return env


def run_sacct(command: List[str], timeout: float = SACCT_TIMEOUT_SECONDS,
              run: Callable[..., Any] = subprocess.run, clock: Callable[[], float] = time.monotonic) -> SacctResult:
    began = clock()
    try:
        result = run(command, capture_output=True, timeout=timeout, env=slurm_env())
    except subprocess.TimeoutExpired:
        return SacctResult(124, "", "sacct timed out after {} s".format(int(timeout)), clock() - began)
    except OSError as error:
        return SacctResult(127, "", "cannot run sacct: {}".format(error.strerror), clock() - began)
    return SacctResult(result.returncode, result.stdout.decode("utf-8", "replace"),
                       result.stderr.decode("utf-8", "replace"), clock() - began)


def scontrol_config(sacct: str, run: Callable[..., Any] = subprocess.run) -> Optional[str]:
    """``scontrol show config`` (scontrol next to sacct) as slurmctld reports it; None if unknown."""
    scontrol = os.path.join(os.path.dirname(sacct), "scontrol")
    try:
        result = run([scontrol, "show", "config"], capture_output=True, timeout=30, env=slurm_env())
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    return result.stdout.decode("utf-8", "replace")


def scontrol_accounting_type(sacct: str, run: Callable[..., Any] = subprocess.run) -> Optional[str]:
    """AccountingStorageType as slurmctld reports it; None if unknown."""
    config = scontrol_config(sacct, run)
    return None if config is None else accounting_type_of(config)


GPU_NOT_TRACKED = ("GPU-seconds are not tracked: AccountingStorageTRES lacks gres/gpu, so jobs' AllocTRES "
                   "has no GPUs (node- and CPU-seconds are right)")


def gpu_tracking_note(scontrol_config_text: Optional[str]) -> str:
    """Why GPU-seconds would read 0 though GPUs were used; "" when they are tracked or it is unknown."""
    if scontrol_config_text is None:
        return ""
    for line in scontrol_config_text.splitlines():
        name, separator, value = line.partition("=")
        if separator and name.strip() == "AccountingStorageTRES":
            return "" if "gres/gpu" in value else GPU_NOT_TRACKED
    return ""


def read_partition_groups(path: Optional[str]) -> PartitionGroups:
    """partition_groups() of the provisioning file; an empty map and the reason when it cannot be read."""
    from .identity import IdentityError, read_json

    if not path:
        return NO_PROVISIONING
    try:
        return partition_groups(read_json(path, "provisioning_parameters.json"))
    except IdentityError as error:
        return PartitionGroups({}, 0, str(error)[:REASON_MAX])
    except RecursionError:  # json gives up on very deep nesting with this, not ValueError
        return PartitionGroups({}, 0, "provisioning_parameters.json at {} is nested too deeply".format(
            path)[:REASON_MAX])


def layout_partition_groups(layout: Any, why_not: str) -> PartitionGroups:
    """partition_groups_of_pairs() of a cluster layout (identity.read_layout's answer)."""
    if layout is None:
        return PartitionGroups({}, 0, why_not[:REASON_MAX])
    return partition_groups_of_pairs(layout.partition_pairs, source=layout.partition_source or layout.source)


def reporting_instance_id(config: Any, log: Callable[..., None] = lambda event, **fields: None,
                          imds: Optional[Callable[[], str]] = None) -> Optional[str]:
    """This node's instance id for the reports: the agent config, HyperPod's resource_config.json,
    then IMDS; None (logged) when none answers, which leaves the report's instanceId null."""
    from .identity import IdentityError, find_instance, imds_instance_id, own_ip, read_json

    if config.instance_id:
        return config.instance_id
    try:
        _, instance = find_instance(read_json(config.resource_config, "resource_config.json"), own_ip(config))
        instance_id = (instance or {}).get("InstanceId") or (imds or imds_instance_id)()
        return contract.check_instance_id(instance_id)
    except (IdentityError, ValueError) as error:
        log("usage-instance-id-unknown", reason=str(error)[:REASON_MAX])
        return None


class UsageCollector:
    """Collects windows with sacct and remembers, in a small state file, which windows are final and shipped."""

    def __init__(self, cluster: str, instance_id: Optional[str], state_path: Optional[str] = None,
                 sacct_cmd: str = "", agent_version: str = "", clock: Callable[[], float] = time.time,
                 run: Callable[..., Any] = subprocess.run, log: Callable[..., None] = lambda event, **fields: None,
                 provisioning_path: Optional[str] = None,
                 partition_reader: Optional[Callable[[], PartitionGroups]] = None):
        self.cluster = cluster
        self.instance_id = instance_id
        self.state_path = state_path
        self.sacct_cmd = sacct_cmd
        self.agent_version = agent_version
        self.clock = clock
        self.run = run
        self.log = log
        self.provisioning_path = provisioning_path
        self.partition_reader = partition_reader
        self._logged_partitions: Optional[PartitionGroups] = None

    def partition_groups(self) -> PartitionGroups:
        """Read on every run (the file is small), logged when it says something new."""
        if self.partition_reader is not None:
            partitions = self.partition_reader()
        else:
            partitions = read_partition_groups(self.provisioning_path)
        if partitions != self._logged_partitions:
            self.log("usage-partition-groups", partitionGroups=partitions.groups, skipped=partitions.skipped,
                     reason=partitions.reason)
            self._logged_partitions = partitions
        return partitions

    def collect(self, window_start: int, now: float, sacct: Optional[str],
                partitions: Optional[PartitionGroups] = None, note: str = "") -> Dict[str, Any]:
        """One window's report (unsplit), as of now; ``note`` is the reason an ok report carries."""
        partitions = self.partition_groups() if partitions is None else partitions

        def report(status: str, reason: str = "", **values: Any) -> Dict[str, Any]:
            return build_report(self.cluster, self.instance_id, window_start, now, status, reason,
                                agent_version=self.agent_version, partitions=partitions, **values)

        if sacct is None:
            where = "the configured sacctCmd" if self.sacct_cmd else "PATH, " + ", ".join(SACCT_FALLBACKS)
            return report(contract.USAGE_SLURM_NOT_FOUND, "no executable sacct ({})".format(where))
        # The open window is read up to now (at least a second: sacct refuses an empty range).
        until = max(min(window_start + contract.USAGE_WINDOW_SECONDS, int(now)), window_start + 1)
        result = run_sacct(sacct_command(sacct, window_start, until), run=self.run)
        if result.returncode != 0:
            accounting_type = None
            if not any(marker in result.stderr.lower() for marker in ACCOUNTING_DISABLED_MARKERS):
                accounting_type = scontrol_accounting_type(sacct, self.run)
            status, reason = failure(result.stderr, accounting_type)
            return report(status, reason, sacct_seconds=result.seconds)
        totals, skipped = aggregate(result.stdout.splitlines(), window_start,
                                    window_start + contract.USAGE_WINDOW_SECONDS, now)
        return report(contract.USAGE_OK, note, totals=totals, skipped=skipped, sacct_seconds=result.seconds)

    def tracking_note(self, sacct: Optional[str]) -> str:
        """Read once per run: whether slurmdbd records GPUs at all."""
        return gpu_tracking_note(scontrol_config(sacct, self.run)) if sacct else ""

    def collect_range(self, since: float, now: Optional[float] = None) -> List[Dict[str, Any]]:
        """Reports for every window from the one holding ``since`` to the current one; no state, no shipping."""
        now = self.clock() if now is None else now
        sacct = find_sacct(self.sacct_cmd)
        starts = range(window_start_of(since), window_start_of(now) + 1, contract.USAGE_WINDOW_SECONDS)
        partitions, note = self.partition_groups(), self.tracking_note(sacct)
        return [self.collect(start, now, sacct, partitions, note) for start in starts]

    # ------------------------------------------------------------------ state

    def _state(self) -> Dict[str, Any]:
        if not self.state_path:
            return {}
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            return {}
        except (OSError, ValueError) as error:
            self.log("usage-state-unreadable", path=self.state_path, reason=type(error).__name__)
            return {}
        return state if isinstance(state, dict) else {}

    def _final_through(self) -> Optional[int]:
        value = self._state().get("finalThrough")
        return value if isinstance(value, int) and not isinstance(value, bool) else None

    def _recollecting(self, marker: Optional[str], now: float) -> Optional[Recollection]:
        """The voided hours still to read again, or None.

        A new marker from the stack (the enroll answer's "recollectFrom") is obeyed once: every window
        final by now from it on is read again, newest month first (recollect_segment), apart from the
        usual backlog; once the oldest month is done the state forgets all but the marker."""
        state = self._state()
        if marker and marker != state.get("recollectMarker"):
            try:
                since = parse_time(marker[:-1]) if marker.endswith("Z") else None
            except SkippedLine:
                since = None
            if since is None:
                self.log("usage-recollect-ignored", reason="not an ISO UTC time")
                return None
            since = window_start_of(max(since, window_start_of(now) - contract.USAGE_RECOLLECT_MAX_WINDOWS
                                        * contract.USAGE_WINDOW_SECONDS))
            self.log("usage-recollect", windowStart=iso(since), reason="the stack voided a replaced key's windows")
            return self._save_recollect(since, recollect_segment(since, last_final_end(now)), marker)
        since, cursor, until = (state.get(key) for key in ("recollectFrom", "recollectNext", "recollectUntil"))
        marker = state.get("recollectMarker")
        if not _is_epoch(since):
            return None
        if not (_is_epoch(cursor) and _is_epoch(until)):
            # Kept by an agent before segments: what it shipped final (finalThrough) was read again already.
            final = self._final_through()
            since = max(since, final) if final is not None else since
            return self._save_recollect(since, recollect_segment(since, last_final_end(now)), marker)
        if cursor < until:
            return Recollection(since, cursor, until, marker)
        return self._next_segment(Recollection(since, cursor, until, marker))

    def _next_segment(self, done: Recollection) -> Optional[Recollection]:
        """The segment before the one just read again: the month before, or None when it was the oldest."""
        segment = recollect_segment(done.since, done.until)
        return self._save_recollect(done.since, recollect_segment(done.since, segment[0]) if segment else None,
                                    done.marker)

    def _save_recollect(self, since: int, segment: Optional[Tuple[int, int]], marker: Any,
                        ) -> Optional[Recollection]:
        if segment is None:
            self.log("usage-recollect-done", windowStart=iso(since), reason="every voided hour was read again")
            self._save_state(recollectMarker=marker)
            return None
        place = Recollection(since, segment[0], segment[1], marker)
        self._save_place(place)
        return place

    def _save_place(self, place: Recollection) -> None:
        self._save_state(recollectFrom=place.since, recollectNext=place.cursor, recollectUntil=place.until,
                         recollectMarker=place.marker)

    def _final_through_state(self) -> Dict[str, Any]:
        final = self._final_through()
        return {} if final is None else {"finalThrough": final, "finalThroughTime": iso(final)}

    def _save_final_through(self, epoch: int) -> None:
        kept = {key: value for key, value in self._state().items() if key.startswith("recollect")}
        self._write_state(dict(kept, finalThrough=epoch, finalThroughTime=iso(epoch)))

    def _save_state(self, **recollect: Any) -> None:
        """The re-collection's place (recollect* keys; only those given are kept) beside finalThrough."""
        self._write_state(dict(self._final_through_state(), **recollect))

    def _write_state(self, state: Dict[str, Any]) -> None:
        if not self.state_path:
            return
        directory = os.path.dirname(self.state_path)
        temporary = self.state_path + ".tmp"
        try:
            os.makedirs(directory, mode=0o700, exist_ok=True)
            with open(temporary, "w", encoding="utf-8") as handle:
                json.dump(state, handle, sort_keys=True)
            os.chmod(temporary, 0o600)
            os.replace(temporary, self.state_path)
        except OSError as error:
            self.log("usage-state-not-saved", path=self.state_path, reason=error.strerror or str(error))

    # ------------------------------------------------------------------ one run

    def run_once(self, ship: Callable[[List[Dict[str, Any]]], bool],
                 recollect: Optional[str] = None) -> List[Dict[str, Any]]:
        """Collect every due window and ship each (as parts); returns the reports collected.

        A window becomes final-and-shipped (state advances past it) only after ``ship`` accepted it.
        When sacct cannot answer, one status report (for the current window) is shipped and the
        state stays where it is, so the windows are read once accounting answers again.
        ``recollect``: the stack's "recollectFrom" marker (ISO UTC), obeyed once (_recollecting): after
        the due windows, up to MAX_RECOLLECT_WINDOWS_PER_RUN voided hours are read again."""
        now = self.clock()
        sacct = find_sacct(self.sacct_cmd)
        segment = self._recollecting(recollect, now)  # first: an older agent's state reads finalThrough
        starts, dropped = due_windows(now, self._final_through())
        if dropped:
            self.log("usage-windows-dropped", windows=dropped, reason="backlog older than {} h".format(
                MAX_BACKLOG_WINDOWS * contract.USAGE_WINDOW_SECONDS // 3600))
            self._save_final_through(starts[0])
        partitions, note = self.partition_groups(), self.tracking_note(sacct)
        reports = []
        for start in starts:
            report = self.collect(start, now, sacct, partitions, note)
            if report["status"] != contract.USAGE_OK:
                # A statement about the cluster, not about that window: sent once, for the current window.
                report = build_report(self.cluster, self.instance_id, starts[-1], now, report["status"],
                                      report["reason"], sacct_seconds=report["sacctSeconds"],
                                      agent_version=self.agent_version, partitions=partitions)
                reports.append(report)
                ship(split_report(report))
                return reports
            reports.append(report)
            if not ship(split_report(report)):
                return reports
            if report["final"]:
                self._save_final_through(start + contract.USAGE_WINDOW_SECONDS)
        return reports + self._recollect(segment, now, sacct, partitions, note, ship)

    def _recollect(self, place: Optional[Recollection], now: float, sacct: Optional[str], partitions: PartitionGroups,
                   note: str, ship: Callable[[List[Dict[str, Any]]], bool]) -> List[Dict[str, Any]]:
        """Voided hours read again, a segment (one month) at a time, newest month first; the place is kept
        after every window shipped, so a failed send or an sacct error resumes there next run."""
        reports: List[Dict[str, Any]] = []
        sacct_seconds = 0.0
        while place is not None:
            while place.cursor < place.until:
                if len(reports) >= MAX_RECOLLECT_WINDOWS_PER_RUN or sacct_seconds >= MAX_RECOLLECT_SACCT_SECONDS_PER_RUN:
                    return reports
                report = self.collect(place.cursor, now, sacct, partitions, note)
                sacct_seconds += report["sacctSeconds"]
                if report["status"] != contract.USAGE_OK or not report["final"]:
                    return reports  # the due windows' run said it already; read again next run
                reports.append(report)
                if not ship(split_report(report)):
                    return reports
                place = place._replace(cursor=place.cursor + contract.USAGE_WINDOW_SECONDS)
                self._save_place(place)
            place = self._next_segment(place)
        return reports


def _is_epoch(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
