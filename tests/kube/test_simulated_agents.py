"""The simulated agents answer status requests as the real agent does (the operator-scale
benchmark and the simulated operator tests stand on that)."""

from typing import Any

import aiohttp
import pytest

from helpers.kube.simulated import SimulatedAgents
from helpers.ports import free_port
from spark_checkpoint.storage.layout import JobStorageLayout

pytestmark = [pytest.mark.asyncio, pytest.mark.timeout(30)]

TOKEN = "simulated-token"


async def _status(agents: SimulatedAgents, query: dict[str, str]) -> tuple[int, Any]:
    async with (
        aiohttp.ClientSession() as session,
        session.get(
            f"http://127.0.0.1:{agents.port}/v1/status",
            params=query,
            headers={"Authorization": f"Bearer {TOKEN}"},
        ) as response,
    ):
        return response.status, await response.json()


@pytest.mark.parametrize(
    ("query", "parameter"),
    [
        ({"after": "abc"}, "after"),
        ({"after": "-1"}, "after"),
        ({"after": "1", "wait": "soon"}, "wait"),
        ({"after": "1", "wait": "nan"}, "wait"),
    ],
)
async def test_bad_long_poll_parameters_are_refused_as_the_real_agent_does(
    query: dict[str, str], parameter: str
) -> None:
    agents = SimulatedAgents(port=free_port())
    await agents.start()
    try:
        storage = JobStorageLayout("file:///s", "default", "job")
        await agents.add("127.0.0.1", TOKEN, storage, attempt=1, restore=[])

        status, body = await _status(agents, query)
        version = (await _status(agents, {}))[1]["version"]
        unchanged = await _status(agents, {"after": str(version), "wait": "0.2"})
    finally:
        await agents.stop()

    assert status == 400
    assert body["error"].startswith(f"bad request: query parameter '{parameter}' must be")
    assert unchanged == (200, unchanged[1]) and unchanged[1]["version"] == version
