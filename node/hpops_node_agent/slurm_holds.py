"""Hold users over their monthly dollar limit with a hold QOS in Slurm (controller node).

A held user's associations get ``QOS=hpopshold DefaultQOS=hpopshold`` and each of their pending
jobs is moved to it (``scontrol update JobId=.. QOS=hpopshold``). The hold QOS, created and kept so
by the agent, has ``MaxJobsPerUser=0 GrpJobs=0`` and ``Flags=OverPartQOS``: the job's QOS limit
then wins over any partition QOS, and no site QOS applies to the job at all, so no QOS setting of
the site can let a held job start (association limits do not: a QOS setting both MaxJobsPerUser and
GrpJobs overrides them). sbatch still accepts jobs (they pend ``QOSGrpJobsLimit``); running
jobs are never touched; ``sbatch --qos=<other>`` is refused ("Invalid qos specification") because
the hold QOS is the only one the user's associations allow.

slurmctld enforces this only with ``AccountingStorageEnforce`` including ``limits`` (else the hold
QOS's limits are ignored: the jobs run) and ``qos`` (else ``--qos=<other>`` escapes). Both are read
every pass (``scontrol show config``), and a user is reported held only when both are there, every
association reads the hold QOS back and every pending job of theirs is in it.

Lifting restores exactly what each association set itself, as ``sacctmgr show assoc WOPLimits
WithRawQOSLevel`` reads it: an explicit QOS list (even one equal to its account's: it stays its
own), a delta (``+lowq``, ``-highq``: the account's next change still reaches the user), or
nothing (inherited), and its own DefaultQOS or none; and each pending job's previous QOS. A delta
is written back in two steps: a delta written onto an explicit list only edits that list
(slurmdbd's ``if (qos='', ...)``), so the list is cleared first. The association values are kept twice, before any change: in the agent's state file (0600) and
in Slurm itself, in the hold QOS's Description (associations have no comment field); a lost state
file therefore loses at most which QOS each pending job had (they then go to the association's
default). Only what hpops set is hpops's to lift: an association whose QOS an administrator changed
during a hold keeps the administrator's value. Holds set by earlier versions (``GrpJobs=0
MaxJobs=0``) are still lifted by their old rule.

A held user's job that starts anyway (an administrator edited the hold QOS or the association) is
named in the report, which then says ``failed`` with the job ids and the first change Slurm's
transaction log shows after the hold (who, when, what), until the job ended and an hour passed.

Level-triggered: every poll compares Slurm with the desired users, so a hold removed by hand, or an
association added while a user is held, is held at the next poll.

Standard library only, Python 3.8. Commands run with ``-i`` (sacctmgr otherwise waits for a
"commit?" answer it never gets from a service) and a timeout.
"""

from __future__ import annotations

import base64
import binascii
import datetime
import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpops_core.common import validation
from hpops_core.node_channel import user_holds

STATE_FILE = "slurm-holds.json"
HOLD_QOS = "hpopshold"
# sacctmgr name -> the column `show qos` reads it back in.
HOLD_QOS_LIMITS = (("MaxJobsPerUser", "MaxJobsPU", "0"), ("GrpJobs", "GrpJobs", "0"))
HOLD_QOS_FLAG = "OverPartQOS"
# The Description keeps the previous QOS of every held association; sacctmgr lowercases it, so
# base32 (case-insensitive), after a fixed lowercase prefix.
RECORD_PREFIX = "hpops budget hold, lifts restore from here, do not edit:"
ASSOC_FIELDS = ("id", "parent", "cluster", "account", "user", "partition", "qos", "defaultQos", "GrpJobs", "MaxJobs")
ASSOC_FORMAT = "ID,ParentID,Cluster,Account,User,Partition,QOS,DefaultQOS,GrpJobs,MaxJobs"
# What an association sets itself, not what it inherits: raw QOS (deltas with their +/-) and own limits.
OWN_VALUES = ("WOPLimits", "WithRawQOSLevel")
# squeue states of a job that started (a CANCELLED one only if it ran: one cancelled while pending has 0:00).
STARTED_STATES = frozenset({"RUNNING", "COMPLETING", "COMPLETED", "FAILED", "TIMEOUT", "NODE_FAIL", "OUT_OF_MEMORY",
                            "PREEMPTED", "SUSPENDED", "BOOT_FAIL", "DEADLINE", "STOPPED"})
