"""The calls of the Core v1 API the operator makes (pods and Secrets), through the official
client's `ApiClient`, with the names, arguments, models and exceptions of its `CoreV1Api`.

That class defines every call of the Core v1 API, and its module loads all ~250 of its
models: a second of CPU at each operator start, half of the start (2026-12-03, this
machine: the handlers' import 2.3 -> 1.4 s). These few load the models they return, when
first called. Requests go through `ApiClient.call_api` as the generated ones do, so the
operator's timeouts (`runtime.OperatorApiClient`) and the configured authentication apply.
"""

from typing import Any

from kubernetes.aio.client import ApiClient, V1Pod, V1PodList, V1Secret

JSON = "application/json"
PODS = "/api/v1/namespaces/{namespace}/pods"
POD = PODS + "/{name}"
SECRETS = "/api/v1/namespaces/{namespace}/secrets"
SECRET = SECRETS + "/{name}"


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
        body: Any = None,
        content_type: str = JSON,
    ) -> Any:
        """The call's answer as the model named ``returns`` (None: not read); an error
        answer raises the client's `ApiException` (`NotFoundException`, ...)."""
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
        return self._api.response_deserialize(response, {"2XX": returns}).data

    async def read_namespaced_pod(self, name: str, namespace: str) -> V1Pod:
        pod: V1Pod = await self._call("GET", POD, "V1Pod", namespace=namespace, name=name)
        return pod

    async def list_namespaced_pod(self, namespace: str, *, label_selector: str) -> V1PodList:
        query = [("labelSelector", label_selector)]
        pods: V1PodList = await self._call(
            "GET", PODS, "V1PodList", namespace=namespace, query=query
        )
        return pods

    async def create_namespaced_pod(self, namespace: str, body: V1Pod) -> V1Pod:
        pod: V1Pod = await self._call("POST", PODS, "V1Pod", namespace=namespace, body=body)
        return pod

    async def delete_namespaced_pod(self, name: str, namespace: str) -> None:
        await self._call("DELETE", POD, None, namespace=namespace, name=name)

    async def read_namespaced_secret(self, name: str, namespace: str) -> V1Secret:
        secret: V1Secret = await self._call(
            "GET", SECRET, "V1Secret", namespace=namespace, name=name
        )
        return secret

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
