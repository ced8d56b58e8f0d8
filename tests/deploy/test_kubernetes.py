"""deploy/k8s: replicas behind Envoy hashing on the session header, probes on
/health, GPUs, the model cache, Prometheus discovery."""
from __future__ import annotations

import shutil
import subprocess

import pytest
import yaml

SESSION_HEADER = "x-edgespec-session"


@pytest.fixture(scope="module")
def k8s(deploy_dir):
    """Every object of every resource in kustomization.yaml, by (kind, name)."""
    kustomization = yaml.safe_load((deploy_dir / "k8s/kustomization.yaml").read_text())
    objects = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((deploy_dir / "k8s" / resource).read_text()):
            if doc:
                objects[(doc["kind"], doc["metadata"]["name"])] = doc
    return kustomization, objects


@pytest.fixture(scope="module")
def envoy(deploy_dir):
    return yaml.safe_load((deploy_dir / "k8s/envoy.yaml").read_text())


def _server_pod(objects):
    return objects[("StatefulSet", "edgespec-server")]["spec"]["template"]["spec"]


def test_every_object_is_namespaced_and_generated_files_exist(k8s, deploy_dir):
    kustomization, objects = k8s
    assert ("Namespace", "edgespec") in objects
    for (kind, name), obj in objects.items():
        if kind != "Namespace":
            assert obj["metadata"]["namespace"] == "edgespec", (kind, name)
    for gen in kustomization["configMapGenerator"]:
        for f in gen["files"]:
            assert (deploy_dir / "k8s" / f).is_file(), f


