"""Static checks of the collector configs, the compose examples and Grafana provisioning.

Fast and offline: nothing here starts docker or opens a socket. The checks parse the
files under collector-config/ and examples/compose/ and cross-check them against each
other (pipelines vs. defined components, exporter endpoints vs. compose services,
Grafana data source uids vs. the references to them).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from urllib.parse import urlsplit

import pytest
import yaml

from elastic_otel.names import attributes as A

ROOT = Path(__file__).resolve().parents[2]
COLLECTOR_DIR = ROOT / "collector-config"
COMPOSE_DIR = ROOT / "examples" / "compose"
GRAFANA_DIR = COMPOSE_DIR / "grafana"
DATASOURCES_FILE = GRAFANA_DIR / "provisioning" / "datasources" / "datasources.yaml"
DASHBOARD_PROVIDER_FILE = GRAFANA_DIR / "provisioning" / "dashboards" / "dashboards.yaml"
DASHBOARD_FILE = GRAFANA_DIR / "dashboards" / "torchelastic-rendezvous.json"

# The contrib release every compose file runs; ALLOWED_COMPONENTS was checked against
# its build manifest (opentelemetry-collector-releases,
# distributions/otelcol-contrib/manifest.yaml, modules at v0.136.0).
CONTRIB_VERSION = "0.136.0"
COLLECTOR_IMAGE_REPO = "otel/opentelemetry-collector-contrib"
COLLECTOR_IMAGE = f"{COLLECTOR_IMAGE_REPO}:{CONTRIB_VERSION}"

# Config type names (the part of a component id before "/") shipped by otelcol-contrib
# 0.136.0. A subset: what these configs use plus common neighbours. In 0.144.0 `otlp`
# and `otlphttp` became deprecated aliases of `otlp_grpc` / `otlp_http`; revisit this
# list when bumping CONTRIB_VERSION.
ALLOWED_COMPONENTS: dict[str, frozenset[str]] = {
    "receivers": frozenset(
        {"otlp", "nop", "filelog", "hostmetrics", "prometheus", "jaeger", "zipkin", "journald"}
    ),
    "processors": frozenset(
        {
            "batch",
            "memory_limiter",
            "attributes",
            "resource",
            "resourcedetection",
            "filter",
            "transform",
            "tail_sampling",
            "groupbytrace",
            "probabilistic_sampler",
            "k8sattributes",
            "span",
            "cumulativetodelta",
            "deltatocumulative",
        }
    ),
    "exporters": frozenset(
        {
            "otlp",
            "otlphttp",
            "debug",
            "nop",
            "loadbalancing",
            "prometheus",
            "prometheusremotewrite",
            "file",
            "kafka",
            "zipkin",
        }
    ),
    "extensions": frozenset(
        {
            "health_check",
            "pprof",
            "zpages",
            "file_storage",
            "basicauth",
            "bearertokenauth",
            "headers_setter",
            "oauth2client",
        }
    ),
    "connectors": frozenset({"forward", "spanmetrics", "servicegraph", "count", "routing"}),
}

# Removed from the collector or replaced: `logging` -> `debug` (removed in v0.111),
# `loki` exporter -> Loki's native OTLP endpoint, `jaeger` exporter -> OTLP.
FORBIDDEN_EXPORTERS = frozenset({"logging", "loki", "jaeger", "jaeger_thrift"})

COMPONENT_KINDS = ("receivers", "processors", "exporters", "extensions", "connectors")
PIPELINE_SIGNALS = frozenset({"traces", "logs", "metrics", "profiles"})
# Exporters whose `endpoint` is a host:port or URL of another service.
ENDPOINT_EXPORTERS = frozenset({"otlp", "otlphttp", "prometheusremotewrite", "zipkin"})

# Image reference pinned to an exact release: repo:1.2.3 / repo:v1.2.3 (+ optional
# -suffix and @sha256 digest). Rejects `latest`, `2`, `2.8`, `main`, no tag at all.
PINNED_IMAGE = re.compile(
    r"^[a-z0-9][\w./-]*:v?\d+\.\d+\.\d+(?:-[\w.]+)?(?:@sha256:[0-9a-f]{64})?$"
)


# --------------------------------------------------------------------------- helpers


def load_yaml(path: Path):
    with path.open(encoding="utf-8") as fh:
        return yaml.safe_load(fh)


def component_type(component_id: str) -> str:
    return component_id.split("/", 1)[0]


def pipeline_errors(config: dict) -> list[str]:
    """Problems with the `service` section of a collector config (empty list = fine)."""
    errors: list[str] = []
    defined = {kind: set((config.get(kind) or {}).keys()) for kind in COMPONENT_KINDS}
    service = config.get("service") or {}
    pipelines = service.get("pipelines") or {}
    if not pipelines:
        errors.append("service.pipelines is empty")
    for ext in service.get("extensions") or []:
        if ext not in defined["extensions"]:
            errors.append(f"service.extensions: {ext!r} is not defined under extensions")
    used: dict[str, set[str]] = {kind: set() for kind in COMPONENT_KINDS}
    used["extensions"].update(service.get("extensions") or [])
    for name, pipeline in pipelines.items():
        if component_type(name) not in PIPELINE_SIGNALS:
            errors.append(f"pipeline {name!r}: unknown signal")
        pipeline = pipeline or {}
        for section in ("receivers", "processors", "exporters"):
            refs = pipeline.get(section) or []
            if section != "processors" and not refs:
                errors.append(f"pipeline {name!r}: no {section}")
            for ref in refs:
                # A connector is the exporter of one pipeline and the receiver of another.
                if ref in defined[section]:
                    used[section].add(ref)
                elif section != "processors" and ref in defined["connectors"]:
                    used["connectors"].add(ref)
                else:
                    errors.append(f"pipeline {name!r}: {section[:-1]} {ref!r} is not defined")
    for kind in COMPONENT_KINDS:
        for unused in sorted(defined[kind] - used[kind]):
            errors.append(f"{kind[:-1]} {unused!r} is defined but used by no pipeline")
    return errors


def unknown_components(config: dict) -> list[str]:
    """Component ids whose type is not in the pinned contrib release's allow-list."""
    bad = []
    for kind in COMPONENT_KINDS:
        for component_id in config.get(kind) or {}:
            if component_type(component_id) not in ALLOWED_COMPONENTS[kind]:
                bad.append(f"{kind}.{component_id}")
    return bad


