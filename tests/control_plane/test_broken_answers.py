"""An agent whose finalize or garbage-collection answer breaks the protocol is handled as
one that refuses the request: the checkpoint fails (and counts), garbage collection is
skipped, both with a notice naming the field, and the job runs on. The answers go over
HTTP through the real agent client; the rest of the agent is the scripted fake."""

import asyncio
from collections.abc import Sequence
from typing import Any

import pytest
from aiohttp import web

from helpers.agent import free_port
from helpers.fake_driver import STORAGE, FakeAgent, FakeLauncher, NoJanitor, until
from spark_checkpoint.exit_codes import DriverExit
from spark_checkpoint.protocol import CollectGarbageAnswer, FinalizeAnswer
from spark_checkpoint_operator.agent_client import AgentClient
from spark_checkpoint_operator.coordinator import CoordinatorConfig, TerminalOutcome
from spark_checkpoint_operator.manifest.model import RestartPolicySpec, RestartPolicyType
from spark_checkpoint_operator.supervisor import JobRecord, JobSupervisor
from spark_checkpoint_operator.supervisor.notices import Notice

FINALIZE = "finalize"  # POST /v1/checkpoints/{id}/finalize
COLLECT = "collect-garbage"  # POST /v1/storage/collect-garbage

# (HTTP status, body) of the finalize and collect-garbage answers, and what the notices say.
REFUSED = (
    {FINALIZE: (409, {"error": "not acknowledged"}), COLLECT: (409, {"error": "in flight"})},
    {FINALIZE: "409 not acknowledged", COLLECT: "409 in flight"},
)
MALFORMED = (
    {
        FINALIZE: (200, {"path": "file:///s/chk-1/_metadata"}),
        COLLECT: (200, {"checkpoints": "all", "savepoints": [], "sharedFiles": 0}),
    },
    {
        FINALIZE: "the answer breaks the protocol: field 'sizeBytes' is missing",
        COLLECT: 'the answer breaks the protocol: checkpoints must be a list of ids, got "all"',
    },
)


async def _serve(answers: dict[str, tuple[int, Any]]) -> tuple[web.AppRunner, str]:
    async def answer(request: web.Request) -> web.Response:
        status, body = answers[request.path.rsplit("/", 1)[1]]
        return web.json_response(body, status=status)

    app = web.Application()
    app.router.add_post("/{tail:.*}", answer)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    return runner, f"http://127.0.0.1:{port}"


def _agent_class(url: str) -> type[FakeAgent]:
    class AnsweringOverHttp(FakeAgent):
        """Finalize and collect-garbage answers come from the server at ``url``."""

        def __init__(self) -> None:
            super().__init__()
            self.client = AgentClient(url, "token")

        async def finalize(
            self, checkpoint_id: int, tasks: Sequence[str], *, waits: float = 0.0
        ) -> FinalizeAnswer:
            self._check()
            return await self.client.finalize(checkpoint_id, tasks)

        async def collect_garbage(
            self, checkpoints: Sequence[int], savepoints: Sequence[int]
        ) -> CollectGarbageAnswer:
            self._check()
            return await self.client.collect_garbage(checkpoints, savepoints)

        async def close(self) -> None:
            await self.client.close()

    return AnsweringOverHttp