ESCAPE_REPORT_SECONDS = 3600
LEGACY_LIMITS = ("GrpJobs", "MaxJobs")
LEGACY_HOLD_VALUE = "0"
NEEDED_ENFORCE = ("limits", "qos")
NEVER_HELD = frozenset({"root"})
JOBS_PER_UPDATE = 100
TIMEOUT_SECONDS = 60
REASON_MAX = 300
ENFORCE_FIX = ("set AccountingStorageEnforce=associations,limits,qos in slurm.conf and restart slurmctld "
               "(scontrol reconfigure is not enough)")


def short(text: str) -> str:
    return "".join(ch if ch.isprintable() else "?" for ch in " ".join(str(text).split()))[:REASON_MAX]


def config_value(scontrol_config: str, name: str) -> Optional[str]:
    for line in scontrol_config.splitlines():
        key, separator, value = line.partition("=")
        if separator and key.strip() == name:
            return value.strip()
    return None


def enforcement(scontrol_config: Optional[str]) -> Tuple[Optional[bool], str]:
    """(does slurmctld enforce what a hold needs, why). ``limits`` makes it apply the hold QOS's
    limits (``safe`` implies it, and show config then lists limits too); ``qos`` makes it refuse a
    QOS the association does not allow, so ``sbatch --qos=<other>`` cannot escape."""
    if scontrol_config is None:
        return None, "scontrol show config failed: cannot tell whether Slurm enforces holds"
    value = config_value(scontrol_config, "AccountingStorageEnforce")
    if value is None:
        return None, "scontrol show config has no AccountingStorageEnforce line"
    flags = [part.strip() for part in value.split(",")]
    missing = [flag for flag in NEEDED_ENFORCE if flag not in flags]
    if not missing:
        return True, "AccountingStorageEnforce = {}".format(value)
    effect = ("Slurm ignores QOS limits, so held users' jobs still run" if "limits" in missing else
              "a held user's sbatch --qos=<another QOS> still runs")
    return False, short("AccountingStorageEnforce = {} lacks {}: {}, so a hold cannot apply; {}".format(
        value, " and ".join(missing), effect, ENFORCE_FIX))


def parse_associations(text: str, user: Optional[str] = None) -> List[Dict[str, str]]:
    """``sacctmgr -nP show assoc ... format=ASSOC_FORMAT`` -> one dict per association (of ``user``)."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != len(ASSOC_FIELDS) or not fields[0].isdigit() or (user is not None and fields[4] != user):
            continue
        rows.append(dict(zip(ASSOC_FIELDS, fields)))
    return rows


def qos_set(text: str) -> List[str]:
    return sorted(part for part in text.split(",") if part)


def in_hold(assoc: Dict[str, str]) -> bool:
    return qos_set(assoc["qos"]) == [HOLD_QOS] and assoc["defaultQos"] == HOLD_QOS


def encode_record(record: Dict[str, Any]) -> str:
    text = json.dumps(record, sort_keys=True, separators=(",", ":")).encode("utf-8")
    return RECORD_PREFIX + base64.b32encode(text).decode("ascii").rstrip("=").lower()


def decode_record(description: str) -> Optional[Dict[str, Any]]:
    """The Description back to {user: {assoc id: {qos, defaultQos}}}; None when it is not ours."""
    if not description.startswith(RECORD_PREFIX):
        return None
    body = description[len(RECORD_PREFIX):].strip().upper()
    try:
        record = json.loads(base64.b32decode(body + "=" * (-len(body) % 8)).decode("utf-8"))
    except (binascii.Error, ValueError):
        return None
    return record if isinstance(record, dict) else None


def job_target(previous: Optional[str], allowed: List[str], default: str) -> Optional[str]:
    """The QOS a pending job goes back to: its own before the hold while the association still allows
    it; else the association's default, as Slurm picks one for a job submitted without --qos."""
    if previous and previous in allowed:
        return previous
    if default:
        return default
    if len(allowed) == 1:
        return allowed[0]
    return "normal" if "normal" in allowed else (allowed[0] if allowed else None)


