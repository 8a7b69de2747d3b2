"""Toolgate on a real node: the chart's operator in pods, sidecars and gateways in pods, real
kubelet ConfigMap refresh, probes, restarts and rollouts, MCP through pod IPs and ClusterIPs with
the official Python SDK.

Run by e2e/node-suite.sh, which starts the node (e2e/node.sh), imports the images and installs
the chart; this file only talks to that cluster (KUBECONFIG) and its pods. The tests run in
file order and share two namespaces: node-sidecar (example/k8s/ as a platform team applies it)
and node-gateway (a gateway in front of a Service).

Environment: KUBECONFIG, TOOLGATE_NODE_DIR (e2e/node.sh's dir, for its containerd socket),
TOOLGATE_IMAGES (the image tarballs' dir), NODE_EDITS (McpTool edits to time, default 3).
"""

from __future__ import annotations

import json
import os
import pathlib
import statistics
import subprocess
import threading
import time
from typing import Any

import httpx
import pytest
from mcp import Client

ROOT = pathlib.Path(__file__).resolve().parent.parent
SIDECAR_NS = "node-sidecar"
GATEWAY_NS = "node-gateway"
MODERN = "2026-07-28"
LEGACY = "2025-06-18"
EXPECTED_TOOLS = {"get_customer", "search_customers", "create_ticket", "submit_payment"}
MCP_PORT = 8931
ADMIN_PORT = 9464
FIGURES: dict[str, Any] = {}


# ---------------------------------------------------------------------------------------------
# helpers