def test_server_replicas_probes_gpu_and_cache(k8s):
    _, objects = k8s
    sts = objects[("StatefulSet", "edgespec-server")]
    assert sts["spec"]["replicas"] >= 2
    pod = _server_pod(objects)
    (server,) = pod["containers"]
    ports = {p["name"]: p["containerPort"] for p in server["ports"]}
    assert ports == {"grpc": 50051, "http": 8080}
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert server[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe
    # Loading a model must not count against liveness: the startup probe allows minutes.
    startup = server["startupProbe"]
    assert startup["periodSeconds"] * startup["failureThreshold"] >= 300
    assert server["resources"]["limits"]["nvidia.com/gpu"] == 1
    assert server["resources"]["requests"]["nvidia.com/gpu"] == 1
    mounts = {m["name"]: m["mountPath"] for m in server["volumeMounts"]}
    assert mounts["models"] == "/var/lib/edgespec"
    assert [t["metadata"]["name"] for t in sts["spec"]["volumeClaimTemplates"]] == ["models"]
    assert pod["initContainers"][0]["args"] == ["prepare"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["securityContext"]["runAsUser"] != 0
    pdb = objects[("PodDisruptionBudget", "edgespec-server")]
    assert pdb["spec"]["maxUnavailable"] == 1 and pdb["spec"]["selector"] == sts["spec"]["selector"]
    # Drain time: longer than a verification, shorter than forever.
    assert 30 <= pod["terminationGracePeriodSeconds"] <= 300


def test_server_settings_come_from_the_environment(k8s):
    _, objects = k8s
    config = objects[("ConfigMap", "edgespec-server")]["data"]
    assert config["EDGESPEC_HOME"] == "/var/lib/edgespec"
    assert config["EDGESPEC_LOG_FORMAT"] == "json"
    assert config["EDGESPEC_GRPC_PORT"] == "50051" and config["EDGESPEC_HTTP_PORT"] == "8080"
    pod = _server_pod(objects)
    assert float(config["EDGESPEC_DRAIN_GRACE"]) < pod["terminationGracePeriodSeconds"]
    (server,) = _server_pod(objects)["containers"]
    assert server["envFrom"] == [{"configMapRef": {"name": "edgespec-server"}}]


def test_headless_service_lets_envoy_see_each_replica(k8s, envoy):
    _, objects = k8s
    svc = objects[("Service", "edgespec-server")]
    assert svc["spec"]["clusterIP"] == "None"
    assert svc["spec"]["selector"] == objects[("StatefulSet", "edgespec-server")]["spec"]["selector"]["matchLabels"]
    (cluster,) = envoy["static_resources"]["clusters"]
    endpoint = cluster["load_assignment"]["endpoints"][0]["lb_endpoints"][0]["endpoint"]
    assert endpoint["address"]["socket_address"]["address"] == "edgespec-server.edgespec.svc.cluster.local"
    assert endpoint["address"]["socket_address"]["port_value"] == 50051
    assert endpoint["health_check_config"]["port_value"] == 8080
    assert cluster["type"] == "STRICT_DNS"


def test_envoy_hashes_sessions_on_the_session_header(envoy):
    (listener,) = envoy["static_resources"]["listeners"]
    hcm = listener["filter_chains"][0]["filters"][0]["typed_config"]
    assert hcm["codec_type"] == "HTTP2"
    routes = hcm["route_config"]["virtual_hosts"][0]["routes"]
    for route in routes:
        action = route["route"]
        assert action["cluster"] == "edgespec_verifiers"
        assert {"header": {"header_name": SESSION_HEADER}, "terminal": True} in action["hash_policy"]
        assert action["timeout"] == "0s", "a per-route deadline would cut long session streams"
    assert routes[0]["match"]["prefix"] == "/edgespec.v1.Verifier/"
    (cluster,) = envoy["static_resources"]["clusters"]
    assert cluster["lb_policy"] in ("RING_HASH", "MAGLEV")
    options = cluster["typed_extension_protocol_options"]["envoy.extensions.upstreams.http.v3.HttpProtocolOptions"]
    assert "http2_protocol_options" in options["explicit_http_config"], "gRPC upstreams need HTTP/2"
    (check,) = cluster["health_checks"]
    assert check["http_health_check"]["path"] == "/health"


def test_envoy_validates_when_envoy_is_installed(deploy_dir):
    envoy_bin = shutil.which("envoy")
    if envoy_bin is None:
        pytest.skip("envoy is not installed (no Debian or PyPI package ships it); "
                    "the structure is checked by test_envoy_hashes_sessions_on_the_session_header")
    proc = subprocess.run([envoy_bin, "--mode", "validate", "-c", str(deploy_dir / "k8s/envoy.yaml")],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_proxy_mounts_the_generated_envoy_config(k8s):
    kustomization, objects = k8s
    generated = {g["name"]: g["files"] for g in kustomization["configMapGenerator"]}
    assert generated["envoy-config"] == ["envoy.yaml"]
    pod = objects[("Deployment", "edgespec-proxy")]["spec"]["template"]["spec"]
    (envoy_container,) = pod["containers"]
    assert "/etc/envoy/envoy.yaml" in envoy_container["args"]
    assert {"name": "config", "configMap": {"name": "envoy-config"}} in pod["volumes"]
    assert objects[("Deployment", "edgespec-proxy")]["spec"]["replicas"] >= 2


def test_client_goes_through_the_proxy(k8s):
    _, objects = k8s
    pod = objects[("Deployment", "edgespec-client")]["spec"]["template"]["spec"]
    (client,) = pod["containers"]
    env = {e["name"]: e.get("value") for e in client["env"]}
    svc = objects[("Service", "edgespec-verifier")]
    assert env["EDGESPEC_SERVER"] == f"{svc['metadata']['name']}.edgespec.svc.cluster.local:{svc['spec']['ports'][0]['port']}"
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        assert client[probe]["httpGet"] == {"path": "/health", "port": "http"}, probe


def test_prometheus_scrapes_metrics_ports(deploy_dir, k8s):
    _, objects = k8s
    cluster_cfg = yaml.safe_load((deploy_dir / "k8s/prometheus.yml").read_text())
    (job,) = cluster_cfg["scrape_configs"]
    assert job["metrics_path"] == "/metrics"
    assert job["kubernetes_sd_configs"][0]["role"] == "pod"
    port_rule = next(r for r in job["relabel_configs"] if r["source_labels"] == ["__meta_kubernetes_pod_container_port_name"])
    (server,) = _server_pod(objects)["containers"]
    assert port_rule["regex"] in {p["name"] for p in server["ports"]}
    plain = yaml.safe_load((deploy_dir / "prometheus/prometheus.yml").read_text())
    assert {j["job_name"] for j in plain["scrape_configs"]} == {"edgespec-server", "edgespec-client"}


def test_kustomize_builds_and_wires_the_generated_config(deploy_dir):
    """kubectl's kustomize (offline, no cluster) builds the set and points the proxy at the
    hashed name of the generated Envoy ConfigMap."""
    kubectl = shutil.which("kubectl")
    if kubectl is None:
        pytest.skip("kubectl is not installed; the manifests' structure is checked by the tests above")
    proc = subprocess.run([kubectl, "kustomize", str(deploy_dir / "k8s")], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    built = {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(proc.stdout) if d}
    envoy_maps = [name for kind, name in built if kind == "ConfigMap" and name.startswith("envoy-config-")]
    assert len(envoy_maps) == 1, sorted(built)
    proxy = built[("Deployment", "edgespec-proxy")]["spec"]["template"]["spec"]
    assert proxy["volumes"][0]["configMap"]["name"] == envoy_maps[0]
    config = yaml.safe_load(built[("ConfigMap", envoy_maps[0])]["data"]["envoy.yaml"])
    assert config == yaml.safe_load((deploy_dir / "k8s/envoy.yaml").read_text())
    server = built[("StatefulSet", "edgespec-server")]["spec"]["template"]["spec"]
    assert server["containers"][0]["image"] == "edgespec-server:server-cuda"
    assert all(obj["metadata"].get("namespace", "edgespec") == "edgespec" for obj in built.values())
