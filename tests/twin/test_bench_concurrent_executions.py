"""make bench starts many executions at once. moto parses each definition on the execution's own
thread, and its parser shares per-parse state across threads: two parses at the wrong moment
crashed one of them and left its execution RUNNING, and the bench waited for it forever.

The collision is staged here, not left to chance: the first parse stops with its scope open until
the second has looked at the shared scope stack (or waits for its turn), then finishes first.
"""

import json
import threading
import time
from unittest import mock

import pytest
from moto.stepfunctions.parser.asl.parse.preprocessor import Preprocessor
from moto.stepfunctions.parser.backend.execution_worker import ExecutionWorker

from hpops_twin import world as twin

SAFETY = 60  # seconds: a broken twin fails these tests instead of hanging them


def _until(condition) -> None:
    deadline = time.monotonic() + SAFETY
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.005)


def _parses_waiting_for_their_turn() -> int:
    guard = getattr(twin, "ASL_PARSING", None)  # absent from a twin that lets parses overlap
    return guard.waiting if guard else 0


def test_two_executions_parsed_at_the_same_moment_both_finish(world):
    first: dict = {}
    first_paused, second_looked, first_parsed = threading.Event(), threading.Event(), threading.Event()
    real_comment = Preprocessor.visitComment_decl
    real_current = Preprocessor._get_current_query_language
    real_machine = Preprocessor.visitState_machine

    def comment(self, ctx):
        if not first:
            first["parse"] = self
            first_paused.set()
            _until(lambda: second_looked.is_set() or _parses_waiting_for_their_turn())
        return real_comment(self, ctx)

    def current_query_language(self):
        if first and self is not first["parse"] and not second_looked.is_set():
            second_looked.set()
            first_parsed.wait(SAFETY)  # the first parse closes its scopes in between
        return real_current(self)

    def state_machine(self, ctx):
        program = real_machine(self, ctx)
        if first.get("parse") is self:
            first_parsed.set()
        return program

    # The twin keeps each definition it parsed for the process: after another test on this worker ran
    # the sync, neither execution would parse, and the collision would not be staged at all.
    parsed_before = getattr(twin.ASL_PARSING, "_parsed", None)
    with mock.patch.object(Preprocessor, "visitComment_decl", comment), \
            mock.patch.object(Preprocessor, "_get_current_query_language", current_query_language), \
            mock.patch.object(Preprocessor, "visitState_machine", state_machine), \
            mock.patch.dict(parsed_before if parsed_before is not None else {}, clear=True):
        sweep = world.run_schedule()
        assert first_paused.wait(SAFETY), "the sync's definition was not parsed: no collision was staged"
        repair = world.start_repair()
        results = world.wait([sweep, repair])

    assert [r.status for r in results] == ["SUCCEEDED", "SUCCEEDED"], [(r.error, r.cause) for r in results]
    assert world.converged()


# The interpreter thread dies of the exception this test injects; pytest reporting that thread's
# traceback as a warning says nothing the assertions below do not.
@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_an_execution_whose_interpreter_died_is_named_at_once(world):
    with mock.patch.object(ExecutionWorker, "_get_evaluation_environment", side_effect=RuntimeError("interpreter bug")):
        arn = world.run_schedule()
        with pytest.raises(twin.StuckExecutionError) as raised:
            world.wait([arn], timeout=120)

    message = str(raised.value)
    assert arn.rsplit(":", 1)[-1] in message
    assert "interpreter thread died" in message and "RuntimeError: interpreter bug" in message


def test_an_execution_past_the_bound_is_named_with_its_last_state(world):
    sfn = world.aws.client("stepfunctions")
    definition = {"StartAt": "Prepare", "States": {"Prepare": {"Type": "Pass", "Next": "Hold"},
                                                   "Hold": {"Type": "Wait", "Seconds": 3600, "End": True}}}
    machine = sfn.create_state_machine(name="holds-an-hour", definition=json.dumps(definition),
                                       roleArn=world._twin_role())["stateMachineArn"]
    arn = sfn.start_execution(stateMachineArn=machine, name="held")["executionArn"]
    _until(lambda: world.last_state(arn) == "Hold")
    try:
        with pytest.raises(twin.StuckExecutionError) as raised:
            world.wait([arn], timeout=1)
    finally:
        sfn.stop_execution(executionArn=arn)

    message = str(raised.value)
    assert "execution held " in message and "last state 'Hold'" in message and "1s bound" in message
