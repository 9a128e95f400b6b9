"""Static checks of the Kubernetes examples in ``examples/kubernetes/``.

No cluster: every manifest is parsed, and every built-in object in it (the pod templates inside
the PyTorchJob and the JobSet, the Collector's ConfigMap, Deployment and Service, ...) is loaded
into the Kubernetes Python client's models. The client ignores keys it does not know, so each
key is first checked, recursively, against the model's ``attribute_map``: a typo fails here
instead of being dropped by the API server. Then what a user relies on: every ``torchrun``
container turns the bridge on through ``PET_EVENT_LOG_HANDLER``, sends OTLP to the Collector
Service of the same directory, and names its pod with OpenTelemetry's ``k8s.*`` resource
attributes taken from the downward API.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml
from kubernetes import client as k8s
from opentelemetry.sdk.resources import OTELResourceDetector
from opentelemetry.semconv._incubating.attributes import k8s_attributes as K8S

from elastic_otel.names import environment_variables as env
from tests.unit.test_collector_config import (
    COLLECTOR_IMAGE,
    FORBIDDEN_EXPORTERS,
    component_type,
    pipeline_errors,
    unknown_components,
)

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples" / "kubernetes"
MANIFESTS = sorted(EXAMPLES.glob("*.yaml"))
TRACE_MODEL = ROOT / "docs" / "trace-model.md"

# (apiVersion, kind) -> the client's model of the whole object.
BUILTIN_KINDS = {
    ("v1", "Namespace"): "V1Namespace",
    ("v1", "ConfigMap"): "V1ConfigMap",
    ("v1", "Service"): "V1Service",
    ("v1", "ServiceAccount"): "V1ServiceAccount",
    ("apps/v1", "Deployment"): "V1Deployment",
    ("apps/v1", "DaemonSet"): "V1DaemonSet",
    ("rbac.authorization.k8s.io/v1", "ClusterRole"): "V1ClusterRole",
    ("rbac.authorization.k8s.io/v1", "ClusterRoleBinding"): "V1ClusterRoleBinding",
    ("rbac.authorization.k8s.io/v1", "Role"): "V1Role",
    ("rbac.authorization.k8s.io/v1", "RoleBinding"): "V1RoleBinding",
}
PYTORCHJOB = ("kubeflow.org/v1", "PyTorchJob")
JOBSET = ("jobset.x-k8s.io/v1alpha2", "JobSet")

# The custom resources' own fields (the client has no model of them), from the operators'
# Go types: kubeflow/training-operator pkg/apis/kubeflow.org/v1 (PyTorchJobSpec,
# ElasticPolicy, ReplicaSpec, RunPolicy) and kubernetes-sigs/jobset api/jobset/v1alpha2.
PYTORCHJOB_FIELDS = {
    "spec": {"elasticPolicy", "pytorchReplicaSpecs", "runPolicy", "nprocPerNode"},
    "elasticPolicy": {
        "minReplicas",
        "maxReplicas",
        "rdzvBackend",
        "rdzvPort",
        "rdzvHost",
        "rdzvId",
        "rdzvConf",
        "standalone",
        "nProcPerNode",
        "maxRestarts",
        "metrics",
    },
    "runPolicy": {
        "cleanPodPolicy",
        "ttlSecondsAfterFinished",
        "activeDeadlineSeconds",
        "backoffLimit",
        "schedulingPolicy",
        "suspend",
        "managedBy",
    },
    "replicaSpec": {"replicas", "template", "restartPolicy"},
}
PYTORCHJOB_REPLICA_TYPES = {"Master", "Worker"}
JOBSET_FIELDS = {
    "spec": {
        "replicatedJobs",
        "network",
        "successPolicy",
        "failurePolicy",
        "startupPolicy",
        "suspend",
        "coordinator",
        "managedBy",
        "ttlSecondsAfterFinished",
        "volumeClaimPolicies",
    },
    "replicatedJob": {"name", "groupName", "template", "replicas", "dependsOn"},
    "failurePolicy": {"maxRestarts", "restartStrategy", "rules"},
}
OBJECT_FIELDS = {"apiVersion", "kind", "metadata", "spec"}

# What the training-operator derives from elasticPolicy and sets on each container itself
# (pkg/controller.v1/pytorch/elastic.go); the container must not set them a second time.
OPERATOR_SET = {"PET_RDZV_ENDPOINT", "PET_RDZV_BACKEND", "PET_NNODES", "PET_MAX_RESTARTS"}
# The container and port the operator reads PET_RDZV_ENDPOINT's port from.
PYTORCHJOB_CONTAINER, PYTORCHJOB_PORT = "pytorch", "pytorchjob-port"

# The pod's identity: semantic-convention key -> the downward-API field it must come from.
IDENTITY = {
    K8S.K8S_POD_NAME: "metadata.name",
    K8S.K8S_POD_UID: "metadata.uid",
    K8S.K8S_NAMESPACE_NAME: "metadata.namespace",
    K8S.K8S_NODE_NAME: "spec.nodeName",
}
POD_LABEL_PREFIX = K8S.K8S_POD_LABEL_TEMPLATE + "."
LABEL_FIELD = re.compile(r"^metadata\.labels\['([^']+)'\]$")
REFERENCE = re.compile(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)")


# --------------------------------------------------------------------------- loading


def unknown_fields(data: Any, type_name: str, where: str) -> list[str]:
    """Keys in ``data`` that the client's model ``type_name`` (recursively) has no field for."""
    inner = re.fullmatch(r"(?:List|list)\[(.+)\]", type_name)
    if inner:
        if not isinstance(data, list):
            return [f"{where}: a list expected"]
        return [
            error
            for i, item in enumerate(data)
            for error in unknown_fields(item, inner.group(1), f"{where}[{i}]")
        ]
    inner = re.fullmatch(r"Dict\[str, (.+)\]|dict\(str, (.+)\)", type_name)
    if inner:
        if not isinstance(data, dict):
            return [f"{where}: a mapping expected"]
        value_type = inner.group(1) or inner.group(2)
        return [
            error
            for key, value in data.items()
            for error in unknown_fields(value, value_type, f"{where}.{key}")
        ]
    model = getattr(k8s, type_name, None)
    if model is None or not hasattr(model, "attribute_map"):
        return []  # str, int, bool, object (IntOrString, Quantity), datetime
    if not isinstance(data, dict):
        return [f"{where}: a mapping expected for {type_name}"]
    attribute = {key: name for name, key in model.attribute_map.items()}
    errors = []
    for key, value in data.items():
        if key not in attribute:
            errors.append(f"{where}.{key}: no such field in {type_name}")
        else:
            errors += unknown_fields(value, model.openapi_types[attribute[key]], f"{where}.{key}")
    return errors