def split_host_port(endpoint: str, default_port: int | None = None) -> tuple[str, int]:
    """'host:port' or 'scheme://host[:port]/path' -> (host, port)."""
    if "://" in endpoint:
        parts = urlsplit(endpoint)
        port = parts.port or {"http": 80, "https": 443}.get(parts.scheme, default_port)
        assert parts.hostname and port, f"cannot parse endpoint {endpoint!r}"
        return parts.hostname, int(port)
    host, sep, port = endpoint.rpartition(":")
    if not sep:
        assert default_port is not None, f"endpoint {endpoint!r} has no port"
        return endpoint, default_port
    return host, int(port)


def exporter_targets(config: dict) -> list[tuple[str, str, int]]:
    """(exporter id, host, port) for every network destination of a used exporter."""
    used = {
        ref
        for pipeline in (config.get("service") or {}).get("pipelines", {}).values()
        for ref in (pipeline or {}).get("exporters") or []
    }
    targets = []
    for exporter_id, cfg in (config.get("exporters") or {}).items():
        if exporter_id not in used:
            continue
        cfg = cfg or {}
        kind = component_type(exporter_id)
        if kind in ENDPOINT_EXPORTERS:
            assert cfg.get("endpoint"), f"exporter {exporter_id} has no endpoint"
            targets.append((exporter_id, *split_host_port(cfg["endpoint"])))
        elif kind == "loadbalancing":
            resolver = cfg.get("resolver") or {}
            for hostname in (resolver.get("static") or {}).get("hostnames") or []:
                targets.append((exporter_id, *split_host_port(hostname, 4317)))
            if "dns" in resolver:
                dns = resolver["dns"]
                targets.append((exporter_id, dns["hostname"], int(dns.get("port", 4317))))
    return targets


def parse_port(entry) -> tuple[int | None, int]:
    """A compose `ports`/`expose` entry -> (published host port or None, container port)."""
    if isinstance(entry, int):
        return None, entry
    if isinstance(entry, dict):
        published = entry.get("published")
        return (int(published) if published is not None else None), int(entry["target"])
    text = str(entry).split("/", 1)[0]
    parts = text.split(":")
    if len(parts) == 1:
        return None, int(parts[0])
    return int(parts[-2]), int(parts[-1])


def service_ports(service: dict) -> tuple[set[int], set[int]]:
    """(published host ports, container ports) of a compose service."""
    published: set[int] = set()
    container: set[int] = set()
    for entry in service.get("ports") or []:
        host, target = parse_port(entry)
        container.add(target)
        if host is not None:
            published.add(host)
    for entry in service.get("expose") or []:
        container.add(parse_port(entry)[1])
    return published, container


def bind_mounts(service: dict) -> list[tuple[str, str]]:
    """(source, target) of bind mounts; named volumes are skipped."""
    mounts = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") == "bind":
                mounts.append((volume["source"], volume["target"]))
            continue
        source, _, rest = str(volume).partition(":")
        target = rest.split(":", 1)[0]
        if source.startswith((".", "/", "~")):
            mounts.append((source, target))
    return mounts


def named_volumes(service: dict) -> list[str]:
    names = []
    for volume in service.get("volumes") or []:
        if isinstance(volume, dict):
            if volume.get("type") == "volume":
                names.append(volume["source"])
            continue
        source, sep, _ = str(volume).partition(":")
        if sep and not source.startswith((".", "/", "~")):
            names.append(source)
    return names


def is_collector(service: dict) -> bool:
    return str(service.get("image", "")).startswith(COLLECTOR_IMAGE_REPO + ":")


def collector_config_of(compose_file: Path, service: dict) -> tuple[Path, str]:
    """The repo file mounted as a collector's config and the container path it lands at."""
    for source, target in bind_mounts(service):
        path = (compose_file.parent / source).resolve()
        if path.parent == COLLECTOR_DIR.resolve():
            return path, target
    raise AssertionError(f"{compose_file}: collector service mounts no collector-config/ file")


def config_flag(service: dict) -> str:
    command = service.get("command") or []
    if isinstance(command, str):
        command = command.split()
    for i, arg in enumerate(command):
        if arg.startswith("--config="):
            return arg.split("=", 1)[1]
        if arg == "--config" and i + 1 < len(command):
            return command[i + 1]
    return "/etc/otelcol-contrib/config.yaml"  # the contrib image's default


def find_key(node, key: str):
    """Every value stored under `key` anywhere in a nested dict/list structure."""
    if isinstance(node, dict):
        for k, v in node.items():
            if k == key:
                yield v
            yield from find_key(v, key)
    elif isinstance(node, list):
        for item in node:
            yield from find_key(item, key)


def all_panels(panels: list[dict]):
    for panel in panels:
        yield panel
        yield from all_panels(panel.get("panels") or [])


# --------------------------------------------------------------------------- inventory

COLLECTOR_CONFIGS = sorted(COLLECTOR_DIR.glob("*.yaml"))
COMPOSE_FILES = sorted(COMPOSE_DIR.glob("*/compose.yaml"))
ALL_YAML = sorted(
    p for d in (COLLECTOR_DIR, COMPOSE_DIR) for ext in ("*.yaml", "*.yml") for p in d.rglob(ext)
)


def _ids(paths):
    return [str(p.relative_to(ROOT)) for p in paths]


def test_inventory():
    names = {p.name for p in COLLECTOR_CONFIGS}
    assert {"jaeger.yaml", "grafana.yaml", "gateway-agent.yaml", "gateway-backend.yaml"} <= names
    compose_dirs = {p.parent.name for p in COMPOSE_FILES}
    assert {"jaeger", "grafana"} <= compose_dirs
    assert (COLLECTOR_DIR / "README.md").is_file()


def test_collector_readme_describes_every_config():
    readme = (COLLECTOR_DIR / "README.md").read_text(encoding="utf-8")
    for path in COLLECTOR_CONFIGS:
        assert path.name in readme, f"collector-config/README.md does not mention {path.name}"
    for port in ("4317", "4318"):
        assert port in readme


@pytest.mark.parametrize("path", ALL_YAML, ids=_ids(ALL_YAML))
def test_yaml_parses(path):
    data = load_yaml(path)
    assert isinstance(data, dict) and data, f"{path} is empty or not a mapping"


# --------------------------------------------------------------------------- collector