def kubectl(*args: str, stdin: str | None = None, check: bool = True) -> str:
    proc = subprocess.run(["kubectl", *args], input=stdin, capture_output=True, text=True, timeout=120)
    if check and proc.returncode != 0:
        raise AssertionError(f"kubectl {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout


def kjson(*args: str) -> Any:
    return json.loads(kubectl(*args, "-o", "json"))


def wait(what: str, timeout: float, probe, interval: float = 0.2):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        try:
            value = probe()
            if value:
                return value
        except Exception as e:  # noqa: BLE001 - remembered for the failure message
            last = e
        time.sleep(interval)
    raise AssertionError(f"{what}: not after {timeout}s (last error: {last!r})")


def in_namespace(path: pathlib.Path, ns: str) -> str:
    """The file's objects moved to `ns` (its own Namespace object left out: the test makes it)."""
    docs = path.read_text().replace("namespace: demo", f"namespace: {ns}").split("\n---\n")
    return "\n---\n".join(d for d in docs if "\nkind: Namespace\n" not in "\n" + d + "\n")


def fresh_namespace(ns: str):
    kubectl("delete", "namespace", ns, "--ignore-not-found", "--wait=true", "--timeout=120s")
    kubectl("create", "namespace", ns)


def pods(ns: str, selector: str) -> list[dict[str, Any]]:
    return kjson("get", "pods", "-n", ns, "-l", selector)["items"]


def running_pods(ns: str, selector: str) -> list[dict[str, Any]]:
    return [p for p in pods(ns, selector) if not p["metadata"].get("deletionTimestamp")]


def pod_ready(p: dict[str, Any]) -> bool:
    return any(c["type"] == "Ready" and c["status"] == "True" for c in p["status"].get("conditions", []))


def statuses(p: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Every container's status by name, native sidecars (init containers) included."""
    st = p["status"]
    return {c["name"]: c for c in st.get("initContainerStatuses", []) + st.get("containerStatuses", [])}


def server_ready(ns: str, name: str) -> bool:
    s = kjson("get", "mcpserver", name, "-n", ns)
    return any(c["type"] == "Ready" and c["status"] == "True" for c in s.get("status", {}).get("conditions", []))


def ready_pods(ns: str, selector: str, count: int, containers: int) -> list[dict[str, Any]]:
    """Exactly `count` live pods, all Ready with `containers` containers each."""
    ps = running_pods(ns, selector)
    if len(ps) != count or not all(pod_ready(p) for p in ps):
        return []
    if not all(len(statuses(p)) == containers for p in ps):
        return []
    return ps


def post(url: str, method: str, params: dict[str, Any], name: str | None = None, timeout: float = 10,
         client: httpx.Client | None = None) -> dict[str, Any]:
    """One stateless 2026-07-28 request with its headers (no SDK cache in between), on a new
    connection or on `client`'s kept-alive ones."""
    meta = {
        "io.modelcontextprotocol/protocolVersion": MODERN,
        "io.modelcontextprotocol/clientCapabilities": {},
        "io.modelcontextprotocol/clientInfo": {"name": "toolgate-node-tests", "version": "0"},
    }
    headers = {
        "content-type": "application/json",
        "accept": "application/json, text/event-stream",
        "mcp-protocol-version": MODERN,
        "mcp-method": method,
    }
    if name:
        headers["mcp-name"] = name
    body = {"jsonrpc": "2.0", "id": 1, "method": method, "params": {**params, "_meta": meta}}
    r = (client or httpx).post(url, json=body, headers=headers, timeout=timeout)
    r.raise_for_status()
    return r.json()


def tool_descriptions(url: str) -> dict[str, str]:
    result = post(url, "tools/list", {})["result"]
    return {t["name"]: t.get("description", "") for t in result["tools"]}


def call_ok(url: str, timeout: float = 10, client: httpx.Client | None = None) -> bool:
    r = post(url, "tools/call", {"name": "get_customer", "arguments": {"customerId": "42"}}, "get_customer", timeout,
             client)
    return r["result"]["structuredContent"]["status"] == "success"


def sdk_session(url: str, mode: str) -> dict[str, Any]:
    """The official SDK end to end: negotiate, list, call. mode: auto (2026-07-28) or legacy."""
    import anyio

    async def run():
        async with Client(url, mode=mode, read_timeout_seconds=15) as client:
            listed = await client.list_tools()
            result = await client.call_tool("get_customer", {"customerId": "42"})
            envelope = json.loads(result.content[0].text)
            return {"version": client.protocol_version, "tools": {t.name for t in listed.tools}, "envelope": envelope}

    return anyio.run(run)


def ctr(*args: str) -> str:
    sock = pathlib.Path(os.environ["TOOLGATE_NODE_DIR"]) / "containerd" / "containerd.sock"
    proc = subprocess.run(["ctr", "--address", str(sock), "-n", "k8s.io", *args], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def container_id(p: dict[str, Any], name: str) -> str:
    return statuses(p)[name]["containerID"].removeprefix("containerd://")


class Caller:
    """Calls get_customer on each URL in a loop in the background; counts failures. With
    keep_alive, the calls reuse their connections as an SDK's HTTP client does."""

    def __init__(self, urls: list[str], keep_alive: bool = False):
        self.urls, self.calls, self.failures = urls, 0, []
        self._client = httpx.Client() if keep_alive else None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self):
        while not self._stop.is_set():
            for u in self.urls:
                try:
                    if not call_ok(u, client=self._client):
                        self.failures.append((u, "status not success", round(time.monotonic(), 1)))
                except Exception as e:  # noqa: BLE001 - every failure is reported
                    self.failures.append((u, repr(e), round(time.monotonic(), 1)))
                self.calls += 1
            time.sleep(0.05)

    def __enter__(self):
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join(timeout=30)
        if self._client:
            self._client.close()


# ---------------------------------------------------------------------------------------------
# the images: what e2e/images.sh built is what each Dockerfile describes


def describe(tar: pathlib.Path) -> dict[str, Any]:
    out = subprocess.run(["python3", str(ROOT / "e2e/image.py"), "--describe", str(tar)],
                         capture_output=True, text=True, check=True).stdout
    return json.loads(out)


def dockerfile_final_stage(path: pathlib.Path) -> dict[str, Any]:
    """The final stage as a reader of the Dockerfile sees it (independent of image.py)."""
    lines = [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.lstrip().startswith("#")]
    last_from = max(i for i, ln in enumerate(lines) if ln.upper().startswith("FROM "))
    stage = {"base": lines[last_from].split()[1], "copies": [], "user": None, "entrypoint": None, "expose": []}
    for ln in lines[last_from + 1:]:
        word, _, rest = ln.partition(" ")
        if word == "COPY":
            stage["copies"].append(rest.split()[-1])
        elif word == "USER":
            stage["user"] = rest
        elif word == "ENTRYPOINT":
            stage["entrypoint"] = json.loads(rest)
        elif word == "EXPOSE":
            stage["expose"] += rest.split()
    return stage


@pytest.mark.parametrize("name,dockerfile", [
    ("toolgate-proxy", "proxy/Dockerfile"),
    ("toolgate-operator", "operator/Dockerfile"),
    ("example-service", "example/Dockerfile"),
])
def test_each_image_is_what_its_dockerfile_describes(name, dockerfile):
    image = describe(pathlib.Path(os.environ["TOOLGATE_IMAGES"]) / f"{name}.tar")
    want = dockerfile_final_stage(ROOT / dockerfile)
    assert want["base"] == "scratch"
    assert image["config"]["User"] == want["user"] == "65532:65532"
    assert image["config"]["Entrypoint"] == want["entrypoint"] == [f"/{name}"]
    assert sorted(image["config"]["ExposedPorts"]) == sorted(f"{p}/tcp" for p in want["expose"])
    files = {f["path"]: f for f in image["files"]}
    for path in want["copies"]:
        assert path in files, f"{dockerfile} copies {path}; the image lacks it"
    # Beyond the Dockerfile's files only the glibc build's shared libraries (the Dockerfile
    # builds static musl), nothing else: no shell, no package manager.
    extra = set(files) - set(want["copies"])
    assert all(p.startswith(("/lib/", "/lib64/")) and ".so" in p for p in extra), extra
    assert all(f["owner"] == "0:0" for f in files.values())
    assert files[f"/{name}"]["mode"] == "0o755"


def test_image_py_refuses_what_it_cannot_follow(tmp_path):
    bad = tmp_path / "Dockerfile"
    bad.write_text("FROM rust AS build\nFROM scratch\nRUN echo no shell here\n")
    proc = subprocess.run(["python3", str(ROOT / "e2e/image.py"), "--dockerfile", str(bad), "--tag", "x:1",
                           "--out", str(tmp_path / "x.tar")], capture_output=True, text=True)
    assert proc.returncode == 1 and "RUN in the final stage is not supported" in proc.stderr, proc.stderr
    bad.write_text("FROM debian\nCOPY --from=build /x /x\n")
    proc = subprocess.run(["python3", str(ROOT / "e2e/image.py"), "--dockerfile", str(bad), "--tag", "x:1",
                           "--out", str(tmp_path / "x.tar")], capture_output=True, text=True)
    assert proc.returncode == 1 and "must be FROM scratch" in proc.stderr, proc.stderr


# ---------------------------------------------------------------------------------------------
# the chart's operator


def test_operator_runs_in_cluster_two_replicas_one_leader():
    ns = os.environ.get("TOOLGATE_OPERATOR_NS", "toolgate-system")
    ps = wait("two Ready operator pods", 120,
              lambda: ready_pods(ns, "app.kubernetes.io/name=toolgate", 2, 1))
    names = {p["metadata"]["name"] for p in ps}
    for p in ps:
        sc = p["spec"]["securityContext"]
        assert sc["runAsNonRoot"] is True and sc["runAsUser"] == 65532, sc
        c = p["spec"]["containers"][0]
        assert c["securityContext"]["readOnlyRootFilesystem"] is True, c["securityContext"]
        assert p["spec"]["serviceAccountName"] != "default"
    leases = kjson("get", "leases", "-n", ns)["items"]
    holders = {lease["spec"].get("holderIdentity") for lease in leases if "toolgate" in lease["metadata"]["name"]}
    assert len(holders) == 1 and holders <= names, (holders, names)


# ---------------------------------------------------------------------------------------------
# sidecar mode: example/k8s/ as a platform team applies it


@pytest.fixture(scope="module")
def sidecar():
    fresh_namespace(SIDECAR_NS)
    started = time.monotonic()
    kubectl("apply", "-f", "-", stdin=in_namespace(ROOT / "example/k8s/shop.yaml", SIDECAR_NS))
    kubectl("apply", "-f", "-", stdin=in_namespace(ROOT / "example/k8s/tools.yaml", SIDECAR_NS))
    wait("McpServer shop Ready", 90, lambda: server_ready(SIDECAR_NS, "shop"))
    ps = wait("two shop pods Ready with the sidecar", 120, lambda: ready_pods(SIDECAR_NS, "app=shop", 2, 2))
    FIGURES["apply_to_pods_ready_s"] = round(time.monotonic() - started, 1)
    return ps


def pod_urls(ps: list[dict[str, Any]]) -> list[str]:
    return [f"http://{p['status']['podIP']}:{MCP_PORT}/mcp" for p in ps]


def service_url(ns: str, name: str) -> str:
    """The Service's ClusterIP URL, once kube-proxy routes it (its rules follow the pods' readiness
    by a moment, as on any cluster)."""
    svc = kjson("get", "service", name, "-n", ns)
    port = next(p["port"] for p in svc["spec"]["ports"] if p["name"] == "mcp")
    url = f"http://{svc['spec']['clusterIP']}:{port}/mcp"
    wait(f"{ns}/{name} routed by kube-proxy", 30, lambda: call_ok(url, timeout=2))
    return url


def test_sidecar_pods_run_both_containers(sidecar):
    for p in sidecar:
        init = p["spec"]["initContainers"]
        assert [c["name"] for c in init] == ["toolgate-proxy"], init
        assert init[0]["restartPolicy"] == "Always", "a native sidecar"
        st = statuses(p)
        assert st["toolgate-proxy"]["ready"] and st["shop"]["ready"], st
        assert st["toolgate-proxy"]["started"] is True


@pytest.mark.parametrize("mode", ["auto", "legacy"])
def test_mcp_on_pod_ips_and_the_service_clusterip(sidecar, mode):
    for url in pod_urls(sidecar) + [service_url(SIDECAR_NS, "shop-mcp")]:
        got = sdk_session(url, mode)
        assert got["version"] == (MODERN if mode == "auto" else got["version"]), got
        if mode == "legacy":
            assert got["version"].startswith("2025-"), got
        assert EXPECTED_TOOLS <= got["tools"], got
        assert got["envelope"]["status"] == "success" and got["envelope"]["data"]["id"] == "42", got


def test_tool_edit_reaches_every_replica_with_no_restart_and_no_failed_call(sidecar):
    urls = pod_urls(sidecar)
    restarts = {p["metadata"]["name"]: statuses(p)["toolgate-proxy"]["restartCount"] for p in sidecar}
    edits = int(os.environ.get("NODE_EDITS", "3"))
    latencies: list[float] = []
    with Caller(urls + [service_url(SIDECAR_NS, "shop-mcp")]) as caller:
        for i in range(edits):
            text = f"Returns one customer's profile and balance by customer id (edit {i} {time.time_ns()})."
            started = time.monotonic()
            kubectl("patch", "mcptool", "get-customer", "-n", SIDECAR_NS, "--type", "merge",
                    "-p", json.dumps({"spec": {"description": text}}))
            for url in urls:
                wait(f"edit {i} served by {url}", 90,
                     lambda url=url: tool_descriptions(url).get("get_customer", "").startswith(text), interval=0.1)
            latencies.append(time.monotonic() - started)
    assert caller.calls > 0
    assert caller.failures == [], caller.failures[:5]
    for p in running_pods(SIDECAR_NS, "app=shop"):
        assert statuses(p)["toolgate-proxy"]["restartCount"] == restarts[p["metadata"]["name"]], "no restart"
    FIGURES["tool_edit_to_every_replica_s"] = {
        "edits": edits, "p50": round(statistics.median(latencies), 1), "max": round(max(latencies), 1),
        "calls_during": caller.calls, "failed": len(caller.failures)}


def proxy_metric(url_host: str, name: str) -> float:
    text = httpx.get(f"http://{url_host}:{ADMIN_PORT}/metrics", timeout=5).text
    total = 0.0
    for line in text.splitlines():
        if line.startswith(name):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_a_broken_config_keeps_the_old_tools_and_the_pod_ready(sidecar):
    op_ns = os.environ.get("TOOLGATE_OPERATOR_NS", "toolgate-system")
    deploy = kjson("get", "deployments", "-n", op_ns, "-l", "app.kubernetes.io/name=toolgate")["items"][0]
    op = deploy["metadata"]["name"]
    # With the operator stopped nobody repairs the ConfigMap, as when a person edits it by hand.
    kubectl("scale", "deployment", op, "-n", op_ns, "--replicas=0")
    try:
        wait("operator pods gone", 60, lambda: not pods(op_ns, "app.kubernetes.io/name=toolgate"))
        ips = [p["status"]["podIP"] for p in sidecar]
        before = {ip: proxy_metric(ip, 'toolgate_config_reloads_total{result="refused"}') for ip in ips}
        kubectl("patch", "configmap", "shop-toolgate", "-n", SIDECAR_NS, "--type", "merge",
                "-p", json.dumps({"data": {"proxy.json": "{\"server\": [this is not a config\n"}}))
        for ip in ips:
            wait(f"{ip} refused the broken config", 90,
                 lambda ip=ip: proxy_metric(ip, 'toolgate_config_reloads_total{result="refused"}') > before[ip])
        for p in running_pods(SIDECAR_NS, "app=shop"):
            assert pod_ready(p), "still Ready"
        for url in pod_urls(sidecar):
            assert EXPECTED_TOOLS <= set(tool_descriptions(url)), "the old tools still served"
            assert call_ok(url)
    finally:
        kubectl("scale", "deployment", op, "-n", op_ns, "--replicas=2")
    # The operator puts its rendering back.
    wait("the ConfigMap repaired", 120, lambda: "get_customer" in kjson(
        "get", "configmap", "shop-toolgate", "-n", SIDECAR_NS)["data"]["proxy.json"])
    wait("two operator pods Ready", 120, lambda: ready_pods(op_ns, "app.kubernetes.io/name=toolgate", 2, 1))


def test_a_killed_proxy_is_restarted_while_the_service_keeps_running(sidecar):
    p = running_pods(SIDECAR_NS, "app=shop")[0]
    name = p["metadata"]["name"]
    before = statuses(p)
    ctr("tasks", "kill", "-s", "KILL", container_id(p, "toolgate-proxy"))

    def restarted():
        st = statuses(kjson("get", "pod", name, "-n", SIDECAR_NS))
        return st if st["toolgate-proxy"]["restartCount"] > before["toolgate-proxy"]["restartCount"] \
            and st["toolgate-proxy"]["ready"] else None

    after = wait("the proxy restarted by the kubelet", 90, restarted)
    assert after["shop"]["containerID"] == before["shop"]["containerID"], "the service container kept running"
    assert after["shop"]["restartCount"] == before["shop"]["restartCount"]
    assert call_ok(f"http://{p['status']['podIP']}:{MCP_PORT}/mcp")


def test_an_image_change_rolls_the_pods(sidecar):
    old = {p["metadata"]["name"] for p in running_pods(SIDECAR_NS, "app=shop")}
    image = "toolgate/toolgate-proxy:0.1.0-rolled"
    ctr("images", "tag", "--force", "docker.io/toolgate/toolgate-proxy:0.1.0", "docker.io/" + image)
    kubectl("patch", "mcpserver", "shop", "-n", SIDECAR_NS, "--type", "merge", "-p", json.dumps({"spec": {"image": image}}))

    def rolled():
        ps = ready_pods(SIDECAR_NS, "app=shop", 2, 2)
        if not ps or {p["metadata"]["name"] for p in ps} & old:
            return None
        return ps if all(p["spec"]["initContainers"][0]["image"] == image for p in ps) else None

    ps = wait("pods rolled to the new proxy image", 180, rolled)
    for url in pod_urls(ps):
        assert call_ok(url)


def test_deleting_the_mcpserver_gives_the_deployment_back(sidecar):
    kubectl("delete", "mcpserver", "shop", "-n", SIDECAR_NS, "--wait=true", "--timeout=60s")
    d = kjson("get", "deployment", "shop", "-n", SIDECAR_NS)
    spec = d["spec"]["template"]["spec"]
    assert "initContainers" not in spec, spec.get("initContainers")
    # The container exactly as example/k8s/shop.yaml wrote it (the API server's defaults aside).
    (container,) = spec["containers"]
    assert (container["name"], container["image"], container["args"], container["ports"][0]["containerPort"]) == (
        "shop", "toolgate/example-service:0.1.0", ["--listen", "0.0.0.0:8080"], 8080), container
    assert set(container) <= {"name", "image", "args", "ports", "resources", "terminationMessagePath",
                              "terminationMessagePolicy", "imagePullPolicy"}, sorted(container)
    assert not [v for v in spec.get("volumes", []) if "toolgate" in v["name"]], spec.get("volumes")
    assert not [k for k in d["spec"]["template"]["metadata"].get("annotations", {}) if "toolgate" in k]
    wait("pods back to one container", 180, lambda: ready_pods(SIDECAR_NS, "app=shop", 2, 1))


# ---------------------------------------------------------------------------------------------
# gateway mode: a Deployment of the proxy in front of a Service, resolved through CoreDNS


GATEWAY = f"""
apiVersion: v1
kind: Service
metadata:
  name: shop-api
  namespace: {GATEWAY_NS}
  annotations: {{toolgate.dev/allow-mcp-server: shop}}
spec:
  selector: {{app: shop}}
  ports: [{{name: http, port: 8080, targetPort: 8080}}]
---
apiVersion: toolgate.dev/v1alpha1
kind: McpServer
metadata:
  name: shop
  namespace: {GATEWAY_NS}
spec:
  mode: Gateway
  replicas: 2
  upstream: {{service: {{name: shop-api, port: 8080}}, timeoutMs: 10000}}
  readOnly: false
  auth: {{mode: none}}
  # Every test call comes from the node's address: the rollout test's two callers alone make
  # more than the default 120 a minute.
  rateLimit: {{perIp: {{requests: 100000, windowSeconds: 60}}, perIdentity: {{requests: 100000, windowSeconds: 60}}}}
"""


@pytest.fixture(scope="module")
def gateway():
    fresh_namespace(GATEWAY_NS)
    shop = in_namespace(ROOT / "example/k8s/shop.yaml", GATEWAY_NS)
    # The Deployment only: the gateway's McpServer replaces the sidecar one.
    deployment = next(doc for doc in shop.split("\n---\n") if "kind: Deployment" in doc)
    kubectl("apply", "-f", "-", stdin=deployment)
    kubectl("apply", "-f", "-", stdin=GATEWAY)
    kubectl("apply", "-f", "-", stdin=in_namespace(ROOT / "example/k8s/tools.yaml", GATEWAY_NS))
    wait("gateway McpServer Ready", 120, lambda: server_ready(GATEWAY_NS, "shop"))
    pods = wait("two gateway pods Ready", 120,
                lambda: ready_pods(GATEWAY_NS, "app.kubernetes.io/instance=shop,app.kubernetes.io/component=gateway", 2, 1))
    # A pod's Ready condition reaches the Service's EndpointSlice a moment later (the
    # EndpointSlice controller syncs on its own): the gateway is ready when both are behind it.
    ips = [p["status"]["podIP"] for p in pods]
    wait("both gateway pods in the Service", 60,
         lambda: all(endpoints_ready(GATEWAY_NS, "shop-mcp").get(ip) is True for ip in ips))
    return pods


def endpoints_ready(namespace: str, service: str) -> dict[str, bool]:
    """Each address in the Service's EndpointSlices, and whether it is ready."""
    slices = kjson("get", "endpointslices", "-n", namespace, "-l", f"kubernetes.io/service-name={service}")["items"]
    return {a: e["conditions"].get("ready", False) for s in slices for e in s.get("endpoints", []) for a in e["addresses"]}


def test_gateway_serves_through_its_clusterip_and_coredns(gateway):
    url = service_url(GATEWAY_NS, "shop-mcp")
    for mode in ("auto", "legacy"):
        got = sdk_session(url, mode)
        assert EXPECTED_TOOLS <= got["tools"], got
        assert got["envelope"]["status"] == "success", got
    cm = kjson("get", "configmap", "shop-toolgate", "-n", GATEWAY_NS)["data"]["proxy.json"]
    assert f"shop-api.{GATEWAY_NS}.svc" in cm, "the upstream is a Service name CoreDNS resolves"
    # Each replica answers on its own.
    for p in gateway:
        assert call_ok(f"http://{p['status']['podIP']}:{MCP_PORT}/mcp")


def test_a_proxy_that_is_not_ready_gets_no_traffic(gateway):
    """SIGTERM one gateway proxy: it fails /readyz while draining, the kubelet's readiness probe
    takes its pod out of the Service, and every call through the ClusterIP meanwhile lands on
    the other replica."""
    url = service_url(GATEWAY_NS, "shop-mcp")
    victim = gateway[0]
    ip = victim["status"]["podIP"]

    # kube-proxy's DNAT rule to the pod: the Service's calls go where these rules say.
    target = f"--to-destination {ip}:{MCP_PORT}"

    def nat() -> str:
        return subprocess.run(["iptables-save", "-t", "nat"], capture_output=True, text=True, check=True).stdout

    assert endpoints_ready(GATEWAY_NS, "shop-mcp").get(ip) is True
    wait("kube-proxy's rule to the pod", 30, lambda: target in nat())
    ctr("tasks", "kill", "-s", "TERM", container_id(victim, "toolgate-proxy"))
    wait("the draining pod out of the Service", 60, lambda: endpoints_ready(GATEWAY_NS, "shop-mcp").get(ip) is False)
    # kube-proxy acts on the same change a little later: no call goes out in between.
    wait("kube-proxy's rules without the draining pod", 30, lambda: target not in nat())
    failures = []
    for _ in range(30):
        try:
            if not call_ok(url, timeout=5):
                failures.append("status")
        except Exception as e:  # noqa: BLE001
            failures.append(repr(e))
    assert failures == [], failures[:3]
    wait("the pod back in the Service", 120, lambda: endpoints_ready(GATEWAY_NS, "shop-mcp").get(ip) is True)


def test_a_rolling_restart_of_the_gateway_fails_no_call(gateway):
    """kubectl rollout restart while two clients call through the ClusterIP, one on a new
    connection per call and one keeping its connection alive: each deleted gateway pod keeps
    serving through its shutdown delay while kube-proxy drops it, and answers with `Connection:
    close`, so the kept-alive client moves to a pod that stays. No call fails."""
    url = service_url(GATEWAY_NS, "shop-mcp")
    selector = "app.kubernetes.io/instance=shop,app.kubernetes.io/component=gateway"
    before = {p["metadata"]["name"] for p in pods(GATEWAY_NS, selector)}
    started = time.monotonic()
    with Caller([url]) as fresh, Caller([url], keep_alive=True) as kept:
        kubectl("rollout", "restart", "deployment", "shop-gateway", "-n", GATEWAY_NS)
        kubectl("rollout", "status", "deployment", "shop-gateway", "-n", GATEWAY_NS, "--timeout=180s")
        wait("the old gateway pods gone", 120,
             lambda: not before & {p["metadata"]["name"] for p in pods(GATEWAY_NS, selector)})
    for name, caller in (("new connections", fresh), ("kept-alive connection", kept)):
        assert caller.calls > 20, (name, caller.calls)
        assert caller.failures == [], (name, round(time.monotonic() - started, 1), caller.failures[:5])
    FIGURES["gateway_rollout"] = {"s": round(time.monotonic() - started, 1), "calls": fresh.calls + kept.calls,
                                  "failed": len(fresh.failures) + len(kept.failures)}


def test_report_figures():
    """Not a check: prints what the other tests measured, for the issue note."""
    print("NODE FIGURES " + json.dumps(FIGURES))
