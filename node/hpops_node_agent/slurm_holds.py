"""Hold users over their monthly dollar limit with Slurm's own association limits (controller node).

A held user's associations get ``GrpJobs=0 MaxJobs=0`` (sacctmgr): their pending and new jobs
stay PENDING with reason AssocGrpJobsLimit (AssocMaxJobsLimit when a QOS's GrpJobs overrides the
association's), sbatch still accepts jobs, and running jobs are never touched. MaxSubmitJobs=0
would reject sbatch outright and leave jobs already pending free to start; a hold QOS would not
reach jobs already pending either (see README, "Budgets that hold").

Only what hpops set is hpops's to lift. Before the first change to a user, the values each of
their associations had are written to a state file (0600), and on lift a field is restored only
while it still reads 0, the value hpops set: a limit an administrator set is never changed or
removed by the agent (an administrator's own 0 is recorded as the previous value, so it stays 0).
Level-triggered: every poll compares Slurm with the desired users, so a hold removed by hand
while the user is still over is set again at the next poll.

Standard library only, Python 3.8. Commands run with ``-i`` (sacctmgr otherwise waits for a
"commit?" answer it never gets from a service) and a timeout.
"""

from __future__ import annotations

import datetime
import json
import os
import subprocess
from typing import Any, Callable, Dict, List, Optional, Tuple

from hpops_core.common import validation
from hpops_core.node_channel import user_holds