def is_delta(raw_qos: str) -> bool:
    return any(part[:1] in ("+", "-") for part in raw_qos.split(",") if part)


def restore_steps(raw_qos: Optional[str], raw_default: Optional[str]) -> List[Dict[str, str]]:
    """The ``sacctmgr modify user ... set`` assignments that give an association back what it set itself.

    ``raw_qos``: "" (or None, a record of an earlier version) inherits; "a,b" is its own list; "+a,-b" a
    delta. A delta written onto the hold's explicit list would only edit that list, so it is cleared
    (inherit) first. ``raw_default``: its own DefaultQOS, "" inherits (-1 clears it)."""
    qos, default = raw_qos or "", raw_default or "-1"
    if is_delta(qos):
        return [{"QOS": "", "DefaultQOS": "-1"}, {"QOS": qos, "DefaultQOS": default}]
    return [{"QOS": qos, "DefaultQOS": default}]


def slurm_time(epoch: float) -> str:
    """Slurm's commands read and print times in the controller's local time."""
    return datetime.datetime.fromtimestamp(epoch).strftime("%Y-%m-%dT%H:%M:%S")


def epoch_of(slurm_text: str) -> Optional[float]:
    try:
        return datetime.datetime.strptime(slurm_text, "%Y-%m-%dT%H:%M:%S").timestamp()
    except ValueError:
        return None


def started_jobs(squeue_text: str, since: float) -> List[str]:
    """``squeue -h -r -t all -o %i|%T|%S|%M`` -> ids of jobs that started at or after ``since``."""
    found = []
    for line in squeue_text.splitlines():
        fields = line.strip().split("|")
        if len(fields) != 4 or not fields[0]:
            continue
        job_id, state, start, used = fields
        ran = state in STARTED_STATES or (state == "CANCELLED" and used not in ("0:00", ""))
        at = epoch_of(start)
        if ran and at is not None and at >= since:
            found.append(job_id)
    return found


def first_change(transactions_text: str, association_ids: List[str], hold_qos_id: Optional[str]) -> Optional[str]:
    """``sacctmgr -nP list transactions format=Time,Actor,Action,Where,Info`` (oldest first): the first change
    to the hold QOS's limits or to one of these associations after hpops's latest hold of them (its record
    updates are Description only, its hold sets an association to the hold QOS's id alone)."""
    ours = "def_qos_id={0}, qos=',{0},', delta_qos=''".format(hold_qos_id) if hold_qos_id else None
    where_assoc = {"(id_assoc={})".format(assoc_id) for assoc_id in association_ids}
    found = None
    for line in transactions_text.splitlines():
        fields = line.split("|", 4)
        if len(fields) != 5:
            continue
        at, actor, action, where, info = fields
        if action == "Modify Associations" and where in where_assoc and info == ours:
            found = None  # hpops's hold (again): what counts comes after it
        elif found is None and action == "Modify QOS" and "'{}'".format(HOLD_QOS) in where \
                and not info.startswith("description="):
            found = short("{} by {} at {}: {}".format("QOS " + HOLD_QOS + " modified", actor, at, info))[:160]
        elif found is None and action == "Modify Associations" and where in where_assoc:
            found = short("association {} modified by {} at {}: {}".format(where.strip("()"), actor, at, info))[:160]
    return found


