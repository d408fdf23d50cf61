"""The demo's budget guard steps: the cluster's budget appears with the cluster, a
scale-out of the gpu group that would overrun the month is called out at once (before AWS
Budgets' own alerts, which trail usage by hours), and the same event delivered again stays quiet.

The gpu nodes are priced at what Cost Explorer says the cluster paid for them so far this month
(billed), the login nodes, never billed in the twin, from the Price List stand-in (list).

"Now" is the event's time. The demo stamps its events with a fixed day of next month (the 10th,
12:00 UTC) so the projection's numbers do not depend on the day the demo runs.
"""

from __future__ import annotations

import datetime as dt
from decimal import Decimal
from typing import TYPE_CHECKING

from hpops_core.budget_guard.projection import usd_rate
from hpops_twin.budget_twin import VOLUME_USAGE, at

if TYPE_CHECKING:
    from hpops_twin.demo import Demo

LIMIT_USD = "750000"
# Days 1-9 of the month: 8 gpu nodes x 216 h at $85.00/h (below list: a Savings Plan, say) and
# the nodes' volumes.
GPU_BILLED = ("146880.00", "1728")
VOLUMES_BILLED = "1200.00"


def _demo_time(today: dt.datetime) -> dt.datetime:
    """The 10th of next month, 12:00 UTC: later than every event the demo sent before."""
    return (today.replace(day=1) + dt.timedelta(days=32)).replace(day=10, hour=12, minute=0, second=0, microsecond=0)


def budget_steps(demo: Demo) -> None:
    world, sim, budget = demo.world, demo.world.sim, demo.world.budget
    cluster = world.cluster_name
    now = _demo_time(dt.datetime.now(dt.timezone.utc))
    budget.tag_cluster("hpops:monthly-budget-usd", LIMIT_USD)
    budget.set_billed_usage({"ml.p5.48xlarge": GPU_BILLED}, other={VOLUME_USAGE: VOLUMES_BILLED})
    demo.say(f"budget guard: cluster tagged hpops:monthly-budget-usd={LIMIT_USD}; Cost Explorer bills it "
             f"${Decimal(GPU_BILLED[0]):,} for {GPU_BILLED[1]} h of ml.p5.48xlarge and ${Decimal(VOLUMES_BILLED):,} of "
             f"volumes this month; events stamped {now:%Y-%m-%d %H:%M} UTC (time is an input)")
    budget_name = f"hpops-{cluster}"

    def budget_exists() -> bool:
        found = budget.budgets().get(budget_name)
        return found is not None and Decimal(found["BudgetLimit"]["Amount"]) == Decimal(LIMIT_USD)

    demo.step("budget guard: InService event -> the cluster's budget", lambda: world.publish([at(sim.state_change_event(cluster), now)]),
              f"budget {budget_name} with limit ${int(LIMIT_USD):,}", budget_exists, targets=False)
    notes = budget.notifications(budget_name) if budget_exists() else []
    demo.say(f"          {budget_name}: ${int(LIMIT_USD):,}/month on tag ClusterName={cluster}; AWS Budgets alerts at "
             + ", ".join(f"{n['Threshold']:g}% {n['NotificationType'].lower()}" for n in notes))

    alerts_before = len(budget.alerts())
    scale_out = [at(e, now + dt.timedelta(minutes=5)) for e in sim.scale_group(cluster, world.worker_group, 16)]

    def one_alert_naming_the_scale_out() -> bool:
        alerts, events = budget.alerts()[alerts_before:], budget.alert_events()
        return (len(alerts) == 1 and len(events) == 1
                and alerts[0]["summary"].startswith(f"scale-out of group '{world.worker_group}' to 16 x"))

    demo.step(f"budget guard: {world.worker_group} group scaled 8 -> 16 (projected overrun)", lambda: world.publish(scale_out),
              "one alert on the AlertTopic and one EventBridge event, naming the scale-out", one_alert_naming_the_scale_out,
              targets=False)
    for alert in budget.alerts()[alerts_before:]:
        demo.say(f"          alert: {alert['summary']}")
        demo.say(f"          how:   {alert['projection']['reason']}")
        for driver in alert["projection"]["drivers"]:
            demo.say(f"          rate:  {driver['instanceType']} {usd_rate(Decimal(str(driver['usdPerHour'])))}/h "
                     f"{driver['rateSource']}: {driver['rateDetail']}")
    for event in budget.alert_events()[-1:]:
        demo.say(f"          event: {event['source']} / {event['detail-type']} on the default bus "
                 f"(projectedUsd={event['detail']['projectedUsd']:,.2f}, percentOfLimit={event['detail']['percentOfLimit']})")

    def no_second_alert() -> bool:
        return len(budget.alerts()) == alerts_before + 1 and len(budget.alert_events()) == 1

    redelivered: list[str] = []

    def deliver_again() -> list[str]:
        redelivered.extend(world.publish(scale_out))
        return redelivered

    demo.step("budget guard: the same scale-out event delivered again", deliver_again, "no second alert", no_second_alert,
              targets=False)
    for result in world.wait(budget.executions(redelivered)):
        demo.say(f"          {(result.output or {}).get('projection', {}).get('reason', result.error)}")