@pytest.mark.parametrize("path", COLLECTOR_CONFIGS, ids=_ids(COLLECTOR_CONFIGS))
class TestCollectorConfig:
    def test_pipelines_reference_defined_components(self, path):
        assert pipeline_errors(load_yaml(path)) == []

    def test_components_ship_in_pinned_contrib(self, path):
        assert unknown_components(load_yaml(path)) == []

    def test_no_deprecated_exporters(self, path):
        exporters = {component_type(e) for e in load_yaml(path).get("exporters") or {}}
        assert not exporters & FORBIDDEN_EXPORTERS

    def test_memory_limiter_first_batch_last(self, path):
        config = load_yaml(path)
        for name, pipeline in config["service"]["pipelines"].items():
            processors = [component_type(p) for p in pipeline.get("processors") or []]
            assert processors, f"{name}: no processors"
            assert processors[0] == "memory_limiter", f"{name}: memory_limiter must be first"
            assert processors[-1] == "batch", f"{name}: batch must be last"

    def test_memory_limiter_and_batch_settings(self, path):
        processors = load_yaml(path)["processors"]
        for pid, cfg in processors.items():
            if component_type(pid) == "memory_limiter":
                assert cfg["check_interval"]
                if "limit_percentage" in cfg:
                    assert 0 < cfg["spike_limit_percentage"] < cfg["limit_percentage"] <= 90
                else:
                    assert 0 < cfg["spike_limit_mib"] < cfg["limit_mib"]
            if component_type(pid) == "batch":
                cfg = cfg or {}
                size = cfg.get("send_batch_size", 8192)
                assert size <= cfg.get("send_batch_max_size", size)
                assert cfg.get("timeout"), "set an explicit batch timeout"

    def test_otlp_receiver_listens_on_all_interfaces(self, path):
        protocols = load_yaml(path)["receivers"]["otlp"]["protocols"]
        assert protocols["grpc"]["endpoint"] == "0.0.0.0:4317"
        assert protocols["http"]["endpoint"] == "0.0.0.0:4318"

    def test_every_used_exporter_has_a_destination_or_is_local(self, path):
        config = load_yaml(path)
        targets = {t[0] for t in exporter_targets(config)}
        used = {
            e for p in config["service"]["pipelines"].values() for e in p.get("exporters") or []
        }
        for exporter_id in used:
            if component_type(exporter_id) in {"debug", "nop", "file"}:
                continue
            assert exporter_id in targets, f"exporter {exporter_id} has no parsable endpoint"


def test_jaeger_config_routes_traces_to_jaeger_and_logs_to_debug():
    config = load_yaml(COLLECTOR_DIR / "jaeger.yaml")
    pipelines = config["service"]["pipelines"]
    (traces_exporter,) = pipelines["traces"]["exporters"]
    assert component_type(traces_exporter) == "otlp"
    exporter = config["exporters"][traces_exporter]
    assert exporter["endpoint"] == "jaeger:4317"
    assert exporter["tls"]["insecure"] is True
    assert pipelines["logs"]["exporters"] == ["debug"]


def test_grafana_config_routes_each_signal():
    config = load_yaml(COLLECTOR_DIR / "grafana.yaml")
    pipelines = config["service"]["pipelines"]
    exporters = config["exporters"]
    (traces,) = pipelines["traces"]["exporters"]
    (logs,) = pipelines["logs"]["exporters"]
    (metrics,) = pipelines["metrics"]["exporters"]
    assert component_type(traces) == "otlp" and exporters[traces]["endpoint"] == "tempo:4317"
    assert component_type(logs) == "otlphttp"
    assert exporters[logs]["endpoint"] == "http://loki:3100/otlp"
    assert component_type(metrics) in {"prometheusremotewrite", "prometheus"}


def test_gateway_agent_balances_by_trace_id():
    config = load_yaml(COLLECTOR_DIR / "gateway-agent.yaml")
    lb_ids = [e for e in config["exporters"] if component_type(e) == "loadbalancing"]
    assert lb_ids, "gateway-agent.yaml defines no loadbalancing exporter"
    pipelines = config["service"]["pipelines"]
    for lb_id in lb_ids:
        lb = config["exporters"][lb_id]
        assert lb["routing_key"] == "traceID"
        assert "otlp" in lb["protocol"]
        assert "endpoint" not in lb["protocol"]["otlp"], "the resolver sets the endpoint"
        resolver = lb["resolver"]
        hostnames = (resolver.get("static") or {}).get("hostnames") or []
        assert hostnames or (resolver.get("dns") or {}).get("hostname")
        assert len(hostnames) == len(set(hostnames))
    assert any(e in lb_ids for e in pipelines["traces"]["exporters"])
    # traceID routing is not valid for metrics.
    for name, pipeline in pipelines.items():
        if component_type(name) == "metrics":
            assert not set(pipeline["exporters"]) & set(lb_ids)
    text = (COLLECTOR_DIR / "gateway-agent.yaml").read_text(encoding="utf-8")
    assert "run_id" in text and "round" in text, "explain the trace-id derivation"


def test_gateway_backend_receives_what_the_agent_sends():
    agent = load_yaml(COLLECTOR_DIR / "gateway-agent.yaml")
    backend = load_yaml(COLLECTOR_DIR / "gateway-backend.yaml")
    grpc_port = split_host_port(backend["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"])[1]
    for exporter_id, _host, port in exporter_targets(agent):
        assert port == grpc_port, f"{exporter_id} sends to port {port}, backend listens {grpc_port}"
    backend_traces = backend["service"]["pipelines"]["traces"]["exporters"]
    hosts = {host for eid, host, _ in exporter_targets(backend) if eid in backend_traces}
    assert hosts & {"jaeger", "tempo"}, "backend must export traces to Jaeger or Tempo"


# --------------------------------------------------------------------------- compose


def _compose(path: Path) -> dict:
    data = load_yaml(path)
    assert data.get("services"), f"{path}: no services"
    return data