class SlurmHolds:
    """Converges Slurm to a holds document; keeps what it changed, and the values before, in a state file
    and in the hold QOS's Description."""

    def __init__(self, state_path: str, slurm_bin: str, run: Callable[..., Any] = subprocess.run,
                 log: Callable[..., None] = lambda event, **fields: None) -> None:
        self.state_path = state_path
        self.sacctmgr = os.path.join(slurm_bin, "sacctmgr")
        self.scontrol = os.path.join(slurm_bin, "scontrol")
        self.squeue = os.path.join(slurm_bin, "squeue")
        self.run = run
        self.log = log
        self.state = self._load()
        self._slurm_record: Optional[Dict[str, Any]] = None

    # ------------------------------------------------------------------ commands and state

    def _command(self, *args: str) -> Tuple[int, str, str]:
        env = dict(os.environ, LC_ALL="C")
        try:
            result = self.run(list(args), capture_output=True, timeout=TIMEOUT_SECONDS, env=env,
                              stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            return 124, "", "{} timed out after {} s".format(os.path.basename(args[0]), TIMEOUT_SECONDS)
        except OSError as error:
            return 127, "", "cannot run {}: {}".format(args[0], error.strerror)
        decode = (lambda b: b.decode("utf-8", "replace")) if isinstance(result.stdout, bytes) else (lambda s: s)
        return result.returncode, decode(result.stdout), decode(result.stderr)

    def _failed(self, what: str, code: int, out: str, err: str) -> str:
        return short("{} failed: {}".format(what, (err or out).strip() or "exit {}".format(code)))

    def _load(self) -> Dict[str, Any]:
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            return {"users": {}}
        except (OSError, ValueError) as error:
            # Never guess: the copy in the hold QOS's Description is what lifts then.
            self.log("holds-state-unreadable", path=self.state_path, reason=type(error).__name__)
            return {"users": {}, "unreadable": True}
        return state if isinstance(state, dict) and isinstance(state.get("users"), dict) else {"users": {}}

    def save(self) -> None:
        directory = os.path.dirname(self.state_path)
        os.makedirs(directory, mode=0o700, exist_ok=True)
        temporary = self.state_path + ".tmp"
        descriptor = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(descriptor, "w", encoding="utf-8") as handle:
            json.dump(self.state, handle, sort_keys=True)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.state_path)

    def cluster_name(self, scontrol_config: Optional[str]) -> Optional[str]:
        name = config_value(scontrol_config or "", "ClusterName")
        return name if name and validation.is_cluster_name(name.replace("_", "-")) else None

    def _show_assoc(self, where: List[str], own: bool = False) -> Tuple[Optional[List[Dict[str, str]]], str]:
        code, out, err = self._command(self.sacctmgr, "-nP", "show", "assoc", *(OWN_VALUES if own else ()),
                                       "where", *where, "format=" + ASSOC_FORMAT)
        if code != 0:
            return None, self._failed("sacctmgr show assoc", code, out, err)
        return parse_associations(out), ""

    def associations(self, user: str, cluster: Optional[str], own: bool = True
                     ) -> Tuple[Optional[List[Dict[str, str]]], str]:
        """``user``'s associations; ``own``: the values each sets itself (raw QOS, "" when inherited),
        else the effective ones slurmctld applies."""
        rows, problem = self._show_assoc(["user=" + user] + (["cluster=" + cluster] if cluster else []), own)
        return (None if rows is None else [row for row in rows if row["user"] == user]), problem

    def _modify(self, user: str, cluster: Optional[str], values: Dict[str, str],
                account: Optional[str] = None, partition: Optional[str] = None) -> str:
        where = ["name=" + user] + (["cluster=" + cluster] if cluster else [])
        where += (["account=" + account] if account else []) + (["partition=" + partition] if partition else [])
        sets = ["{}={}".format(name, value) for name, value in sorted(values.items())]
        code, out, err = self._command(self.sacctmgr, "-i", "modify", "user", "where", *where, "set", *sets)
        return "" if code == 0 else self._failed("sacctmgr modify", code, out, err)

    def pending_jobs(self, user: str) -> Tuple[Optional[List[Tuple[str, str, str, str]]], str]:
        """(job id, QOS, account, partition) of each of ``user``'s pending jobs, array tasks one by one."""
        code, out, err = self._command(self.squeue, "-h", "-r", "-t", "PD", "-u", user, "-o", "%i|%q|%a|%P")
        if code != 0:
            return None, self._failed("squeue", code, out, err)
        jobs = []
        for line in out.splitlines():
            fields = line.strip().split("|")
            if len(fields) == 4 and fields[0]:
                jobs.append((fields[0], fields[1], fields[2], fields[3]))
        return jobs, ""

    def _move_jobs(self, job_ids: List[str], qos: str) -> str:
        for start in range(0, len(job_ids), JOBS_PER_UPDATE):
            chunk = ",".join(job_ids[start:start + JOBS_PER_UPDATE])
            code, out, err = self._command(self.scontrol, "update", "JobId=" + chunk, "QOS=" + qos)
            if code != 0:
                return self._failed("scontrol update QOS={}".format(qos), code, out, err)
        return ""

    # ------------------------------------------------------------------ the hold QOS and its record

    def _ensure_hold_qos(self) -> str:
        """Create the hold QOS, or put its limits and flag back; "" or why not."""
        code, out, err = self._command(self.sacctmgr, "-nP", "show", "qos", "where", "name=" + HOLD_QOS,
                                       "format=Name,MaxJobsPU,GrpJobs,Flags,Description")
        if code != 0:
            return self._failed("sacctmgr show qos", code, out, err)
        rows = [line.split("|", 4) for line in out.splitlines() if line.split("|", 1)[0] == HOLD_QOS]
        wanted = ["{}={}".format(name, value) for name, _, value in HOLD_QOS_LIMITS] + ["Flags=" + HOLD_QOS_FLAG]
        if not rows:
            code, out, err = self._command(self.sacctmgr, "-i", "add", "qos", HOLD_QOS, *wanted,
                                           "Description=" + encode_record({}))
            self._slurm_record = {}
            return "" if code == 0 else self._failed("sacctmgr add qos " + HOLD_QOS, code, out, err)
        row = rows[0] + [""] * (5 - len(rows[0]))
        self._slurm_record = decode_record(row[4])
        if self._slurm_record is None:
            self.log("holds-record-unreadable", qos=HOLD_QOS)
        flags = [flag.strip() for flag in row[3].split(",")]
        if row[1] != "0" or row[2] != "0" or HOLD_QOS_FLAG not in flags:
            code, out, err = self._command(self.sacctmgr, "-i", "modify", "qos", "where", "name=" + HOLD_QOS,
                                           "set", *wanted)
            if code != 0:
                return self._failed("sacctmgr modify qos " + HOLD_QOS, code, out, err)
            self.log("hold-qos-reset", qos=HOLD_QOS)
        return ""

    def _hold_qos_id(self) -> Optional[str]:
        code, out, _ = self._command(self.sacctmgr, "-nP", "show", "qos", "where", "name=" + HOLD_QOS, "format=ID")
        found = out.split()
        return found[0] if code == 0 and len(found) == 1 and found[0].isdigit() else None

    def _slurm_copy(self) -> Dict[str, Any]:
        return {user: {assoc_id: {k: v for k, v in previous.items() if k in ("qos", "defaultQos")}
                       for assoc_id, previous in record.get("associations", {}).items() if "qos" in previous}
                for user, record in sorted(self.state["users"].items())}

    def _keep(self) -> str:
        """The state file, then the same association values in Slurm; before any change they describe."""
        self.save()
        copy = self._slurm_copy()
        if copy == self._slurm_record:
            return ""
        code, out, err = self._command(self.sacctmgr, "-i", "modify", "qos", "where", "name=" + HOLD_QOS, "set",
                                       "Description=" + encode_record(copy))
        if code != 0:
            return self._failed("sacctmgr modify qos Description", code, out, err)
        self._slurm_record = copy
        return ""

    def _previous(self, user: str, assoc_id: str) -> Optional[Dict[str, Any]]:
        kept = ((self._slurm_record or {}).get(user) or {}).get(assoc_id)
        return dict(kept) if isinstance(kept, dict) and "qos" in kept else None

    # ------------------------------------------------------------------ converge

    def converge(self, document_text: Optional[str], now: float) -> Dict[str, Any]:
        """One pass: hold the desired users, lift what hpops set for anyone else; the report's body."""
        config_text = self._command(self.scontrol, "show", "config")
        config = config_text[1] if config_text[0] == 0 else None
        enforced, enforce_reason = enforcement(config)
        cluster = self.cluster_name(config)
        report: Dict[str, Any] = {"version": None, "enforced": enforced, "enforceReason": enforce_reason, "users": []}
        if document_text is None:
            desired: Optional[List[str]] = []  # no parameter: nothing is desired held
        else:
            try:
                document = user_holds.parse_document(document_text)
            except user_holds.BadHolds as error:
                self.log("holds-refused", reason=short(str(error)))
                document, desired = None, None
                report["users"] = [{"user": u, "state": user_holds.FAILED,
                                    "reason": short("desired holds refused ({}); the hold set earlier stays"
                                                    .format(error))} for u in sorted(self.state["users"])]
            if document is not None:
                report["version"] = document["version"]
                expires = datetime.datetime.strptime(document["expiresAt"], "%Y-%m-%dT%H:%M:%SZ").replace(
                    tzinfo=datetime.timezone.utc).timestamp()
                desired = [] if now >= expires else list(document["users"])
        if desired is None:
            return report
        problem = self._ensure_hold_qos()
        if problem:
            report["users"] = [{"user": u, "state": user_holds.FAILED, "reason": problem}
                               for u in sorted(set(desired) | set(self.state["users"]))]
            return report
        for user in sorted(desired):
            state, reason = self._hold(user, cluster, enforced, enforce_reason, now)
            report["users"].append({"user": user, "state": state, "reason": reason})
        for user in sorted(self._held_in_slurm(cluster) - set(desired)):
            problem = self._lift(user, cluster)
            if problem:
                report["users"].append({"user": user, "state": user_holds.FAILED,
                                        "reason": short("could not lift the hold: " + problem)})
        report["users"] = report["users"][:user_holds.MAX_REPORTED_USERS]
        return report

    def _held_in_slurm(self, cluster: Optional[str]) -> set:
        """Everyone hpops may have held: its records, the copy in Slurm, and users in the hold QOS."""
        users = set(self.state["users"]) | set(self._slurm_record or {})
        rows, problem = self._show_assoc(["qos=" + HOLD_QOS] + (["cluster=" + cluster] if cluster else []))
        if rows is None:
            self.log("holds-list-failed", reason=problem)
        users |= {row["user"] for row in rows or [] if row["user"] and in_hold(row)}
        return {user for user in users if validation.is_posix_user(user) and user != "root"}

    def _hold(self, user: str, cluster: Optional[str], enforced: Optional[bool], enforce_reason: str,
              now: float) -> Tuple[str, str]:
        if user in NEVER_HELD or not validation.is_posix_user(user):
            return user_holds.FAILED, "{} is never held".format(short(user))
        associations, problem = self.associations(user, cluster)
        if associations is None:
            return user_holds.FAILED, problem
        if not associations:
            return user_holds.FAILED, ("{} has no Slurm association on this cluster: nothing to hold (with "
                                       "AccountingStorageEnforce=associations they cannot submit)".format(user))
        record = self.state["users"].setdefault(user, {"since": int(now), "associations": {}, "jobs": {}})
        unknown = []
        for assoc in associations:
            previous = record["associations"].setdefault(assoc["id"], {
                "account": assoc["account"], "partition": assoc["partition"]})
            if not in_hold(assoc):
                # Not (or no longer) ours: what the association sets itself now is what a lift restores.
                previous["qos"], previous["defaultQos"] = assoc["qos"], assoc["defaultQos"]
            elif "qos" not in previous:
                kept = self._previous(user, assoc["id"])
                if kept is None:
                    unknown.append(assoc["id"])
                else:
                    previous.update(kept)
        problem = self._keep()  # before the change: a crash after it must still know what to restore
        if problem:
            return user_holds.FAILED, problem
        if not all(in_hold(assoc) for assoc in associations):
            failed = self._modify(user, cluster, {"QOS": HOLD_QOS, "DefaultQOS": HOLD_QOS})
            if failed:
                return user_holds.FAILED, failed
            self.log("hold-set", user=user, associations=len(associations))
        jobs, problem = self.pending_jobs(user)
        if jobs is None:
            return user_holds.FAILED, problem
        moving = [job for job in jobs if job[1] != HOLD_QOS]
        pending = {job[0] for job in jobs}
        # Only jobs still pending need their QOS back (a record from an earlier version has none).
        before = record.get("jobs") or {}
        record["jobs"] = dict({j: q for j, q in before.items() if j in pending},
                              **{job_id: qos for job_id, qos, _, _ in moving})
        if record["jobs"] != before:
            self.save()
        if moving:
            failed = self._move_jobs([job[0] for job in moving], HOLD_QOS)
            if failed:
                return user_holds.FAILED, failed
        state, reason = self._verify(user, cluster, enforced, enforce_reason, unknown)
        escaped = self._escaped(user, record, [a["id"] for a in associations], state == user_holds.HELD, now)
        return (user_holds.FAILED, short(escaped + "; " + reason)) if escaped else (state, reason)

    def _escaped(self, user: str, record: Dict[str, Any], association_ids: List[str], held: bool, now: float) -> str:
        """Why the report must say the hold did not hold: jobs of ``user`` that started while it was in
        place, and the change Slurm logged that let them; "" when none (or none within the last hour).

        The jobs that had started when the hold was first read back in place are remembered (Slurm's
        own job ids, no clock); any other job of the user seen started later escaped it."""
        code, out, err = self._command(self.squeue, "-h", "-r", "-t", "all", "-u", user, "-o", "%i|%T|%S|%M")
        if code != 0:
            return ""  # the read-back already failed on squeue, or will next pass
        started = started_jobs(out, 0)
        starts = {line.split("|")[0]: line.split("|")[2] for line in out.splitlines() if line.count("|") == 3}
        if "startedAtHold" not in record:
            if held:
                record["startedAtHold"] = started
                self.save()
            return ""
        before = set(record["startedAtHold"])
        escapes = record.setdefault("escaped", {})
        new = sorted(set(started) - before - set(escapes))
        if new:
            change = self._change_before(starts.get(new[0], ""), association_ids)
            for job_id in new:
                escapes[job_id] = {"seen": now, "change": change}
            self.log("hold-escaped", user=user, jobs=new[:20], change=change)
        for job_id, seen in list(escapes.items()):
            if job_id in started:
                seen["last"] = now
            elif now - float(seen.get("last", seen["seen"])) >= ESCAPE_REPORT_SECONDS:
                del escapes[job_id]
        # Only ids squeue still shows can start again under this hold's eyes: the rest are forgotten.
        record["startedAtHold"] = sorted(before & set(starts), key=lambda j: (len(j), j))
        self.save()
        if not escapes:
            record.pop("escaped", None)
            return ""
        ids = sorted(escapes, key=lambda j: (len(j), j))
        change = next((escapes[j]["change"] for j in ids if escapes[j].get("change")), None)
        return "job(s) {} of {} started while held ({}); the hold is put back every poll".format(
            ",".join(ids[:10]), user, "Slurm's log: " + change if change else
            "no change to QOS {} or the user's associations in Slurm's transaction log".format(HOLD_QOS))

    def _change_before(self, job_start: str, association_ids: List[str]) -> Optional[str]:
        """The change that let a held job start: the first one after hpops's latest hold, in the day before
        the job started (Slurm's own clock, as squeue printed the start)."""
        end = epoch_of(job_start)
        if end is None:
            return None
        code, out, _ = self._command(self.sacctmgr, "-nP", "list", "transactions", "Start=" + slurm_time(end - 86400),
                                     "End=" + slurm_time(end + 1), "format=Time,Actor,Action,Where,Info")
        return first_change(out, association_ids, self._hold_qos_id()) if code == 0 else None

    def _verify(self, user: str, cluster: Optional[str], enforced: Optional[bool], enforce_reason: str,
                unknown: List[str]) -> Tuple[str, str]:
        """Read back what slurmctld will apply: every association in the hold QOS, every pending job too."""
        associations, problem = self.associations(user, cluster)
        if associations is None:
            return user_holds.FAILED, problem
        unheld = [a["id"] for a in associations if not in_hold(a)]
        if unheld:
            return user_holds.FAILED, "read back: association(s) {} are not QOS={} DefaultQOS={}".format(
                ",".join(unheld[:5]), HOLD_QOS, HOLD_QOS)
        jobs, problem = self.pending_jobs(user)
        if jobs is None:
            return user_holds.FAILED, problem
        escaped = [job[0] for job in jobs if job[1] != HOLD_QOS]
        if escaped:
            return user_holds.FAILED, "read back: pending job(s) {} are not in QOS {}".format(
                ",".join(escaped[:5]), HOLD_QOS)
        if enforced is not True:
            return user_holds.FAILED, short("QOS {} set but not enforced: {}".format(HOLD_QOS, enforce_reason))
        reason = "QOS {} on {} association(s), {} pending job(s): new and pending jobs wait ({})".format(
            HOLD_QOS, len(associations), len(jobs), "QOSGrpJobsLimit")
        if unknown:
            reason += "; previous QOS of association(s) {} unknown (records lost): a lift leaves them".format(
                ",".join(unknown[:5]))
        return user_holds.HELD, short(reason)

    def _lift(self, user: str, cluster: Optional[str]) -> str:
        record = self.state["users"].setdefault(user, {"since": 0, "associations": {}, "jobs": {}})
        associations, problem = self.associations(user, cluster)
        if associations is None:
            return problem
        current = {a["id"]: a for a in associations}
        problems = []
        # Account-wide associations first: "where account=A" also reaches that account's partition ones.
        for assoc in sorted(associations, key=lambda a: (bool(a["partition"]), a["id"])):
            previous = record["associations"].get(assoc["id"]) or self._previous(user, assoc["id"]) or {}
            if in_hold(assoc) and "qos" not in previous:
                problems.append("previous QOS of association {} unknown (state file and the copy in QOS {} "
                                "lost): set its QOS by hand".format(assoc["id"], HOLD_QOS))
                continue
            steps = restore_steps(previous["qos"], previous["defaultQos"]) if in_hold(assoc) else [{}]
            # A hold of an earlier version: restore a limit while it still reads the 0 it set.
            steps[-1].update({name: previous.get(name) or "-1" for name in LEGACY_LIMITS
                              if name in previous and assoc[name] == LEGACY_HOLD_VALUE
                              and previous.get(name, "") != LEGACY_HOLD_VALUE})
            for restore in steps:
                if restore:
                    failed = self._modify(user, cluster, restore, assoc["account"], assoc["partition"] or None)
                    if failed:
                        return failed
        if problems:
            return problems[0]
        problem = self._jobs_back(user, cluster, record)
        if problem:
            return problem
        del self.state["users"][user]
        problem = self._keep()
        self.log("hold-lifted", user=user, associations=len(current))
        return problem

    def _jobs_back(self, user: str, cluster: Optional[str], record: Dict[str, Any]) -> str:
        """Each pending job in the hold QOS back to the QOS it had, or its association's default."""
        jobs, problem = self.pending_jobs(user)
        if jobs is None:
            return problem
        held = [job for job in jobs if job[1] == HOLD_QOS]
        if not held:
            return ""
        associations, problem = self.associations(user, cluster, own=False)
        if associations is None:
            return problem
        by_place = {(a["account"], a["partition"]): a for a in associations}
        targets: Dict[str, List[str]] = {}
        for job_id, _, account, partition in held:
            assoc = by_place.get((account, partition)) or by_place.get((account, ""))
            allowed = qos_set(assoc["qos"]) if assoc else []
            target = job_target((record.get("jobs") or {}).get(job_id), allowed, assoc["defaultQos"] if assoc else "")
            if target is None or target == HOLD_QOS:
                return "no QOS to move pending job {} back to (account {})".format(job_id, account)
            targets.setdefault(target, []).append(job_id)
        for target, job_ids in sorted(targets.items()):
            failed = self._move_jobs(job_ids, target)
            if failed:
                return failed
        return ""