def load_model(data: dict, type_name: str, where: str) -> Any:
    """``data`` as the client's model ``type_name``, failing on a key the model lacks."""
    assert unknown_fields(data, type_name, where) == []
    obj = k8s.ApiClient().deserialize(json.dumps(data), type_name, "application/json")
    assert type(obj).__name__ == type_name, where
    return obj


def documents() -> Iterator[tuple[str, dict]]:
    for path in MANIFESTS:
        with path.open(encoding="utf-8") as fh:
            for i, doc in enumerate(yaml.safe_load_all(fh)):
                if doc is not None:
                    yield f"{path.name}#{i}", doc


DOCS = list(documents())


def kind_of(doc: dict) -> tuple[str, str]:
    return doc.get("apiVersion", ""), doc.get("kind", "")


def of_kind(*kinds: tuple[str, str]) -> list[tuple[str, dict]]:
    return [(where, doc) for where, doc in DOCS if kind_of(doc) in kinds]


def pod_templates_of(where: str, doc: dict) -> Iterator[tuple[str, dict]]:
    """(where, pod template) of a workload, custom resources included."""
    kind = kind_of(doc)
    if kind in {("apps/v1", "Deployment"), ("apps/v1", "DaemonSet")}:
        yield where, doc["spec"]["template"]
    elif kind == PYTORCHJOB:
        for rtype, spec in doc["spec"]["pytorchReplicaSpecs"].items():
            yield f"{where}.{rtype}", spec["template"]
    elif kind == JOBSET:
        for job in doc["spec"]["replicatedJobs"]:
            yield f"{where}.{job['name']}", job["template"]["spec"]["template"]