STATE_FILE = "slurm-holds.json"
LIMITS = ("GrpJobs", "MaxJobs")
HOLD_VALUE = "0"
ASSOC_FORMAT = "ID,Cluster,Account,User,Partition,GrpJobs,MaxJobs"
TIMEOUT_SECONDS = 60
REASON_MAX = 300
ENFORCE_FIX = ("set AccountingStorageEnforce=associations,limits in slurm.conf and restart slurmctld "
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
    """(does slurmctld enforce association limits, why): ``AccountingStorageEnforce`` must include
    limits (``safe`` implies it, and show config then lists limits too)."""
    if scontrol_config is None:
        return None, "scontrol show config failed: cannot tell whether Slurm enforces limits"
    value = config_value(scontrol_config, "AccountingStorageEnforce")
    if value is None:
        return None, "scontrol show config has no AccountingStorageEnforce line"
    if "limits" in [part.strip() for part in value.split(",")]:
        return True, "AccountingStorageEnforce = {}".format(value)
    return False, short("AccountingStorageEnforce = {}: Slurm ignores association limits, so a hold cannot "
                        "apply; {}".format(value, ENFORCE_FIX))


def parse_associations(text: str, user: str) -> List[Dict[str, str]]:
    """``sacctmgr -nP show assoc ... format=ASSOC_FORMAT`` -> one dict per association of ``user``."""
    rows = []
    for line in text.splitlines():
        fields = line.split("|")
        if len(fields) != 7 or fields[3] != user or not fields[0].isdigit():
            continue
        rows.append(dict(zip(("id", "cluster", "account", "user", "partition") + LIMITS, fields)))
    return rows


class SlurmHolds:
    """Converges Slurm to a holds document; keeps what it set, and the values before, in a state file."""

    def __init__(self, state_path: str, slurm_bin: str, run: Callable[..., Any] = subprocess.run,
                 log: Callable[..., None] = lambda event, **fields: None) -> None:
        self.state_path = state_path
        self.sacctmgr = os.path.join(slurm_bin, "sacctmgr")
        self.scontrol = os.path.join(slurm_bin, "scontrol")
        self.run = run
        self.log = log
        self.state = self._load()

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

    def _load(self) -> Dict[str, Any]:
        try:
            with open(self.state_path, "r", encoding="utf-8") as handle:
                state = json.load(handle)
        except FileNotFoundError:
            return {"users": {}}
        except (OSError, ValueError) as error:
            # Never guess: without the record nothing is lifted (it is logged, and says so in reports).
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

    def associations(self, user: str, cluster: Optional[str]) -> Tuple[Optional[List[Dict[str, str]]], str]:
        where = ["user=" + user] + (["cluster=" + cluster] if cluster else [])
        code, out, err = self._command(self.sacctmgr, "-nP", "show", "assoc", "where", *where,
                                       "format=" + ASSOC_FORMAT)
        if code != 0:
            return None, short("sacctmgr show assoc failed: {}".format(err.strip() or "exit {}".format(code)))
        return parse_associations(out, user), ""

    def _modify(self, user: str, cluster: Optional[str], values: Dict[str, str],
                account: Optional[str] = None, partition: Optional[str] = None) -> str:
        where = ["name=" + user] + (["cluster=" + cluster] if cluster else [])
        where += (["account=" + account] if account else []) + (["partition=" + partition] if partition else [])
        sets = ["{}={}".format(name, value) for name, value in sorted(values.items())]
        code, out, err = self._command(self.sacctmgr, "-i", "modify", "user", "where", *where, "set", *sets)
        return "" if code == 0 else short("sacctmgr modify failed: {}".format((err or out).strip() or code))

    # ------------------------------------------------------------------ converge

    def converge(self, document_text: Optional[str], now: float) -> Dict[str, Any]:
        """One pass: hold the desired users, lift what hpops set for anyone else; the report's body."""
        config_text = self._show_config()
        enforced, enforce_reason = enforcement(config_text)
        cluster = self.cluster_name(config_text)
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
        for user in sorted(desired):
            state, reason = self._hold(user, cluster, enforced, enforce_reason, now)
            report["users"].append({"user": user, "state": state, "reason": reason})
        for user in sorted(set(self.state["users"]) - set(desired)):
            problem = self._lift(user, cluster)
            if problem:
                report["users"].append({"user": user, "state": user_holds.FAILED,
                                        "reason": short("could not lift the hold: " + problem)})
        report["users"] = report["users"][:user_holds.MAX_REPORTED_USERS]
        return report

    def _show_config(self) -> Optional[str]:
        code, out, _ = self._command(self.scontrol, "show", "config")
        return out if code == 0 else None

    def _hold(self, user: str, cluster: Optional[str], enforced: Optional[bool], enforce_reason: str,
              now: float) -> Tuple[str, str]:
        associations, problem = self.associations(user, cluster)
        if associations is None:
            return user_holds.FAILED, problem
        if not associations:
            return user_holds.FAILED, ("{} has no Slurm association on this cluster: nothing to hold (with "
                                       "AccountingStorageEnforce=associations they cannot submit)".format(user))
        record = self.state["users"].setdefault(user, {"since": int(now), "associations": {}})
        for assoc in associations:
            previous = record["associations"].setdefault(assoc["id"], {
                "account": assoc["account"], "partition": assoc["partition"]})
            for name in LIMITS:
                # A value other than ours is the administrator's latest: that is what a lift restores.
                if assoc[name] != HOLD_VALUE or name not in previous:
                    previous[name] = assoc[name]
        self.save()  # before the change: a crash after it must still know what to restore
        if any(assoc[name] != HOLD_VALUE for assoc in associations for name in LIMITS):
            failed = self._modify(user, cluster, {name: HOLD_VALUE for name in LIMITS})
            if failed:
                return user_holds.FAILED, failed
            self.log("hold-set", user=user, associations=len(associations))
            associations, problem = self.associations(user, cluster)
            if associations is None:
                return user_holds.FAILED, problem
        unheld = [a["id"] for a in associations if any(a[name] != HOLD_VALUE for name in LIMITS)]
        if unheld:
            return user_holds.FAILED, "read back: association(s) {} are not GrpJobs=0 MaxJobs=0".format(
                ",".join(unheld[:5]))
        if enforced is False:
            return user_holds.FAILED, "GrpJobs=0 MaxJobs=0 set but not enforced: " + enforce_reason
        where = "{} association(s)".format(len(associations))
        return user_holds.HELD, "GrpJobs=0 MaxJobs=0 on {}: new and pending jobs wait (AssocGrpJobsLimit)".format(where)

    def _lift(self, user: str, cluster: Optional[str]) -> str:
        record = self.state["users"][user]
        associations, problem = self.associations(user, cluster)
        if associations is None:
            return problem
        current = {a["id"]: a for a in associations}
        # Account-wide associations first: "where account=A" also reaches that account's partition ones.
        for assoc_id, previous in sorted(record["associations"].items(),
                                         key=lambda item: (bool(item[1].get("partition")), item[0])):
            now_values = current.get(assoc_id)
            if now_values is None:
                continue  # the administrator removed the association: nothing of ours is left
            restore = {name: previous.get(name) or "-1" for name in LIMITS
                       if now_values[name] == HOLD_VALUE and previous.get(name, "") != HOLD_VALUE}
            if restore:
                failed = self._modify(user, cluster, restore, previous.get("account") or now_values["account"],
                                      previous.get("partition") or None)
                if failed:
                    return failed
        del self.state["users"][user]
        self.save()
        self.log("hold-lifted", user=user)
        return ""
