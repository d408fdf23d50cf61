"""Names and document shapes shared by the stack and the node agent (standard library, Python 3.8+).

Desired state (written by the stack, read by the agent with the instance group's execution role):

  /hpops/<cluster>/node/host-identity        {"format": HOST_IDENTITY_FORMAT, "mode": "keys"|"certificate"|"off",
                                              "version": str, "secretArn": str (keys),
                                              "fingerprints": {key type: "SHA256:..."} (keys),
                                              "caFingerprint": "SHA256:..." (certificate)}
  /hpops/<cluster>/node/login-limits         {"format": LOGIN_LIMITS_FORMAT, "version": str,
                                              "limits": {"default": int, "overrides": {user: int}, "exempt": [user]}}
  /hpops/<cluster>/host-certificates/<id>    the node's certificate bundle (public), written by the signer

Host private keys stay in Secrets Manager: the parameter names the secret and the fingerprints the
node must end up presenting, never key material.

Report (sent by the agent with events:PutEvents to the stack's bus):

  Source REPORT_SOURCE, DetailType REPORT_DETAIL_TYPE, Detail:
  {"format": REPORT_FORMAT, "cluster": str, "instanceId": str, "ip": str, "role": "login",
   "agentVersion": str, "reportedAt": ISO-8601, "trigger": "start"|"change"|"heartbeat",
   "hostIdentity": {"mode": str, "version": str|null, "result": "changed"|"unchanged"|"failed"|"waiting",
                    "reason": str, "fingerprints": {key type: "SHA256:..."},
                    "publicKeys": {key type: "<type> <base64>"} (certificate mode),
                    "certificateVersion": int|null, "certificateDigest": str|null (certificate mode:
                    the SSM parameter version and the digest of the bundle last installed)},
   "loginLimits": {"version": str|null, "result": str, "reason": str}}

Everything in a report is public: versions, fingerprints, public keys, short reasons.
Every report (login, usage, holds) also carries "sequence" and "proof": the agent's SSHSIG over the
report without "proof" (proof_format.py), checked against the key enrolled for the instance
(enrollment.py, report_proof.py); the parsers here see the report with both taken out.

Interactive sessions (login nodes; in every report, so with the heartbeat and on change):

  "sessions": {"list": [{"handle": SESSION_HANDLE_RE, "user": POSIX user, "path": "ssh"|"ssm",
                         "tty": bool, "startedAt": ISO-8601 UTC, "sessionId": str (ssm only)}],
               "omitted": int (sessions not in "list"),
               "omittedByUser": {POSIX user: int} (SSH sessions counted but not in "list"; absent when
                                every SSH session is listed),
               "ended": [{"handle", "user", "result": END_RESULTS, "reason"}]}

  A node lists every session while they fit (REPORTED_SESSIONS_BYTES, at most MAX_REPORTED_SESSIONS).
  A busier node lists its Session Manager shells, then each user's SSH sessions in turns (every
  user's newest, then every user's oldest, then the second newest, ...), and counts the rest per
  user in "omittedByUser" (at most MAX_OMITTED_USERS users; any further only in "omitted"): every
  user is counted, and the sessions a limit ends first (newest, or oldest) are the ones listed.

  A handle is <boot id, 8 hex>:<pid>:<start ticks>: it names one process on that node and is no
  credential, so a report lets nobody take a session over.

End sessions (written by the stack for one login node, fetched by that node's enrolled agent only
through the NodeChannel function; the node role cannot read it):

  /hpops/<cluster>/instructions/end-sessions/<instance id>
      {"format": END_SESSIONS_FORMAT, "sessions": [{"handle": str, "user": POSIX user}]}
  /hpops/<cluster>/node/instructions/end-sessions/<instance id>   (public marker: its version only)
      {"format": INSTRUCTION_MARKER_FORMAT, "version": int}

  /hpops/<cluster>/node/user-caps          {"format": USER_CAPS_FORMAT, "caps": {...}} (node_channel/user_caps.py);
                                              absent: caps off (the agent removes what it wrote)

  The agent ends a listed session only if the handle still names a session of that user on that
  node, and reports each outcome once under "ended".

Slurm usage report (sent by the agent on the node where slurmctld runs, the controller group's
node, to the same bus; the stack turns it into per-user cost, since nothing on HyperPod is billed
per Slurm user):

  Source REPORT_SOURCE, DetailType USAGE_DETAIL_TYPE, Detail:
  {"format": USAGE_FORMAT, "cluster": str, "instanceId": str|null (the reporting node),
   "agentVersion": str,
   "windowStart": ISO-8601 UTC, "windowEnd": ISO-8601 UTC (windowStart + USAGE_WINDOW_SECONDS;
                  windows are whole, aligned UTC hours),
   "final": bool (false while the window is open or within USAGE_SETTLE_SECONDS after it ended:
          the totals may still grow; true for the window's last report),
   "status": one of USAGE_STATUSES, "reason": str ("" when status is "ok"),
   "records": [{"key": usage_record_key(...), "user": POSIX user, "partition": str,
                "nodeSeconds": int, "cpuSeconds": int, "gpuSeconds": int, "jobs": int}],
   "skipped": int (sacct lines left out: invalid user or partition, malformed line,
              unparsable numbers or times; the odd values themselves are never reported),
   "skippedReasons": {reason: count},
   "collectedAt": ISO-8601 UTC, "sacctSeconds": float (how long sacct took),
   "partitionGroups": {partition: instance group name} (from the lifecycle's provisioning_parameters.json
                      "worker_groups": [{"instance_group_name", "partition_name"}]: the group, hence the
                      instance type, whose nodes a partition's node-seconds are; only partitions named
                      there and served by exactly one group, at most USAGE_MAX_PARTITION_GROUPS),
   "partitionGroupsSkipped": int (worker_groups entries left out: invalid names, a partition served by
                             several groups, partitions past the limit; the values are never reported),
   "partitionGroupsReason": str ("" when every entry is in the map; else why it is short or empty,
                            e.g. the file is missing or unreadable),
   "part": int, "parts": int (a window too big for one event is split by records; every part
                               carries the same header)}

  Seconds are allocation seconds inside the window: a job's Start..End (End = collectedAt while
  it runs) clipped to the window, times its allocated nodes, CPUs or GPUs (AllocNodes and AllocTRES
  cpu= / gres/gpu=; GPUs appear only when the cluster's AccountingStorageTRES tracks gres/gpu).

  Idempotent by construction: a record's key is (cluster, windowStart, user, partition), and a
  window is re-read and re-sent until it is final, so a consumer upserts records by key; a
  re-sent window replaces, never adds. The complete set of a window is the union of the parts
  with the latest collectedAt. A report whose status is not "ok" has no records and says nothing
  about usage (no zeros): "accounting not enabled" (no slurmdbd accounting on this cluster),
  "slurm not found" (no sacct on the node), "sacct failed" (reason says why, e.g. slurmdbd down).
"""