def torchrun_containers() -> list[tuple[str, dict, dict]]:
    """(where, containing document, container) of every container that runs torchrun."""
    found = []
    for where, doc in DOCS:
        for template_where, template in pod_templates_of(where, doc):
            for container in template["spec"]["containers"]:
                if (container.get("command") or [""])[0] == "torchrun":
                    found.append((f"{template_where}.{container['name']}", doc, container))
    return found


def env_list(container: dict) -> list[dict]:
    return list(container.get("env") or [])


def env_values(container: dict) -> dict[str, dict]:
    return {var["name"]: var for var in env_list(container)}


def field_path(var: dict) -> str | None:
    return ((var.get("valueFrom") or {}).get("fieldRef") or {}).get("fieldPath")


def resource_pairs(value: str) -> dict[str, str]:
    return dict(pair.split("=", 1) for pair in value.split(","))


# --------------------------------------------------------------------------- inventory

TORCHRUN = torchrun_containers()


def test_inventory() -> None:
    names = {p.name for p in MANIFESTS}
    assert {"collector.yaml", "pytorchjob.yaml", "jobset.yaml"} <= names
    assert of_kind(PYTORCHJOB) and of_kind(JOBSET)
    assert len(TORCHRUN) == 2
    readme = (EXAMPLES / "README.md").read_text(encoding="utf-8")
    for name in [*names, "Dockerfile"]:
        assert name in readme, f"examples/kubernetes/README.md does not mention {name}"


@pytest.mark.parametrize(("where", "doc"), DOCS, ids=[w for w, _ in DOCS])
def test_every_object_is_known_and_loads(where: str, doc: dict) -> None:
    kind = kind_of(doc)
    if kind in BUILTIN_KINDS:
        load_model(doc, BUILTIN_KINDS[kind], where)
        return
    assert kind in {PYTORCHJOB, JOBSET}, f"{where}: no check for {kind}"
    assert set(doc) <= OBJECT_FIELDS, where
    load_model(doc["metadata"], "V1ObjectMeta", f"{where}.metadata")
    spec = doc["spec"]
    if kind == PYTORCHJOB:
        assert set(spec) <= PYTORCHJOB_FIELDS["spec"]
        for section in ("elasticPolicy", "runPolicy"):
            assert set(spec.get(section) or {}) <= PYTORCHJOB_FIELDS[section], section
        assert set(spec["pytorchReplicaSpecs"]) <= PYTORCHJOB_REPLICA_TYPES
        for rtype, replica in spec["pytorchReplicaSpecs"].items():
            assert set(replica) <= PYTORCHJOB_FIELDS["replicaSpec"], rtype
            load_model(replica["template"], "V1PodTemplateSpec", f"{where}.{rtype}.template")
    else:
        assert set(spec) <= JOBSET_FIELDS["spec"]
        assert set(spec.get("failurePolicy") or {}) <= JOBSET_FIELDS["failurePolicy"]
        for job in spec["replicatedJobs"]:
            assert set(job) <= JOBSET_FIELDS["replicatedJob"], job["name"]
            load_model(job["template"], "V1JobTemplateSpec", f"{where}.{job['name']}.template")


