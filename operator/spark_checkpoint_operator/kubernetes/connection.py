"""How the operator reaches the Kubernetes API server: its credentials (a pod's service
account, else a kubeconfig, as Kopf finds its own) and one request before it starts, so that
a cluster it cannot reach or that refuses it stops it with one line (Kopf would retry each
watch nine times, a minute in all, then end with tracebacks)."""

import os
from pathlib import Path

import aiohttp
from kubernetes.aio import config
from kubernetes.aio.client import ApiClient, Configuration, VersionApi
from kubernetes.aio.client.exceptions import ApiException

from spark_checkpoint.storage.errors import printable_line

__all__ = ["CannotConnect", "api_configuration", "require_api_server"]


class CannotConnect(Exception):
    """The operator has no credentials, or the API server does not answer or refuses them:
    the message is one line that says which."""


async def api_configuration() -> Configuration:
    """The service account's credentials in a pod, else KUBECONFIG's (or ~/.kube/config's)."""
    configuration = Configuration()
    try:
        config.load_incluster_config(client_configuration=configuration)
    except config.ConfigException as not_in_pod:
        try:
            await config.load_kube_config(client_configuration=configuration)
        except Exception as no_kubeconfig:  # a kubeconfig of any wrong shape, too
            in_pod = str(not_in_pod).rstrip(".")
            raise CannotConnect(
                f"no Kubernetes credentials: not in a pod ({in_pod}), and "
                f"{_kubeconfig_problem(no_kubeconfig)}"
            ) from None
    return configuration


def _kubeconfig_problem(error: Exception) -> str:
    """What is wrong with the kubeconfig, in one line: the client's own words name neither
    a file that is not there nor which file it read, and a YAML error spans lines."""
    variable = os.environ.get("KUBECONFIG", "")
    paths = [path for path in variable.split(os.pathsep) if path]
    if not paths:
        default = Path.home() / ".kube" / "config"
        if not default.exists():
            return f"KUBECONFIG is not set and {default} does not exist"
        paths = [str(default)]
    elif not any(Path(path).exists() for path in paths):
        named = ", ".join(paths)
        return f"KUBECONFIG names {named}, which does not exist"
    return (
        f"the kubeconfig {os.pathsep.join(paths)}: {printable_line(' '.join(str(error).split()))}"
    )


async def require_api_server(api: ApiClient) -> None:
    """Ask the API server its version: CannotConnect if it does not answer or refuses."""
    host = api.configuration.host
    try:
        await VersionApi(api).get_code()
    except ApiException as error:
        raise CannotConnect(
            f"the Kubernetes API server at {host} refused the operator's request: "
            f"{error.status} {printable_line(str(error.reason))}"
        ) from None
    except (aiohttp.ClientError, TimeoutError, OSError) as error:
        reason = printable_line(str(error) or type(error).__name__)
        raise CannotConnect(f"cannot reach the Kubernetes API server at {host}: {reason}") from None
