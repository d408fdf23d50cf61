"""`make demo`'s chapters in order: the login-node story (demo.py's Demo), session limits, budgets,
certificate mode, per-user spend and holds. The chapters build on demo.py's Demo; this module, not
demo.py, imports them, so the imports run one way."""

from __future__ import annotations

import json
import random
import time
from collections.abc import Callable
from dataclasses import asdict

from hpops_twin.admission_demo import admission_steps
from hpops_twin.budget_demo import budget_steps
from hpops_twin.certificate_demo import run_certificate_chapter
from hpops_twin.demo import Demo, fitted, say_now, spread_line
from hpops_twin.holds_demo import run_holds_chapter
from hpops_twin.iam.enforce import SUITE_DENIALS
from hpops_twin.iam.principals import expanded_template
from hpops_twin.node_hosts import canonical_bundle
from hpops_twin.operator_demo import operator_steps, run_doctor_chapter
from hpops_twin.session_demo import session_limit_steps
from hpops_twin.template_model import TemplateModel
from hpops_twin.user_spend_demo import run_user_spend_chapter
from hpops_twin.world import ENFORCING, TwinWorld


def beyond_defaults(parameters: dict[str, str]) -> str:
    """What this demo's stack enforces that a new stack (template.yaml's defaults) only dry-runs."""
    declared = TemplateModel().raw["Parameters"]
    changed = ", ".join(f"{name}={value} (a new stack: {declared[name]['Default']})" for name, value in parameters.items()
                        if str(declared[name]["Default"]) != value)
    return (f"NOTE: this demo's stack enforces what a new stack only dry-runs: {changed}. A new stack reports whom "
            "it would limit and moves nobody until you set these (docs/session-limits.md, docs/balancing.md).")


def run_demo(json_path: str | None = None, out: Callable[[str], None] = say_now) -> int:
    random.seed(7)
    out = fitted(out)  # every line fits the screen
    started = time.perf_counter()
    denials_before = len(SUITE_DENIALS)

    def phase(text: str) -> None:
        out(f"[{time.perf_counter() - started:6.2f}s] {text}")

    # The demo shows limits enforced and load-aware admission acting, not their dry runs.
    parameters = ENFORCING | {"LoadAwareAdmission": "on"}
    phase(beyond_defaults(parameters))
    # The first twin's slow parts, each said as it starts (later twins reuse them).
    phase("generating the simulated login nodes' SSH host keys (RSA-3072, ECDSA, Ed25519; once)")
    canonical_bundle()
    phase("expanding template.yaml as `sam deploy` does (aws-sam-translator), for the twin's IAM checks (once)")
    expanded_template(TemplateModel())
    phase("building the twin: template.yaml's resources in moto, a simulated HyperPod cluster, "
          "a node agent per login node")
    with TwinWorld(parameters=parameters, progress=lambda text: phase(f"        {text}")) as world:
        demo = Demo(world, out, started)
        steps = demo.run()
        demo.say(spread_line(world))
        admission_steps(demo)
        session_limit_steps(demo)
        budget_steps(demo)
        operator_steps(demo)  # `hpops status` and `hpops adopt` on this stack
    run_certificate_chapter(demo)  # its own twin: one simulated cluster per twin at a time
    # Its own twin too (per-user limits are stack parameters); the holds chapter goes on with its month.
    run_user_spend_chapter(demo, then=lambda month: run_holds_chapter(demo, month))
    run_doctor_chapter(demo)  # its own twin: an account set up around the stack, as doctor checks it
    out("")
    out(demo.table())
    denials = SUITE_DENIALS[denials_before:]  # every chapter's twin enforces IAM (hpops_twin/iam)
    for denial in denials:
        out(str(denial))
    all_ok = all(s.ok for s in steps) and not denials
    out("")
    out("all steps converged" if all_ok else "SOME STEPS FAILED")
    if json_path:
        with open(json_path, "w", encoding="utf-8") as handle:
            json.dump({"ok": all_ok, "steps": [asdict(s) | {"ok": s.ok} for s in steps]}, handle, indent=2)
    return 0 if all_ok else 1