def test_unknown_field_check_says_no() -> None:
    """The client drops unknown keys silently; the recursive check does not."""
    template = {
        "metadata": {"labels": {"a": "b"}},
        "spec": {"containers": [{"name": "c", "image": "i:1.0.0", "envv": []}]},
    }
    assert k8s.ApiClient().deserialize(json.dumps(template), "V1PodTemplateSpec", None)
    assert unknown_fields(template, "V1PodTemplateSpec", "t") == [
        "t.spec.containers[0].envv: no such field in V1Container"
    ]
    fine = {"spec": {"containers": [{"name": "c", "env": [{"name": "X", "value": "1"}]}]}}
    assert unknown_fields(fine, "V1PodTemplateSpec", "t") == []
    typo = {"data": {"k": "v"}, "metadata": {"labelz": {}}}
    assert unknown_fields(typo, "V1ConfigMap", "c") == [
        "c.metadata.labelz: no such field in V1ObjectMeta"
    ]


# --------------------------------------------------------------------------- torchrun pods

IDS = [where for where, _, _ in TORCHRUN]


def torchrun_options() -> set[str]:
    """Every PET_* variable torchrun reads (an option it is not given on its command line)."""
    from torch.distributed.argparse_util import check_env
    from torch.distributed.argparse_util import env as env_action
    from torch.distributed.run import get_args_parser

    return {
        f"PET_{action.dest.upper()}"
        for action in get_args_parser()._actions
        if isinstance(action, (env_action, check_env))
    }


@pytest.mark.parametrize(("where", "doc", "container"), TORCHRUN, ids=IDS)
class TestTorchrunContainer:
    def test_bridge_on_through_the_environment_alone(
        self, where: str, doc: dict, container: dict
    ) -> None:
        variables = env_values(container)
        assert variables["PET_EVENT_LOG_HANDLER"]["value"] == "otel"
        command = [*container["command"], *(container.get("args") or [])]
        # An option on the command line would override its PET_ variable.
        assert not [arg for arg in command if arg.startswith("--")], command
        pet = {name for name in variables if name.startswith("PET_")}
        assert pet <= torchrun_options(), pet - torchrun_options()

    def test_references_are_defined_earlier(self, where: str, doc: dict, container: dict) -> None:
        """Kubernetes expands ``$(VAR)`` only for a VAR defined earlier in the same list."""
        defined: set[str] = set()
        for var in env_list(container):
            for name in REFERENCE.findall(var.get("value", "")):
                assert name in defined, f"{var['name']} uses $({name}) before it is defined"
            defined.add(var["name"])

    def test_exports_to_the_collector_service(self, where: str, doc: dict, container: dict) -> None:
        url = urlsplit(env_values(container)["OTEL_EXPORTER_OTLP_ENDPOINT"]["value"])
        protocol = env_values(container).get("OTEL_EXPORTER_OTLP_PROTOCOL", {}).get("value")
        assert protocol in (None, "grpc")
        assert url.scheme == "http" and url.hostname and url.port
        service_name, namespace, *rest = url.hostname.split(".")
        assert rest in ([], ["svc"], ["svc", "cluster", "local"]), url.hostname
        assert collector_receiver_port(service_name, namespace, url.port, "grpc")

    def test_identity_from_the_downward_api(
        self, where: str, doc: dict, container: dict, monkeypatch: pytest.MonkeyPatch
    ) -> None:
        variables = env_values(container)
        pairs = resource_pairs(variables["OTEL_RESOURCE_ATTRIBUTES"]["value"])
        sample: dict[str, str] = {}
        for key, value in pairs.items():
            reference = re.fullmatch(r"\$\(([A-Za-z_][A-Za-z0-9_]*)\)", value)
            if key == K8S.K8S_CONTAINER_NAME:
                assert value == container["name"]
                continue
            assert reference, f"{key}={value}: not from a variable"
            path = field_path(variables[reference.group(1)])
            if key in IDENTITY:
                assert path == IDENTITY[key], key
            elif key.startswith(POD_LABEL_PREFIX):
                label = LABEL_FIELD.match(path or "")
                assert label and label.group(1) == key[len(POD_LABEL_PREFIX) :], key
            elif key == K8S.K8S_JOB_NAME:
                assert path == "metadata.labels['batch.kubernetes.io/job-name']"
            else:
                raise AssertionError(f"{key}: not a k8s.* key this example means to set")
            sample[reference.group(1)] = f"value-of-{reference.group(1).lower()}"
        assert set(IDENTITY) <= set(pairs)
        assert any(k.startswith(POD_LABEL_PREFIX) for k in pairs), "the job's name"
        # What the SDK makes of it once the kubelet has expanded the references.
        expanded = REFERENCE.sub(
            lambda m: sample[m.group(1)], variables["OTEL_RESOURCE_ATTRIBUTES"]["value"]
        )
        monkeypatch.setenv("OTEL_RESOURCE_ATTRIBUTES", expanded)
        attributes = dict(OTELResourceDetector().detect().attributes)
        assert attributes == {
            key: sample[value[2:-1]] if value.startswith("$(") else value
            for key, value in pairs.items()
        }

    def test_job_id_from_a_label_the_docs_name(
        self, where: str, doc: dict, container: dict
    ) -> None:
        variables = env_values(container)
        trace_model = TRACE_MODEL.read_text(encoding="utf-8")
        salt = [env.ELASTIC_OTEL_JOB_ID]
        if kind_of(doc) == JOBSET:
            salt.append(env.ELASTIC_OTEL_JOB_ATTEMPT)
        for name in salt:
            path = field_path(variables[name])
            assert path and LABEL_FIELD.match(path), name
            assert f'fieldPath: "{path}"' in trace_model, f"docs/trace-model.md: {name}"
        if kind_of(doc) == JOBSET:
            assert field_path(variables[env.ELASTIC_OTEL_JOB_ID]) == (
                "metadata.labels['jobset.sigs.k8s.io/jobset-name']"
            )
            assert field_path(variables[env.ELASTIC_OTEL_JOB_ATTEMPT]) == (
                "metadata.labels['jobset.sigs.k8s.io/restart-attempt']"
            )
        else:
            assert field_path(variables[env.ELASTIC_OTEL_JOB_ID]) == (
                "metadata.labels['training.kubeflow.org/job-name']"
            )