from __future__ import annotations

import hashlib
import json
import re

# Relative, so it resolves to hpops_core.common.validation in the layer and in the lifecycle bundle alike.
from hpops_core.common import validation

# The agent's own key on a node, and the one way an operator reads its fingerprint (as root, through
# Session Manager): derived from the private key, as the agent does, not from a .pub beside it.
AGENT_KEY_PATH = "/var/lib/hpops-node-agent/agent-key"
READ_AGENT_FINGERPRINT = "sudo ssh-keygen -y -f " + AGENT_KEY_PATH + " | ssh-keygen -lf -"

HOST_IDENTITY_FORMAT = "hpops.node.host-identity.v1"
LOGIN_LIMITS_FORMAT = "hpops.node.login-limits.v1"
REPORT_FORMAT = "hpops.node.report.v1"
REPORT_SOURCE = "hpops.node"
REPORT_DETAIL_TYPE = "HyperPod Login Node Report"
# EventBridge refuses an entry over 256 KB, and Lambda an asynchronous (EventBridge) payload over 256 KB
# with the event's envelope: a report stays below both, and its stored item far below DynamoDB's 400 KB.
MAX_REPORT_BYTES = 200 * 1024

USAGE_FORMAT = "hpops.node.usage.v1"
USAGE_DETAIL_TYPE = "HyperPod Slurm Usage Report"
USAGE_WINDOW_SECONDS = 3600
# Job-end records reach slurmdbd a moment after the job ends (longer when slurmdbd was busy):
# a window is re-read for this long after it ends before its report is final.
USAGE_SETTLE_SECONDS = 600
DEFAULT_USAGE_SECONDS = 900
# How far back the controller's agent re-collects when the stack discards a replaced key's windows
# (the enroll answer's "recollectFrom"): this month and the last one's charge-back, whatever the date.
USAGE_RECOLLECT_MAX_WINDOWS = 62 * 24
USAGE_OK = "ok"
USAGE_NOT_ENABLED = "accounting not enabled"
USAGE_SLURM_NOT_FOUND = "slurm not found"
USAGE_SACCT_FAILED = "sacct failed"
USAGE_STATUSES = (USAGE_OK, USAGE_NOT_ENABLED, USAGE_SLURM_NOT_FOUND, USAGE_SACCT_FAILED)
# Slurm allows more in a partition name; these are what HyperPod's partitions (instance group
# names) use, and what is safe in a record key, a log line and a metric dimension.
USAGE_PARTITION_RE = re.compile(r"\A[A-Za-z0-9_.-]{1,64}\Z")
USAGE_WINDOW_START_RE = re.compile(r"\A[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}Z\Z")
# EventBridge refuses entries (and PutEvents requests) over 256 KB; usage reports are split below this.
MAX_USAGE_REPORT_BYTES = 200 * 1024
# Every part of a report repeats partitionGroups: this bounds it to ~14 KB of the part's budget.
USAGE_MAX_PARTITION_GROUPS = 100