def _run(answers: dict[str, tuple[int, Any]]) -> tuple[TerminalOutcome, FakeAgent, list[Notice]]:
    """Runs a job whose agent answers finalize and collect-garbage so, until it triggered
    three checkpoints and its driver finished."""
    notices: list[Notice] = []

    async def scenario() -> tuple[TerminalOutcome, FakeAgent]:
        runner, url = await _serve(answers)
        launcher = FakeLauncher()
        launcher.agent_class = _agent_class(url)

        async def save(record: JobRecord) -> None:
            return None

        supervisor = JobSupervisor(
            storage=STORAGE,
            config=CoordinatorConfig(interval=0.2, timeout=5.0, tolerable_failures=100),
            restart_policy=RestartPolicySpec(RestartPolicyType.NEVER, 0, 0.01, 0.05),
            launcher=launcher,
            janitor=NoJanitor(),
            save=save,
            record=JobRecord(),
            report=notices.append,
        )
        try:
            run = asyncio.create_task(supervisor.run())
            await until(
                lambda: bool(launcher.drivers) and len(launcher.drivers[0].agent.triggers) > 2
            )
            agent = launcher.drivers[0].agent
            launcher.drivers[0].code = DriverExit.FINISHED
            outcome = await run
            await agent.close()
            return outcome, agent
        finally:
            await runner.cleanup()

    outcome, agent = asyncio.run(scenario())
    return outcome, agent, notices


@pytest.mark.parametrize(
    ("answers", "said"), [REFUSED, MALFORMED], ids=["refused", "breaking-the-protocol"]
)
def test_a_broken_answer_fails_the_checkpoint_and_skips_collection_as_a_refusal_does(
    answers: dict[str, tuple[int, Any]], said: dict[str, str]
) -> None:
    outcome, agent, notices = _run(answers)

    assert outcome is TerminalOutcome.FINISHED, "the job ran on to its end"
    assert agent.completed == [], "no checkpoint was finalized"
    skipped = [n.message for n in notices if n.reason == "GarbageCollectionSkipped"]
    assert skipped == [
        f"garbage collection skipped: POST /v1/storage/collect-garbage: {said[COLLECT]}"
    ]
    failed = [n.message for n in notices if n.reason == "CheckpointFailed"]
    assert failed[0] == (
        "checkpoint 1 failed: writing the checkpoint metadata failed: "
        f"POST /v1/checkpoints/1/finalize: {said[FINALIZE]}"
    )
    assert len(failed) >= 2, "the job triggered the next checkpoints"


@pytest.mark.parametrize(
    "named",
    [
        "file:///s/default/other-job/chk-1/_metadata",  # another job's image
        "file:///s/default/job/savepoints/sp-1/_metadata",  # another kind
        "file:///s/default/job/chk-2/_metadata",  # another id
        "file:///s/default/job/chk-1/../../other-job/chk-1/_metadata",
    ],
)
def test_an_image_the_agent_names_outside_its_place_is_not_registered(named: str) -> None:
    """The driver runs the user's code: a path it names is not what status shows and users
    restore from unless it is the job's own image's."""
    answers = {
        FINALIZE: (200, FinalizeAnswer(named, 10).to_json()),
        COLLECT: (409, {"error": "in flight"}),
    }
    outcome, agent, notices = _run(answers)

    assert outcome is TerminalOutcome.FINISHED, "the job ran on to its end"
    assert 1 not in agent.completed, "checkpoint 1 was not registered"
    failed = [n.message for n in notices if n.reason == "CheckpointFailed"]
    assert failed[0] == (
        "checkpoint 1 failed: writing the checkpoint metadata failed: "
        f"the agent named {named!r} as its _metadata, not "
        "'file:///s/default/job/chk-1/_metadata'"
    )


@pytest.mark.parametrize(
    "named", ["/s/default/job/chk-1/_metadata", "file:///s/default/job/chk-1/_metadata"]
)
def test_the_image_spelled_as_the_running_driver_spells_the_storage_is_registered(
    named: str,
) -> None:
    """A spec may spell its storage otherwise (`file:///s` as `/s`) while a driver started
    with the old spelling runs on: its images are the job's."""
    answers = {
        FINALIZE: (200, FinalizeAnswer(named, 10).to_json()),
        COLLECT: (409, {"error": "in flight"}),
    }
    outcome, agent, notices = _run(answers)

    assert outcome is TerminalOutcome.FINISHED
    assert 1 in agent.completed, [n.message for n in notices]
    assert not [n for n in notices if n.message.startswith("checkpoint 1 failed")]
