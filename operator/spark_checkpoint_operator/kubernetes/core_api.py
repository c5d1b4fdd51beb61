"""The calls of the Core v1 API the operator makes (pods and Secrets), through the official
client's `ApiClient`, named as the client's `CoreV1Api` names them, with its models and
exceptions (`NotFoundException`, `ConflictException`, ...).

That class defines every call of the Core v1 API, and its module loads all ~250 of its
models: about a second of CPU at each operator start, near half of it (2026-12-03, this
machine: the handlers' import 2.3 -> 1.2 s). This module loads the models the calls take
and return and those nested in them (~140: a pod's spec and status hold most). The names
are CoreV1Api's; the arguments are those the operator passes (`content_type` for the
patch), and calls whose answer it does not read return None. Requests go through
`ApiClient.call_api` as the generated ones do, so the operator's timeouts
(`runtime.OperatorApiClient`) and the configured authentication (a refreshed token) apply.
"""

from typing import Any, TypeVar

from kubernetes.aio.client import ApiClient, V1Pod, V1PodList, V1Secret

JSON = "application/json"
PODS = "/api/v1/namespaces/{namespace}/pods"
POD = PODS + "/{name}"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"
SECRET = SECRETS + "/{name}"

_Answer = TypeVar("_Answer", V1Pod, V1PodList, V1Secret)


class CoreCalls:
    def __init__(self, api: ApiClient) -> None:
        self._api = api

    async def _call(
        self,
        method: str,
        path: str,
        returns: str | None,
        *,
        namespace: str,
        name: str | None = None,
        query: list[tuple[str, str]] | None = None,
        body: object = None,
        content_type: str = JSON,
    ) -> object:
        """The answer as the model named ``returns`` (None: not read); an error answer
        raises the client's `ApiException` (`NotFoundException`, ...)."""
        path_params = {"namespace": namespace} | ({} if name is None else {"name": name})
        headers = {"Accept": JSON} | ({} if body is None else {"Content-Type": content_type})
        request = await self._api.param_serialize(
            method=method,
            resource_path=path,
            path_params=path_params,
            query_params=query or [],
            header_params=headers,
            body=body,
            auth_settings=["BearerToken"],
        )
        response = await self._api.call_api(*request)
        await response.read()
        data: object = self._api.response_deserialize(response, {"2XX": returns}).data
        return data

    async def _answer(self, returns: type[_Answer], method: str, path: str, **call: Any) -> _Answer:
        """A call whose answer is a ``returns``, as the client deserialized it."""
        answer = await self._call(method, path, returns.__name__, **call)
        if not isinstance(answer, returns):
            raise TypeError(f"{method} {path}: a {returns.__name__} expected, not {answer!r}")
        return answer

    async def read_namespaced_pod(self, name: str, namespace: str) -> V1Pod:
        return await self._answer(V1Pod, "GET", POD, namespace=namespace, name=name)

    async def list_namespaced_pod(self, namespace: str, *, label_selector: str) -> V1PodList:
        query = [("labelSelector", label_selector)]
        return await self._answer(V1PodList, "GET", PODS, namespace=namespace, query=query)

    async def create_namespaced_pod(
        self, namespace: str, body: V1Pod, *, dry_run: bool = False
    ) -> V1Pod:
        """``dry_run``: checked and admitted as a create is, nothing created."""
        query = [("dryRun", "All")] if dry_run else None
        return await self._answer(V1Pod, "POST", PODS, namespace=namespace, body=body, query=query)

    async def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        await self._call("DELETE", POD, None, namespace=namespace, name=name)

    async def read_namespaced_secret(self, name: str, namespace: str) -> V1Secret:
        return await self._answer(V1Secret, "GET", SECRET, namespace=namespace, name=name)

    async def create_namespaced_secret(self, namespace: str, body: V1Secret) -> None:
        await self._call("POST", SECRETS, None, namespace=namespace, body=body)

    async def patch_namespaced_secret(
        self, name: str, namespace: str, body: dict[str, Any], *, content_type: str
    ) -> None:
        await self._call(
            "PATCH",
            SECRET,
            None,
            namespace=namespace,
            name=name,
            body=body,
            content_type=content_type,
        )