@pytest.mark.parametrize("path", COMPOSE_FILES, ids=_ids(COMPOSE_FILES))
class TestCompose:
    def test_images_pinned(self, path):
        for name, service in _compose(path)["services"].items():
            image = service.get("image")
            assert image, f"{name}: no image (build: is not allowed in examples)"
            assert "latest" not in image, f"{name}: {image} uses latest"
            assert PINNED_IMAGE.match(image), f"{name}: {image} is not pinned to an exact version"

    def test_collector_image_matches_allow_list_version(self, path):
        services = _compose(path)["services"]
        collectors = [s for s in services.values() if is_collector(s)]
        assert collectors, f"{path}: no collector service"
        for service in collectors:
            assert service["image"].split("@")[0] == COLLECTOR_IMAGE

    def test_mounted_files_exist_in_repo(self, path):
        data = _compose(path)
        declared_volumes = set((data.get("volumes") or {}).keys())
        for name, service in data["services"].items():
            for source, _target in bind_mounts(service):
                assert not source.startswith(("/", "~")), f"{name}: absolute mount {source}"
                resolved = (path.parent / source).resolve()
                assert resolved.exists(), f"{name}: mounted {source} does not exist"
                assert resolved.is_relative_to(ROOT), f"{name}: {source} is outside the repo"
            for volume in named_volumes(service):
                assert volume in declared_volumes, f"{name}: volume {volume} not declared"

    def test_collector_publishes_otlp_ports(self, path):
        for name, service in _compose(path)["services"].items():
            if not is_collector(service) or not service.get("ports"):
                continue
            published, _ = service_ports(service)
            assert {4317, 4318} <= published, f"{name} must publish 4317 and 4318"
        published_by_collectors = set().union(
            *(service_ports(s)[0] for s in _compose(path)["services"].values() if is_collector(s))
        )
        assert {4317, 4318} <= published_by_collectors

    def test_host_ports_unique(self, path):
        seen: dict[int, str] = {}
        for name, service in _compose(path)["services"].items():
            for port in service_ports(service)[0]:
                assert port not in seen, f"host port {port} published by {seen[port]} and {name}"
                seen[port] = name

    def test_collector_config_is_mounted_where_command_reads_it(self, path):
        for name, service in _compose(path)["services"].items():
            if is_collector(service):
                _config, target = collector_config_of(path, service)
                assert target == config_flag(service), f"{name}: --config does not match mount"

    def test_exporter_destinations_are_services_in_same_compose(self, path):
        services = _compose(path)["services"]
        checked = 0
        for name, service in services.items():
            if not is_collector(service):
                continue
            config_path, _ = collector_config_of(path, service)
            for exporter_id, host, port in exporter_targets(load_yaml(config_path)):
                assert host in services, (
                    f"{name} ({config_path.name}): {exporter_id} -> {host}:{port}, "
                    f"but {path.parent.name}/compose.yaml has no service {host!r}"
                )
                _, container_ports = service_ports(services[host])
                assert port in container_ports, (
                    f"{name}: {exporter_id} -> {host}:{port}, service {host} only declares "
                    f"{sorted(container_ports)}"
                )
                target = services[host]
                if is_collector(target):
                    target_config, _ = collector_config_of(path, target)
                    otlp = load_yaml(target_config)["receivers"]["otlp"]["protocols"]
                    listen = {split_host_port(p["endpoint"])[1] for p in otlp.values()}
                    assert port in listen, f"{host} does not listen on {port}"
                checked += 1
        assert checked, f"{path}: no exporter destination was checked"


def test_jaeger_compose_serves_ui():
    services = _compose(COMPOSE_DIR / "jaeger" / "compose.yaml")["services"]
    assert services["jaeger"]["image"].startswith("jaegertracing/")
    assert 16686 in service_ports(services["jaeger"])[0]


# --------------------------------------------------------------------------- grafana stack


def _grafana_services() -> dict:
    return _compose(GRAFANA_DIR / "compose.yaml")["services"]


def _config_mounted_in(service: dict, suffix: str) -> Path:
    for source, _target in bind_mounts(service):
        if source.endswith(suffix):
            return (GRAFANA_DIR / source).resolve()
    raise AssertionError(f"no mounted file ending in {suffix}")


def test_tempo_receives_otlp_and_remote_writes_span_metrics():
    services = _grafana_services()
    tempo_cfg = load_yaml(_config_mounted_in(services["tempo"], ".yaml"))
    grpc = tempo_cfg["distributor"]["receivers"]["otlp"]["protocols"]["grpc"]["endpoint"]
    assert split_host_port(grpc)[1] in service_ports(services["tempo"])[1]
    assert tempo_cfg["server"]["http_listen_port"] in service_ports(services["tempo"])[1]
    generator = tempo_cfg["metrics_generator"]
    assert "span-metrics" in tempo_cfg["overrides"]["defaults"]["metrics_generator"]["processors"]
    assert "host.name" in generator["processor"]["span_metrics"]["dimensions"]
    (remote_write,) = generator["storage"]["remote_write"]
    host, port = split_host_port(remote_write["url"])
    assert host in services and port in service_ports(services[host])[1]
    assert urlsplit(remote_write["url"]).path == "/api/v1/write"


def test_prometheus_accepts_remote_write():
    services = _grafana_services()
    command = services["prometheus"]["command"]
    assert "--web.enable-remote-write-receiver" in command
    prom_cfg = _config_mounted_in(services["prometheus"], "prometheus.yml")
    assert isinstance(load_yaml(prom_cfg)["scrape_configs"], list)


def test_loki_accepts_otlp_with_structured_metadata():
    services = _grafana_services()
    loki_cfg = load_yaml(_config_mounted_in(services["loki"], ".yaml"))
    assert loki_cfg["limits_config"]["allow_structured_metadata"] is True
    assert loki_cfg["server"]["http_listen_port"] in service_ports(services["loki"])[1]
    latest_schema = loki_cfg["schema_config"]["configs"][-1]
    assert latest_schema["store"] == "tsdb" and latest_schema["schema"] == "v13"
    image_version = services["loki"]["image"].split(":")[1]
    assert int(image_version.split(".")[0]) >= 3, "native OTLP ingestion needs Loki 3.x"


def test_grafana_published_and_provisioned():
    grafana = _grafana_services()["grafana"]
    assert 3000 in service_ports(grafana)[0]
    targets = {target: source for source, target in bind_mounts(grafana)}
    assert "/etc/grafana/provisioning/datasources" in targets
    assert "/etc/grafana/provisioning/dashboards" in targets
    provider_cfg = load_yaml(DASHBOARD_PROVIDER_FILE)
    (provider,) = provider_cfg["providers"]
    dash_dir = provider["options"]["path"]
    assert dash_dir in targets, "dashboard provider path is not a mounted directory"
    assert (GRAFANA_DIR / targets[dash_dir] / DASHBOARD_FILE.name).resolve() == (
        DASHBOARD_FILE.resolve()
    )


def _datasources() -> list[dict]:
    return load_yaml(DATASOURCES_FILE)["datasources"]


def _datasource_uids() -> dict[str, str]:
    uids = [ds["uid"] for ds in _datasources()]
    assert len(uids) == len(set(uids)), "duplicate datasource uid"
    return {ds["uid"]: ds["type"] for ds in _datasources()}


def test_datasources_urls_point_at_compose_services():
    services = _grafana_services()
    assert {ds["type"] for ds in _datasources()} >= {"tempo", "loki", "prometheus"}
    for ds in _datasources():
        host, port = split_host_port(ds["url"])
        assert host in services, f"{ds['name']}: no service {host}"
        assert port in service_ports(services[host])[1], f"{ds['name']}: port {port}"


def test_datasource_references_exist():
    uids = _datasource_uids()
    refs = list(find_key(_datasources(), "datasourceUid"))
    assert refs, "no cross-datasource links"
    for ref in refs:
        assert ref in uids, f"datasourceUid {ref!r} is not a provisioned datasource"