END_SESSIONS_FORMAT = "hpops.node.end-sessions.v1"
# Per-node instructions (end-sessions, user-holds) live under /hpops/<cluster>/instructions/, which the
# node role cannot read; a public marker under node/instructions/ carries only their version.
INSTRUCTIONS = "instructions/"
INSTRUCTION_MARKER_FORMAT = "hpops.node.instruction-marker.v1"
USER_CAPS_FORMAT = "hpops.node.user-caps.v1"
SESSION_HANDLE_RE = re.compile(r"\A[0-9a-f]{8}:[1-9][0-9]{0,9}:[0-9]{1,20}\Z")
SESSION_PATHS = ("ssh", "ssm")
END_RESULTS = ("ended", "gone", "refused", "failed")
# A report's session entries (~110 bytes each: about 900 sessions; the count bounds what the stack accepts) and its per-user counts of the rest
# (~30 bytes a user) stay within MAX_REPORT_BYTES with the rest of the report.
REPORTED_SESSIONS_BYTES = 96 * 1024
MAX_REPORTED_SESSIONS = 1500
MAX_OMITTED_USERS = 1500
MAX_END_SESSIONS = 20
# What RecordNodeReport announces (account's default bus, where node agents cannot put events)
# when an accepted login node's session list changed: features that count sessions react to it.
SESSIONS_CHANGED_SOURCE = "hpops.node-reports"
SESSIONS_CHANGED_DETAIL_TYPE = "HyperPod Login Node Sessions Changed"

# A report's "imds" section: {"nonRoot": IMDS_PROBE_RESULTS, "lockdown": IMDS_LOCKDOWN_VALUES, "reason": str}
# (node agent's imds_guard.py): could a non-root process reach IMDS, hence the node's role?
IMDS_PROBE_RESULTS = ("reachable", "blocked", "no-imds", "unknown")
IMDS_LOCKDOWN_VALUES = ("off", "on")

MODES = ("keys", "certificate", "off")
RESULTS = ("changed", "unchanged", "failed", "waiting")
TRIGGERS = ("start", "change", "heartbeat")
ROLES = ("login", "controller", "compute")

