"""A stack update with new parameter values in the twin (`sam deploy --parameter-overrides`): the
functions run with the new environment and their roles' new policies; an update that would change
another resource is refused, and changes nothing."""

from __future__ import annotations

import pytest

from hpops_twin.iam.operations import Check
from hpops_twin.world import TwinWorld

HOLDS = {"UserMonthlyBudgetUsd": "5000", "UserBudgetAction": "hold"}


def test_turning_holds_on_reaches_the_functions_environment_and_their_policies():
    with TwinWorld(parameters={"HostIdentityMode": "off"}) as world:
        record = world.resolver.physical_ids["RecordUsageReportFunction"]
        machine = world.resolver.physical_ids["BudgetGuardStateMachine"]
        start = Check("states:StartExecution", machine)

        def environment(name: str) -> dict[str, str]:
            deployed = world.aws.client("lambda").get_function_configuration(FunctionName=name)["Environment"]["Variables"]
            assert deployed == world.dispatcher.bindings[name].environment  # what the handler runs with
            return deployed

        assert environment(record).get("BUDGET_GUARD_STATE_MACHINE_ARN") != machine
        assert not world.iam.decide("function:RecordUsageReportFunction", start).allowed

        world.update_parameters(HOLDS)

        assert environment(record)["BUDGET_GUARD_STATE_MACHINE_ARN"] == machine
        assert environment(world.resolver.physical_ids["CheckUserSpendFunction"])["USER_BUDGET_ACTION"] == "hold"
        assert world.iam.decide("function:RecordUsageReportFunction", start).allowed

        # The target group's attributes would change: the twin does not replay that update.
        delay = world.resolver.parameters["DeregistrationDelaySeconds"]
        with pytest.raises(NotImplementedError, match="TargetGroup"):
            world.update_parameters({"DeregistrationDelaySeconds": "30"})
        assert world.resolver.parameters["DeregistrationDelaySeconds"] == delay