def test_tempo_links_to_loki_by_trace_id():
    uids = _datasource_uids()
    (tempo,) = [ds for ds in _datasources() if ds["type"] == "tempo"]
    t2l = tempo["jsonData"]["tracesToLogsV2"]
    assert uids[t2l["datasourceUid"]] == "loki"
    if t2l.get("customQuery"):
        assert "trace_id" in t2l["query"] and "traceId" in t2l["query"]
    else:
        assert t2l["filterByTraceID"] is True


def test_loki_derived_field_links_to_tempo():
    uids = _datasource_uids()
    (loki,) = [ds for ds in _datasources() if ds["type"] == "loki"]
    fields = loki["jsonData"]["derivedFields"]
    to_tempo = [f for f in fields if uids.get(f.get("datasourceUid")) == "tempo"]
    assert to_tempo, "no Loki derived field links to Tempo"
    assert any("trace_id" in f["matcherRegex"] for f in to_tempo)


def _dashboard() -> dict:
    return json.loads(DASHBOARD_FILE.read_text(encoding="utf-8"))


def test_dashboard_parses_and_is_titled():
    dashboard = _dashboard()
    assert dashboard["title"] == "torchelastic rendezvous"
    assert dashboard["uid"]
    ids = [p["id"] for p in all_panels(dashboard["panels"])]
    assert len(ids) == len(set(ids)), "duplicate panel ids"


def test_dashboard_datasources_exist():
    uids = _datasource_uids()
    panels = [p for p in all_panels(_dashboard()["panels"]) if p["type"] != "row"]
    assert panels
    for panel in panels:
        assert panel["datasource"]["uid"] in uids, f"panel {panel['title']!r}"
        assert uids[panel["datasource"]["uid"]] == panel["datasource"]["type"]
        assert panel.get("targets"), f"panel {panel['title']!r} has no query"
        for target in panel["targets"]:
            ds = target.get("datasource", panel["datasource"])
            assert ds["uid"] in uids, f"panel {panel['title']!r} target {target['refId']}"


def test_dashboard_covers_rounds_latency_failures_restarts():
    panels = [p for p in all_panels(_dashboard()["panels"]) if p["type"] != "row"]
    queries = [t.get("expr") or t.get("query") or "" for p in panels for t in p["targets"]]

    def has(*needles):
        return any(all(n in q for n in needles) for q in queries)

    assert has("rendezvous.join") and has("torchelastic_round"), "rounds"
    assert has("traces_spanmetrics_latency_bucket", "host_name", "rendezvous.join"), "latency"
    assert has("STATUS_CODE_ERROR") and has('torchelastic_node_state="FAILED"'), "failures"
    assert has('torchelastic_state="REPLACED"') and has("remaining_restarts"), "restarts"
    assert has("elastic_otel_dropped_total", "elastic_otel_reason"), "the bridge's own losses"
    assert has("torchelastic_recovery_cause", 'until="first_step"') and has(
        "torchelastic_recovery_phase"
    ), "recovery"


def _prometheus_name(name: str, kind: str, unit: str) -> str:
    """What the collector's prometheusremotewrite exporter names an OTel metric (suffixes on).
    A gauge of unit ``1`` ends with ``ratio`` once: the translator drops the name's own
    ``ratio`` token before it appends one (``torchelastic.slowdown.ratio``)."""
    out = re.sub(r"[^a-zA-Z0-9_:]", "_", name)
    if unit == "1" and kind == "gauge":
        return "_".join([token for token in out.split("_") if token != "ratio"] + ["ratio"])
    out += {"ms": "_milliseconds", "s": "_seconds"}.get(unit, "")
    return out + {"counter": "_total", "histogram": "_bucket"}.get(kind, "")


def test_dashboard_metric_names_are_the_ones_the_bridge_exports():
    """Every metric panel matches a name the bridge really exports (a rename would leave it
    blank): names from ``elastic_otel.integration.torch_metrics.classify`` and the bridge's own
    counters."""
    from elastic_otel.integration import torch_metrics as metrics

    panels = [p for p in all_panels(_dashboard()["panels"]) if p["type"] != "row"]
    queries = [t.get("expr") or "" for p in panels for t in p["targets"]]
    patterns = [m[1] for q in queries for m in re.finditer(r'__name__=~"([^"]+)"', q)]
    exported = [
        _prometheus_name(*metrics.classify(torch_name)[:3])
        for torch_name in (
            "workers.default.remaining_restarts",  # torch's put_metric
            "SimpleElasticAgent._rendezvous.duration.ms",  # torch's @prof
        )
    ]
    exported.append(_prometheus_name("torchelastic.rendezvous.duration", "histogram", "ms"))
    recovery = _prometheus_name(A.METRIC_RECOVERY_DURATION, "histogram", "s")
    phase = _prometheus_name(A.METRIC_RECOVERY_PHASE_DURATION, "histogram", "s")
    exported += [recovery, recovery.replace("_bucket", "_count")]  # quantiles, counts
    exported += [phase.replace("_bucket", "_sum"), phase.replace("_bucket", "_count")]  # means
    for name in exported:
        assert any(re.fullmatch(p, name) for p in patterns), (name, patterns)
    for pattern in patterns:
        assert any(re.fullmatch(pattern, name) for name in exported), pattern
    joined = " ".join(queries)
    assert _prometheus_name("elastic_otel.dropped", "counter", "{record}") in joined
    assert _prometheus_name("elastic_otel.export.pending", "gauge", "{record}") in joined
    assert _prometheus_name(A.METRIC_WORKER_FAILURES, "counter", "{failure}") in joined


# --------------------------------------------------------------------------- alert rules

ALERTING_DIR = GRAFANA_DIR / "provisioning" / "alerting"
ALERTING_FILE = ALERTING_DIR / "torchelastic-stalls.yaml"
STRAGGLER_ALERTING_FILE = ALERTING_DIR / "torchelastic-stragglers.yaml"
SLOWDOWN_ALERTING_FILE = ALERTING_DIR / "torchelastic-slowdowns.yaml"
EXPRESSIONS_UID = "__expr__"  # Grafana's server-side expressions (reduce, threshold, math)


def _alert_rules(path: Path = ALERTING_FILE) -> list[dict]:
    config = load_yaml(path)
    assert config["apiVersion"] == 1
    rules = []
    for group in config["groups"]:
        assert group["name"] and group["folder"], "Grafana refuses a group without name/folder"
        assert re.fullmatch(r"\d+[smh]", group["interval"]), group["interval"]
        rules += group["rules"]
    assert rules
    return rules


def _prometheus_queries(rule: dict) -> list[str]:
    uids = _datasource_uids()
    return [
        q["model"]["expr"] for q in rule["data"] if uids.get(q["datasourceUid"]) == "prometheus"
    ]