DEFAULT_POLL_SECONDS = 30
DEFAULT_HEARTBEAT_SECONDS = 600


# The only parameter paths either side reads or writes; names come from a validated cluster name.
def _cluster(cluster: str) -> str:
    if not validation.is_cluster_name(cluster):
        raise ValueError("cluster name is not a HyperPod cluster name")
    return cluster


def certificate_digest(bundle_text: str) -> str:
    """Names one certificate bundle exactly: what the signer wrote is what the node reports installed.

    Not the parameter version: the stack deletes a node's parameter once installed, and SSM
    numbers a re-created parameter from 1 again."""
    return hashlib.sha256(bundle_text.encode("utf-8")).hexdigest()[:16]


def parameter_prefix(cluster: str) -> str:
    return "/hpops/%s/" % _cluster(cluster)


def host_identity_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/host-identity"


def login_limits_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/login-limits"


def check_instance_id(instance_id: object, what: str = "instance id") -> str:
    """The id a node names itself by (parameter paths); ValueError naming `what` otherwise.

    The event rule, not botocore's: safe in a parameter path, and a node whose id AWS spells
    differently (as its own event examples do) still gets its certificate."""
    return validation.check_event_instance_id(instance_id, what)


def login_slots_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/login-slots"


def leave_notices_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/leave-notices"


def ssh_keepalive_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/ssh-keepalive"


def user_caps_parameter(cluster: str) -> str:
    return parameter_prefix(cluster) + "node/user-caps"


def end_sessions_path(cluster: str) -> str:
    """Where every login node's end-sessions parameter lives (GetParametersByPath)."""
    return parameter_prefix(cluster) + INSTRUCTIONS + "end-sessions"


def end_sessions_parameter(cluster: str, instance_id: str) -> str:
    """Private: outside the node role's node/* grant; the enrolled agent fetches it (node_channel/fetch.py)."""
    return end_sessions_path(cluster) + "/" + check_instance_id(instance_id)


def instruction_marker_parameter(instruction: str) -> str:
    """The public marker of a private instruction parameter: /hpops/<c>/instructions/X -> /hpops/<c>/node/instructions/X.
    Its value is {"format": INSTRUCTION_MARKER_FORMAT, "version": the instruction parameter's version}: the
    agent polls it with the desired state and fetches only when the version moved (no names in it)."""
    prefix, _, rest = instruction.partition("/" + INSTRUCTIONS)
    if not rest or not prefix.startswith("/hpops/"):
        raise ValueError("not an instruction parameter")
    return prefix + "/node/" + INSTRUCTIONS + rest


def marker_version(value: str) -> int | None:
    """The version a marker parameter's value names (None: not a marker the stack writes)."""
    try:
        document = json.loads(value)
    except ValueError:
        return None
    version = document.get("version") if isinstance(document, dict) else None
    ok = isinstance(document, dict) and document.get("format") == INSTRUCTION_MARKER_FORMAT
    return version if ok and isinstance(version, int) and not isinstance(version, bool) and version > 0 else None


def certificate_parameter(cluster: str, instance_id: str) -> str:
    return parameter_prefix(cluster) + "host-certificates/" + check_instance_id(instance_id)


def is_usage_partition(value: object) -> bool:
    return isinstance(value, str) and USAGE_PARTITION_RE.match(value) is not None


def usage_record_key(cluster: str, window_start: str, user: str, partition: str) -> str:
    """The identity of one usage record: re-reading or re-sending a window replaces, never adds.

    '/' appears in none of the parts (cluster, user and partition rules; an ISO time)."""
    validation.check_posix_user(user, "usage user")
    if not is_usage_partition(partition):
        raise ValueError("usage partition is not a partition name")
    if not USAGE_WINDOW_START_RE.match(window_start):
        raise ValueError("usage window start is not an ISO-8601 UTC time")
    return "/".join((_cluster(cluster), window_start, user, partition))