@pytest.mark.parametrize(
    ("where", "doc"), of_kind(PYTORCHJOB), ids=[w for w, _ in of_kind(PYTORCHJOB)]
)
def test_pytorchjob_leaves_the_rendezvous_to_the_operator(where: str, doc: dict) -> None:
    spec = doc["spec"]
    assert spec["elasticPolicy"]["rdzvBackend"] == "c10d"
    assert "Master" not in spec["pytorchReplicaSpecs"], "elastic: workers only"
    worker = spec["pytorchReplicaSpecs"]["Worker"]
    policy = spec["elasticPolicy"]
    assert policy["minReplicas"] <= worker["replicas"] <= policy["maxReplicas"]
    [container] = [
        c for c in worker["template"]["spec"]["containers"] if c["name"] == PYTORCHJOB_CONTAINER
    ]
    assert PYTORCHJOB_PORT in {port["name"] for port in container["ports"]}
    operator_set = OPERATOR_SET | ({"PET_RDZV_ID"} if "rdzvId" in policy else set())
    assert not operator_set & set(env_values(container))


@pytest.mark.parametrize(("where", "doc"), of_kind(JOBSET), ids=[w for w, _ in of_kind(JOBSET)])
def test_jobset_rendezvous_on_its_first_pod(where: str, doc: dict) -> None:
    [job] = doc["spec"]["replicatedJobs"]
    job_spec = job["template"]["spec"]
    [container] = job_spec["template"]["spec"]["containers"]
    variables = env_values(container)
    nodes = job["replicas"] * job_spec["parallelism"]
    assert job_spec["completionMode"] == "Indexed" and job_spec["completions"] == nodes
    assert variables["PET_NNODES"]["value"] == str(nodes)
    name = "$(ELASTIC_OTEL_JOB_ID)"  # the JobSet's name, which is its pods' subdomain
    host, port = variables["PET_RDZV_ENDPOINT"]["value"].rsplit(":", 1)
    assert host == f"{name}-{job['name']}-0-0.{name}"
    assert int(port) in {p["containerPort"] for p in container["ports"]}
    assert doc["spec"]["failurePolicy"]["maxRestarts"] >= 1