def _stall_gauge() -> tuple[str, str, dict]:
    """(name, unit, attributes of a training stall) of the gauge the bridge registers."""
    from opentelemetry.metrics import CallbackOptions

    from elastic_otel.emit import bridge_health
    from elastic_otel.model.stalls import TRAINING

    gauges = []

    class Meter:
        def __getattr__(self, name: str):
            return lambda *args, **kw: gauges.append(args) if name.endswith("_gauge") else None

    bridge_health.observe(Meter(), lambda: {}, lambda: {TRAINING: 62.0})
    [(name, [callback], unit)] = gauges
    [observation] = callback(CallbackOptions())
    assert observation.value == 62.0
    return name, unit, dict(observation.attributes)


def _label(attribute: str) -> str:
    """A metric attribute as a Prometheus label (the collector replaces what is not allowed)."""
    return re.sub(r"[^a-zA-Z0-9_]", "_", attribute)


def test_alert_rules_are_provisioned():
    """Grafana reads the mounted directory; every rule is one it accepts, on provisioned data
    sources, its condition and expressions pointing at queries of the rule."""
    targets = {target: source for source, target in bind_mounts(_grafana_services()["grafana"])}
    mounted = (GRAFANA_DIR / targets["/etc/grafana/provisioning/alerting"]).resolve()
    assert mounted == ALERTING_DIR.resolve() and ALERTING_FILE.is_file()
    assert STRAGGLER_ALERTING_FILE.is_file() and SLOWDOWN_ALERTING_FILE.is_file()
    uids = _datasource_uids()
    lasting = _alert_rules(STRAGGLER_ALERTING_FILE) + _alert_rules(SLOWDOWN_ALERTING_FILE)
    rules = _alert_rules() + lasting
    assert len({r["uid"] for r in rules}) == len(rules), "duplicate rule uid"
    for rule in rules:
        assert re.fullmatch(r"[a-zA-Z0-9_-]{1,40}", rule["uid"]), rule["uid"]
        assert rule["title"] and rule["for"] == ("2m" if rule in lasting else "1m")
        assert rule["noDataState"] in {"OK", "NoData", "Alerting", "KeepLast"}
        assert rule["execErrState"] in {"OK", "Error", "Alerting", "KeepLast"}
        refs = [q["refId"] for q in rule["data"]]
        assert len(refs) == len(set(refs)) and rule["condition"] in refs
        for query in rule["data"]:
            uid = query["datasourceUid"]
            assert uid == EXPRESSIONS_UID or uid in uids, f"{rule['uid']}: datasource {uid!r}"
            assert query["model"]["refId"] == query["refId"]
            if uid == EXPRESSIONS_UID and query["model"]["type"] == "math":  # "$B >= 1.3"
                used = re.findall(r"\$\{?([A-Za-z]\w*)", query["model"]["expression"])
                assert used and set(used) <= set(refs), query["model"]["expression"]
            elif uid == EXPRESSIONS_UID:
                assert query["model"]["expression"] in refs
            else:
                assert query["relativeTimeRange"]["from"] > 0


def test_alert_rules_query_the_stall_gauge_the_bridge_exports():
    """The rules watch ``torchelastic.stalled.seconds`` under the name Prometheus gives it (the
    collector adds the unit's suffix only when the name does not end with it): training stalls
    alone, and every kind of wait; firing above 0 s."""
    from elastic_otel.model.stalls import TRAINING

    name, unit, attributes = _stall_gauge()
    assert (name, unit) == (A.METRIC_STALLED_SECONDS, "s")
    metric = _label(name)
    if not metric.endswith("_seconds"):
        metric += "_seconds"
    assert metric == "torchelastic_stalled_seconds"
    kind = _label(A.STALLED_IN)
    assert attributes == {A.STALLED_IN: TRAINING} and kind == "torchelastic_stalled_in"
    matchers = []
    for rule in _alert_rules():
        [expr] = _prometheus_queries(rule)
        assert re.search(rf"\b{metric}\b", expr), (rule["uid"], expr)
        matchers.append(f'{kind}="{TRAINING}"' in expr)
        thresholds = [q["model"] for q in rule["data"] if q["refId"] == rule["condition"]]
        [[condition]] = [t["conditions"] for t in thresholds]
        assert thresholds[0]["type"] == "threshold"
        assert condition["evaluator"] == {"type": "gt", "params": [0]}
        if not matchers[-1]:
            assert re.search(rf"by \([^)]*\b{kind}\b", expr), "one alert per kind of wait"
    assert sorted(matchers) == [False, True]  # training alone, and any kind


def test_alert_annotations_link_to_the_stall_records():
    """The gauge has no rank: the annotations point at the Loki records that name the ranks,
    and use only labels the query keeps. Grafana would expand ``${...}`` from its environment."""
    from urllib.parse import parse_qs

    from elastic_otel.model.stalls import STALL_EVENT_NAME

    uids = _datasource_uids()
    event = f'{_label(A.EVENT_NAME)}="{STALL_EVENT_NAME}"'
    for rule in _alert_rules():
        notes = rule["annotations"]
        [expr] = _prometheus_queries(rule)
        [kept] = re.findall(r"by \(([^)]*)\)", expr)
        labels = {label.strip() for label in kept.split(",")}
        for text in notes.values():
            assert "${" not in text and text.count("{{") == text.count("}}")
            for label in re.findall(r"\$labels\.(\w+)", text):
                assert label in labels, (rule["uid"], label)
        assert event in notes["stalled_ranks_query"]
        assert f"{_label(A.STALLED_RANKS)}!=" in notes["stalled_ranks_query"]
        assert event in notes["node_reports_query"]
        assert "$labels.instance" in notes["node_reports_query"]
        url = urlsplit(notes["logs_url"])
        assert (url.hostname, url.port, url.path) == ("localhost", 3000, "/explore")
        [pane] = json.loads(parse_qs(url.query)["panes"][0]).values()
        [query] = pane["queries"]
        assert uids[query["datasource"]["uid"]] == "loki" == query["datasource"]["type"]
        assert query["expr"] == notes["stalled_ranks_query"]
        assert "ranks" in notes["description"]


def _straggler_score_gauge() -> tuple[str, str, dict]:
    """(name, unit, attributes of a rank's score) of the gauge the bridge registers."""
    from opentelemetry.metrics import CallbackOptions

    from elastic_otel.emit import straggler_metrics
    from elastic_otel.model.stragglers import RankScore

    gauges = []

    class Meter:
        def create_observable_gauge(self, name, callbacks, unit, description):
            gauges.append((name, callbacks, unit))

    straggler_metrics.observe(Meter(), lambda: [RankScore(1, 0.4, 0.3, 0.5, 0.6, "0", 20)])
    [(name, [callback], unit)] = [g for g in gauges if g[0] == A.METRIC_STRAGGLER_SCORE]
    [observation] = callback(CallbackOptions())
    assert observation.value == 0.4
    return name, unit, dict(observation.attributes)


def _straggler_score_metric() -> tuple[str, str]:
    """The score gauge's Prometheus name and its global rank label."""
    name, unit, attributes = _straggler_score_gauge()
    assert (name, unit) == (A.METRIC_STRAGGLER_SCORE, "1")
    assert attributes == {A.GLOBAL_RANK: 1}
    metric = _prometheus_name(name, "gauge", unit)
    assert metric == "torchelastic_straggler_score_ratio"
    return metric, _label(A.GLOBAL_RANK)


def test_straggler_rule_fires_on_the_score_gauge_below_the_threshold():
    """The rule watches ``torchelastic.straggler.score`` per global rank, firing below the
    bridge's default straggler threshold for 2 minutes."""
    from elastic_otel.names.environment_variables import DEFAULT_STRAGGLER_SCORE

    metric, rank = _straggler_score_metric()
    [rule] = _alert_rules(STRAGGLER_ALERTING_FILE)
    [expr] = _prometheus_queries(rule)
    assert re.search(rf"\b{metric}\b", expr), expr
    assert re.search(rf"by \([^)]*\b{rank}\b", expr), "one alert per rank"
    [threshold] = [q["model"] for q in rule["data"] if q["refId"] == rule["condition"]]
    assert threshold["type"] == "threshold"
    [condition] = threshold["conditions"]
    assert condition["evaluator"] == {"type": "lt", "params": [DEFAULT_STRAGGLER_SCORE]}
    assert rule["for"] == "2m"


def test_straggler_annotations_link_to_the_straggler_records():
    """The annotations use only labels the query keeps and point at the Loki records that say
    what the straggler costs."""
    from urllib.parse import parse_qs

    from elastic_otel.model.stragglers import STRAGGLER_EVENT_NAME

    uids = _datasource_uids()
    [rule] = _alert_rules(STRAGGLER_ALERTING_FILE)
    notes = rule["annotations"]
    [expr] = _prometheus_queries(rule)
    [kept] = re.findall(r"by \(([^)]*)\)", expr)
    labels = {label.strip() for label in kept.split(",")}
    for text in notes.values():
        assert "${" not in text and text.count("{{") == text.count("}}")
        for label in re.findall(r"\$labels\.(\w+)", text):
            assert label in labels, label
    event = f'{_label(A.EVENT_NAME)}="{STRAGGLER_EVENT_NAME}"'
    assert event in notes["stragglers_query"] and event in notes["rank_reports_query"]
    rank = f'{_label(A.STRAGGLER_RANK)}="{{{{ $labels.{_label(A.GLOBAL_RANK)} }}}}"'
    assert rank in notes["rank_reports_query"]
    url = urlsplit(notes["logs_url"])
    assert (url.hostname, url.port, url.path) == ("localhost", 3000, "/explore")
    [pane] = json.loads(parse_qs(url.query)["panes"][0]).values()
    [query] = pane["queries"]
    assert uids[query["datasource"]["uid"]] == "loki" == query["datasource"]["type"]
    assert query["expr"] == notes["stragglers_query"]
    assert _label(A.STRAGGLER_WAITED_SHARE) in notes["description"]


def test_dashboard_shows_the_straggler_score_by_rank_with_the_threshold():
    from elastic_otel.names.environment_variables import DEFAULT_STRAGGLER_SCORE

    metric, rank = _straggler_score_metric()
    panels = [p for p in all_panels(_dashboard()["panels"]) if p["type"] != "row"]
    [panel] = [p for p in panels if p["title"].startswith("Stragglers")]
    [target] = panel["targets"]
    assert re.search(rf"\b{metric}\b", target["expr"]), target["expr"]
    assert re.search(rf"by \([^)]*\b{rank}\b", target["expr"]) and rank in target["legendFormat"]
    defaults = panel["fieldConfig"]["defaults"]
    assert "line" in defaults["custom"]["thresholdsStyle"]["mode"]
    steps = [step["value"] for step in defaults["thresholds"]["steps"]]
    assert steps == [None, DEFAULT_STRAGGLER_SCORE]


def _slowdown_ratio_metric() -> tuple[str, str]:
    """The slowdown gauge's Prometheus name and its process group label, from the gauge the
    bridge registers (``elastic_otel.emit.straggler_metrics.observe_slowdowns``)."""
    from opentelemetry.metrics import CallbackOptions

    from elastic_otel.emit import straggler_metrics

    gauges = []

    class Meter:
        def create_observable_gauge(self, name, callbacks, unit, description):
            gauges.append((name, callbacks, unit))

    straggler_metrics.observe_slowdowns(Meter(), lambda: [("nccl:0", 1.9)])
    [(name, [callback], unit)] = gauges
    [observation] = callback(CallbackOptions())
    assert observation.value == 1.9
    assert (name, unit) == (A.METRIC_SLOWDOWN_RATIO, "1")
    assert dict(observation.attributes) == {A.SLOWDOWN_PROCESS_GROUP: "0"}
    metric = _prometheus_name(name, "gauge", unit)
    assert metric == "torchelastic_slowdown_ratio"
    return metric, _label(A.SLOWDOWN_PROCESS_GROUP)


def test_slowdown_rule_fires_on_the_ratio_gauge_at_the_threshold():
    """The rule watches ``torchelastic.slowdown.ratio`` per node and process group, firing at
    the bridge's default slowdown ratio or above for 2 minutes."""
    from elastic_otel.names.environment_variables import DEFAULT_SLOWDOWN_RATIO

    metric, group = _slowdown_ratio_metric()
    [rule] = _alert_rules(SLOWDOWN_ALERTING_FILE)
    [expr] = _prometheus_queries(rule)
    assert re.search(rf"\b{metric}\b", expr), expr
    [kept] = re.findall(r"by \(([^)]*)\)", expr)
    assert {group, "host_name", "instance"} <= {label.strip() for label in kept.split(",")}
    [condition] = [q["model"] for q in rule["data"] if q["refId"] == rule["condition"]]
    [reduced] = [q["model"] for q in rule["data"] if q["model"].get("type") == "reduce"]
    assert condition["type"] == "math"
    assert condition["expression"] == f"${reduced['refId']} >= {DEFAULT_SLOWDOWN_RATIO}"
    assert rule["for"] == "2m"