# --------------------------------------------------------------------------- collector


def collector_receiver_port(service_name: str, namespace: str, port: int, protocol: str) -> int:
    """The port the Collector's otlp receiver listens on behind ``service_name:port``,
    followed from the Service through its selected pods to their ConfigMap."""
    [service] = [
        doc
        for _, doc in of_kind(("v1", "Service"))
        if (doc["metadata"]["name"], doc["metadata"].get("namespace")) == (service_name, namespace)
    ]
    [service_port] = [p for p in service["spec"]["ports"] if p["port"] == port]
    selector = service["spec"]["selector"]
    workloads = [
        doc
        for _, doc in of_kind(("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"))
        if doc["metadata"].get("namespace") == namespace
        and selector.items() <= doc["spec"]["template"]["metadata"]["labels"].items()
    ]
    assert workloads, f"Service {service_name} selects no workload"
    for workload in workloads:
        config, container = collector_config(workload)
        target = service_port.get("targetPort", port)
        [container_port] = [
            p["containerPort"]
            for p in container["ports"]
            if target in (p.get("name"), p["containerPort"])
        ]
        endpoint = config["receivers"]["otlp"]["protocols"][protocol]["endpoint"]
        assert endpoint == f"0.0.0.0:{container_port}", endpoint
    return container_port


def collector_config(workload: dict) -> tuple[dict, dict]:
    """The collector config a workload's pods run (from the ConfigMap they mount), and the
    collector container."""
    pod = workload["spec"]["template"]["spec"]
    [container] = [c for c in pod["containers"] if c["image"].startswith("otel/")]
    [flag] = [a for a in container.get("args") or [] if a.startswith("--config=")]
    path = Path(flag.split("=", 1)[1])
    [mount] = [m for m in container["volumeMounts"] if Path(m["mountPath"]) == path.parent]
    [volume] = [v for v in pod["volumes"] if v["name"] == mount["name"]]
    namespace = workload["metadata"].get("namespace")
    [config_map] = [
        doc
        for _, doc in of_kind(("v1", "ConfigMap"))
        if (doc["metadata"]["name"], doc["metadata"].get("namespace"))
        == (volume["configMap"]["name"], namespace)
    ]
    return yaml.safe_load(config_map["data"][path.name]), container


COLLECTORS = of_kind(("apps/v1", "Deployment"), ("apps/v1", "DaemonSet"))


@pytest.mark.parametrize(("where", "workload"), COLLECTORS, ids=[w for w, _ in COLLECTORS])
def test_collector_config_as_collector_config_dir(where: str, workload: dict) -> None:
    """The checks tests/unit/test_collector_config.py makes of collector-config/."""
    config, container = collector_config(workload)
    assert container["image"] == COLLECTOR_IMAGE
    assert pipeline_errors(config) == []
    assert unknown_components(config) == []
    assert not {component_type(e) for e in config["exporters"]} & FORBIDDEN_EXPORTERS
    for name, pipeline in config["service"]["pipelines"].items():
        processors = [component_type(p) for p in pipeline["processors"]]
        assert processors[0] == "memory_limiter" and processors[-1] == "batch", name
    # memory_limiter's percentages are of the container's limit: there must be one.
    assert container["resources"]["limits"]["memory"]
    assert config["receivers"]["otlp"]["protocols"]["http"]["endpoint"] == "0.0.0.0:4318"