def test_slowdown_annotations_link_to_the_slowdown_and_link_records():
    """The annotations use only labels the query keeps and point at the Loki records that date
    the slowdown and name the link."""
    from urllib.parse import parse_qs

    uids = _datasource_uids()
    [rule] = _alert_rules(SLOWDOWN_ALERTING_FILE)
    notes = rule["annotations"]
    [expr] = _prometheus_queries(rule)
    [kept] = re.findall(r"by \(([^)]*)\)", expr)
    labels = {label.strip() for label in kept.split(",")}
    for text in notes.values():
        assert "${" not in text and text.count("{{") == text.count("}}")
        for label in re.findall(r"\$labels\.(\w+)", text):
            assert label in labels, label
    for name in (A.SLOWDOWN_EVENT_NAME, A.LINK_EVENT_NAME):
        assert f'{_label(A.EVENT_NAME)}="{name}"' in notes["slowdowns_query"]
    assert f'{_label(A.EVENT_NAME)}="{A.SLOWDOWN_EVENT_NAME}"' in notes["node_reports_query"]
    assert "$labels.instance" in notes["node_reports_query"]
    url = urlsplit(notes["logs_url"])
    assert (url.hostname, url.port, url.path) == ("localhost", 3000, "/explore")
    [pane] = json.loads(parse_qs(url.query)["panes"][0]).values()
    [query] = pane["queries"]
    assert uids[query["datasource"]["uid"]] == "loki" == query["datasource"]["type"]
    assert query["expr"] == notes["slowdowns_query"]
    for key in (A.SLOWDOWN_PART, A.SLOWDOWN_LOST, A.LINK_NODES):
        assert _label(key) in notes["description"], key


def test_dashboard_shows_the_slowdown_ratio_and_the_records():
    """A panel of the ratio by process group and node with the threshold line, and the Loki
    records of slowdowns and links below it."""
    from elastic_otel.names.environment_variables import DEFAULT_SLOWDOWN_RATIO

    metric, group = _slowdown_ratio_metric()
    panels = [p for p in all_panels(_dashboard()["panels"]) if p["type"] != "row"]
    [panel] = [p for p in panels if p["title"].startswith("Slowdowns")]
    [target] = panel["targets"]
    assert re.search(rf"\b{metric}\b", target["expr"]), target["expr"]
    assert re.search(rf"by \([^)]*\b{group}\b[^)]*\)", target["expr"])
    assert re.search(r"by \([^)]*\bhost_name\b", target["expr"])
    assert group in target["legendFormat"] and "host_name" in target["legendFormat"]
    defaults = panel["fieldConfig"]["defaults"]
    assert "line" in defaults["custom"]["thresholdsStyle"]["mode"]
    steps = [step["value"] for step in defaults["thresholds"]["steps"]]
    assert steps == [None, DEFAULT_SLOWDOWN_RATIO]
    [logs] = [p for p in panels if p["type"] == "logs" and "link" in p["title"]]
    [query] = logs["targets"]
    assert _datasource_uids()[logs["datasource"]["uid"]] == "loki"
    for name in (A.SLOWDOWN_EVENT_NAME, A.LINK_EVENT_NAME):
        assert f'{_label(A.EVENT_NAME)}="{name}"' in query["expr"]


# --------------------------------------------------------------------------- README


def _published_ports_everywhere() -> dict[int, set[str]]:
    ports: dict[int, set[str]] = {}
    for path in COMPOSE_FILES:
        for name, service in _compose(path)["services"].items():
            for port in service_ports(service)[0]:
                ports.setdefault(port, set()).add(name)
    return ports


def test_root_readme_ports_consistent():
    readme_path = ROOT / "README.md"
    if not readme_path.is_file():
        pytest.skip("README.md does not exist yet")
    readme = readme_path.read_text(encoding="utf-8")
    mentioned = {p for p in (4317, 4318, 16686, 3000) if re.search(rf"\b{p}\b", readme)}
    if not mentioned:
        pytest.skip("README.md mentions none of the example ports")
    published = _published_ports_everywhere()
    collector_ports = {4317, 4318}
    for port in mentioned:
        assert port in published, f"README mentions {port}, no compose file publishes it"
    for port in mentioned & collector_ports:
        assert any("collector" in s or "agent" in s for s in published[port])
    if 16686 in mentioned:
        assert "jaeger" in published[16686]
    if 3000 in mentioned:
        assert "grafana" in published[3000]
    for match in re.finditer(r"OTEL_EXPORTER_OTLP_ENDPOINT=\S*?localhost:(\d+)", readme):
        assert int(match.group(1)) in collector_ports, match.group(0)
    for match in re.finditer(r"opentelemetry-collector-contrib:(\d+\.\d+\.\d+)", readme):
        assert match.group(1) == CONTRIB_VERSION, match.group(0)


# --------------------------------------------------------------------------- self-tests
# The helpers above must be able to say "no": feed them known-bad input.


def test_pipeline_check_rejects_undefined_and_unused():
    bad = {
        "receivers": {"otlp": {}},
        "processors": {"batch": {}},
        "exporters": {"debug": {}, "otlp/unused": {"endpoint": "x:1"}},
        "service": {
            "extensions": ["health_check"],
            "pipelines": {
                "traces": {
                    "receivers": ["otlp"],
                    "processors": ["batch", "nope"],
                    "exporters": ["debug"],
                }
            },
        },
    }
    errors = pipeline_errors(bad)
    assert any("'nope' is not defined" in e for e in errors)
    assert any("'health_check' is not defined" in e for e in errors)
    assert any("'otlp/unused' is defined but used" in e for e in errors)


def test_allow_list_rejects_removed_logging_exporter():
    assert unknown_components({"exporters": {"logging": {}, "otlp/x": {}}}) == ["exporters.logging"]


@pytest.mark.parametrize(
    ("image", "ok"),
    [
        ("grafana/tempo:2.8.2", True),
        ("prom/prometheus:v3.6.0", True),
        ("grafana/tempo:latest", False),
        ("grafana/tempo", False),
        ("jaegertracing/jaeger:2", False),
        ("grafana/loki:3.5", False),
    ],
)
def test_pinned_image_pattern(image, ok):
    assert bool(PINNED_IMAGE.match(image)) is ok


def test_endpoint_and_port_parsing():
    assert split_host_port("http://loki:3100/otlp") == ("loki", 3100)
    assert split_host_port("jaeger:4317") == ("jaeger", 4317)
    assert split_host_port("http://prometheus/api") == ("prometheus", 80)
    assert parse_port("4317:4317") == (4317, 4317)
    assert parse_port("127.0.0.1:8080:80/tcp") == (8080, 80)
    assert parse_port("4317") == (None, 4317)
    assert parse_port({"target": 16686, "published": "16687"}) == (16687, 16686)
