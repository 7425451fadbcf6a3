//! `llmslo inject`: adds the sidecar to every pod template that opts in with the label
//! `llmslo.io/inject: "true"`, in Pods, Deployments, StatefulSets, DaemonSets, ReplicaSets,
//! Jobs, CronJobs and Lists (like `linkerd inject --manual`).
//!
//! Traffic scheme: the sidecar takes over the engine's *named* container port. The engine's
//! port entry is renamed `llmslo-engine`; the original name now points at the sidecar's
//! listen port, so a Service with `targetPort: <name>` reaches llmslo, which forwards to the
//! engine on localhost, with no edit to the Service.
//!
//! With a native sidecar (an init container with `restartPolicy: Always`, Kubernetes ≥ 1.29),
//! the Service-facing and metrics port names are declared on the engine container: before
//! Kubernetes 1.32, named ports of init containers are not resolved for Services. A
//! declaration only names a port of the pod's shared network namespace, where llmslo listens.

use crate::record::Role;
use container::{sidecar_container, ListenTls, Serving};
use router::ToPrefill;
use serde_json::{json, Map, Value};

/// The injected sidecar's memory request and limit unless `llmslo.io/memory` says otherwise:
/// the default limits' worst case (docs/configuration.md, "Memory budget") fits under it.
pub const DEFAULT_MEMORY_LIMIT: &str = "128Mi";
/// [`DEFAULT_MEMORY_LIMIT`] in bytes.
pub const DEFAULT_MEMORY_LIMIT_BYTES: u64 = 128 << 20;
/// The same for a decode pod whose sidecar runs the prefill relay (its legs' connections).
pub const RELAY_MEMORY_LIMIT: &str = "192Mi";
/// [`RELAY_MEMORY_LIMIT`] in bytes.
pub const RELAY_MEMORY_LIMIT_BYTES: u64 = 192 << 20;

/// The pod label that opts in.
pub const INJECT_LABEL: &str = "llmslo.io/inject";
/// The injected container's name (also how injection is recognised, for idempotence).
pub const CONTAINER: &str = "llmslo";
/// The name the engine's own port gets.
pub const ENGINE_PORT_NAME: &str = "llmslo-engine";
/// The annotation the injector leaves when the engine's port had no name.
const NOTE: &str = "llmslo.io/note";
/// The sidecar's metrics port name (for PodMonitors).
pub const METRICS_PORT_NAME: &str = "llmslo-metrics";
/// Per-pod annotations.
pub mod annotations {
    /// The engine's container port to take over: a port name or number.
    pub const ENGINE_PORT: &str = "llmslo.io/engine-port";
    /// The engine kind (`auto`, `vllm`, `tgi`, `sglang`, `llamacpp`, `openai`).
    pub const ENGINE: &str = "llmslo.io/engine";
    /// A ConfigMap holding `llmslo.yaml` (SLOs and settings), mounted into the sidecar.
    pub const CONFIG_MAP: &str = "llmslo.io/slo-configmap";
    /// CPU request of the sidecar.
    pub const CPU: &str = "llmslo.io/cpu";
    /// Memory request and limit of the sidecar.
    pub const MEMORY: &str = "llmslo.io/memory";
    /// `native` or `classic`.
    pub const SIDECAR: &str = "llmslo.io/sidecar";
    /// The sidecar image.
    pub const IMAGE: &str = "llmslo.io/image";
    /// `all`: let the sidecar see the node's GPUs through the NVIDIA runtime, so it can sample
    /// them (exact when the engine has the whole node; otherwise it sees its neighbours' too).
    pub const GPUS: &str = "llmslo.io/gpus";
    /// The prefill pods the relay of an llm-d decode pod may send legs to: their headless
    /// Service's DNS name, addresses or CIDR ranges, each with the port, separated by commas.
    /// Without it the relay stays off and the prefill part is counted as unmeasured.
    pub const PREFILL_POOL: &str = "llmslo.io/prefill-pool";
    /// The port llmslo listens on, where the injector's choice is wrong: the engine's own
    /// port number makes llmslo take it and the engine move (as for a prefill pod).
    pub const LISTEN_PORT: &str = "llmslo.io/listen-port";
    /// Set by the injector: the llmslo version injected.
    pub const INJECTED: &str = "llmslo.io/injected";
    /// Set by the injector: what llmslo cannot measure in this pod as injected, and how to mend
    /// it (also said on stderr, and in the webhook's warnings).
    pub const WARNING: &str = "llmslo.io/warning";
}

/// How the sidecar runs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum SidecarMode {
    /// An init container with `restartPolicy: Always` (Kubernetes ≥ 1.29): starts before the
    /// engine, stops after it, and does not keep Jobs from completing.
    Native,
    /// A regular container beside the engine (any Kubernetes).
    Classic,
}

/// Injection defaults; per-pod annotations override them.
#[derive(Debug, Clone)]
pub struct InjectOptions {
    /// Sidecar image; without one, every pod must name its own (`llmslo.io/image`).
    pub image: Option<String>,
    /// Native or classic sidecar.
    pub mode: SidecarMode,
    /// Point the Services that bypass the sidecar at its port instead of only warning.
    pub rewrite_services: bool,
}

impl InjectOptions {
    /// Native sidecars of `image`, Services left as they are.
    pub fn with_image(image: impl Into<String>) -> Self {
        Self {
            image: Some(image.into()),
            mode: SidecarMode::Native,
            rewrite_services: false,
        }
    }
}

/// What to do when no image is given: llmslo publishes none, so the user builds their own.
pub const NO_IMAGE: &str = "no sidecar image: build one with `docker build -t REGISTRY/llmslo:TAG .` \
     from the llmslo repository, push it, and pass it with --image (or the llmslo.io/image annotation)";

/// Why a pod template that opted in could not be injected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {message}")]
pub struct InjectError {
    /// `Kind/name` of the object.
    pub object: String,
    /// What is wrong.
    pub message: String,
}

/// The result of [`inject_yaml`].
#[derive(Debug, Clone)]
pub struct Injected {
    /// The YAML stream with the sidecars added.
    pub output: String,
    /// How many pod templates changed.
    pub changed: usize,
    /// Service ports in the stream that reach an engine without going through its sidecar.
    pub bypasses: Vec<Bypass>,
    /// `llmslo.io/*` labels and annotations that are misspelt, misplaced or not strings,
    /// each with the object it is on.
    pub warnings: Vec<String>,
    /// How many of them llmslo would not read (unknown or misplaced keys).
    pub unread_keys: usize,
}

/// Injects every document of a YAML stream, then finds (and with
/// [`InjectOptions::rewrite_services`] mends) the Services that would bypass the sidecar.
pub fn inject_yaml(input: &str, options: &InjectOptions) -> Result<Injected, InjectError> {
    let mut documents = Vec::new();
    let mut changed = 0;
    let mut warnings = Vec::new();
    let mut unread_keys = 0;
    for document in serde_yaml::Deserializer::from_str(input) {
        let mut value: Value = serde::Deserialize::deserialize(document).map_err(|e| InjectError {
            object: "input".into(),
            message: format!("not valid YAML: {e}"),
        })?;
        if value.is_null() {
            continue;
        }
        for object in objects(&value) {
            let template = template_pointer(object["kind"].as_str().unwrap_or_default())
                .and_then(|pointer| object.pointer(pointer));
            let name = object_label(object);
            for warning in template.map(metadata_warnings).unwrap_or_default() {
                unread_keys += usize::from(warning.unread);
                warnings.push(format!("{name}: {}", warning.text));
            }
        }
        changed += inject_object(&mut value, options)?;
        for object in objects(&value) {
            let template = template_pointer(object["kind"].as_str().unwrap_or_default())
                .and_then(|pointer| object.pointer(pointer));
            if let Some(warning) = template.and_then(injected_warning) {
                warnings.push(format!("{}: {warning}", object_label(object)));
            }
        }
        documents.push(value);
    }
    let takeovers: Vec<Takeover> = documents.iter().flat_map(objects).filter_map(Takeover::of).collect();
    let mut bypasses = Vec::new();
    for document in &mut documents {
        for service in objects_mut(document).filter(|o| o["kind"] == "Service") {
            bypasses.extend(check_service(service, &takeovers, options.rewrite_services));
        }
    }
    let output = documents
        .iter()
        .map(|value| serde_yaml::to_string(value).expect("a JSON value serializes as YAML"))
        .collect::<Vec<_>>()
        .join("---\n");
    Ok(Injected {
        output,
        changed,
        bypasses,
        warnings,
        unread_keys,
    })
}

/// Where a kind keeps its pod template (`""` is the object itself, for a Pod).
fn template_pointer(kind: &str) -> Option<&'static str> {
    match kind {
        "Pod" => Some(""),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            Some("/spec/template")
        }
        "CronJob" => Some("/spec/jobTemplate/spec/template"),
        _ => None,
    }
}

/// A document's objects, a List's items in its place.
fn objects(document: &Value) -> Vec<&Value> {
    match document["kind"].as_str() {
        Some("List") => document["items"].as_array().into_iter().flatten().collect(),
        _ => vec![document],
    }
}

/// [`objects`], mutable.
fn objects_mut(document: &mut Value) -> Box<dyn Iterator<Item = &mut Value> + '_> {
    if document["kind"] == "List" {
        Box::new(document["items"].as_array_mut().into_iter().flatten())
    } else {
        Box::new(std::iter::once(document))
    }
}

/// An injected pod template, as far as a Service sees it.
#[derive(Debug)]
struct Takeover {
    namespace: String,
    labels: Map<String, Value>,
    /// The engine's own port number (named `llmslo-engine` now).
    engine_port: u64,
    /// The name of the sidecar's Service-facing port.
    facing: String,
}

impl Takeover {
    /// Reads an injected pod template (injected now or earlier) from the sidecar's arguments.
    fn of(object: &Value) -> Option<Takeover> {
        let template = object.pointer(template_pointer(object["kind"].as_str()?)?)?;
        let spec = &template["spec"];
        let containers = || {
            ["containers", "initContainers"]
                .into_iter()
                .flat_map(|key| spec[key].as_array().into_iter().flatten())
        };
        let sidecar = containers().find(|c| c["name"] == CONTAINER)?;
        let args: Vec<&str> = sidecar["args"].as_array()?.iter().filter_map(Value::as_str).collect();
        let after = |flag: &str| args.iter().position(|a| *a == flag).and_then(|i| args.get(i + 1));
        let engine_port = after("--upstream")?.rsplit(':').next()?.parse().ok()?;
        let listen: u64 = after("--listen")?.rsplit(':').next()?.parse().ok()?;
        let facing = containers()
            .flat_map(|c| c["ports"].as_array().into_iter().flatten())
            .find(|p| p["containerPort"] == listen)
            .and_then(|p| p["name"].as_str())
            .unwrap_or("llmslo-http")
            .to_string();
        Some(Takeover {
            namespace: namespace(object),
            labels: template["metadata"]["labels"].as_object().cloned().unwrap_or_default(),
            engine_port,
            facing,
        })
    }

    /// Whether a Service's selector picks these pods.
    fn selected_by(&self, service: &Value) -> bool {
        let selector = service["spec"]["selector"].as_object();
        namespace(service) == self.namespace
            && selector.is_some_and(|s| !s.is_empty() && s.iter().all(|(k, v)| self.labels.get(k) == Some(v)))
    }
}

fn namespace(object: &Value) -> String {
    object["metadata"]["namespace"].as_str().unwrap_or_default().to_string()
}

/// A Service port that reaches the engine directly: by its number, or by the name the
/// engine's port has after injection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Bypass {
    /// `Service/name` (with its namespace when it has one).
    pub service: String,
    /// The Service port (its name, else its number).
    pub port: String,
    /// The target it had.
    pub target: String,
    /// The sidecar's port name it should target.
    pub facing: String,
    /// Whether the Service was rewritten to target it.
    pub rewritten: bool,
}

impl std::fmt::Display for Bypass {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Bypass {
            service,
            port,
            target,
            facing,
            ..
        } = self;
        if self.rewritten {
            write!(
                f,
                "{service} port {port}: rewrote targetPort {target} to {facing}, the sidecar's port"
            )
        } else {
            write!(
                f,
                "{service} port {port} targets the engine's port {target}, so its traffic bypasses llmslo: \
                 set targetPort: {facing} (or run with --rewrite-services)"
            )
        }
    }
}

/// The ports of one Service that bypass a sidecar, rewritten when asked.
fn check_service(service: &mut Value, takeovers: &[Takeover], rewrite: bool) -> Vec<Bypass> {
    let name = match (
        service["metadata"]["namespace"].as_str(),
        service["metadata"]["name"].as_str(),
    ) {
        (Some(ns), Some(name)) => format!("Service/{name} (namespace {ns})"),
        (None, Some(name)) => format!("Service/{name}"),
        _ => "Service/?".to_string(),
    };
    let Some(takeover) = takeovers.iter().find(|t| t.selected_by(service)) else {
        return Vec::new();
    };
    let mut found = Vec::new();
    for port in service["spec"]["ports"].as_array_mut().into_iter().flatten() {
        // Without targetPort, a Service targets the number of its own port.
        let target = port.get("targetPort").or_else(|| port.get("port")).cloned();
        let bypasses = match &target {
            Some(Value::Number(n)) => n.as_u64() == Some(takeover.engine_port),
            Some(Value::String(s)) => s == ENGINE_PORT_NAME || *s == takeover.engine_port.to_string(),
            _ => false,
        };
        if !bypasses {
            continue;
        }
        let label = port["name"]
            .as_str()
            .map(str::to_string)
            .unwrap_or_else(|| port["port"].to_string());
        if rewrite {
            port["targetPort"] = json!(takeover.facing);
        }
        found.push(Bypass {
            service: name.clone(),
            port: label,
            target: target
                .map(|t| t.as_str().map(str::to_string).unwrap_or(t.to_string()))
                .unwrap_or_default(),
            facing: takeover.facing.clone(),
            rewritten: rewrite,
        });
    }
    found
}

/// `Kind/name` of an object, as errors and warnings name it.
fn object_label(object: &Value) -> String {
    format!(
        "{}/{}",
        object["kind"].as_str().unwrap_or_default(),
        object["metadata"]["name"].as_str().unwrap_or("?")
    )
}

/// Injects one object (a List's items too); returns how many pod templates changed.
pub fn inject_object(object: &mut Value, options: &InjectOptions) -> Result<usize, InjectError> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let label = object_label(object);
    if kind == "List" {
        let mut changed = 0;
        for item in object["items"].as_array_mut().into_iter().flatten() {
            changed += inject_object(item, options)?;
        }
        return Ok(changed);
    }
    let template = template_pointer(&kind).and_then(|pointer| object.pointer_mut(pointer));
    match template {
        Some(template) => inject_pod_template(template, options)
            .map(usize::from)
            .map_err(|message| InjectError { object: label, message }),
        None => Ok(0),
    }
}

/// Injects a pod (or pod template: `metadata` + `spec`); false when it does not opt in or
/// already has the sidecar.
pub fn inject_pod_template(pod: &mut Value, options: &InjectOptions) -> Result<bool, String> {
    let meta = pod.get("metadata").cloned().unwrap_or(Value::Null);
    if as_text(&meta["labels"][INJECT_LABEL]).as_deref() != Some("true") {
        return Ok(false);
    }
    let annotation = |key: &str| as_text(&meta["annotations"][key]);
    let spec = pod
        .get_mut("spec")
        .and_then(Value::as_object_mut)
        .ok_or("has no pod spec")?;
    let has_sidecar = ["containers", "initContainers"]
        .iter()
        .flat_map(|key| spec.get(*key).and_then(Value::as_array).into_iter().flatten())
        .any(|c| c["name"] == CONTAINER);
    if has_sidecar {
        return Ok(false);
    }
    let mode = match annotation(annotations::SIDECAR).as_deref() {
        None => options.mode,
        Some("native") => SidecarMode::Native,
        Some("classic") => SidecarMode::Classic,
        Some(other) => {
            return Err(format!(
                "annotation {}: `{other}` is not native or classic",
                annotations::SIDECAR
            ))
        }
    };
    let mut warnings = Vec::new();
    // Whether llmslo listens on the port clients reached the pod on, by number.
    let mut took_port = false;
    // In front of llm-d's routing sidecar when the pod has one: llmslo takes its port.
    let asked = match annotation(annotations::LISTEN_PORT) {
        None => None,
        Some(text) => Some(
            text.parse::<u16>()
                .ok()
                .filter(|p| *p > 0)
                .ok_or_else(|| format!("annotation {}: `{text}` is not a port number", annotations::LISTEN_PORT))?
                as u64,
        ),
    };
    let mut routing = router::find(spec);
    if let Some(routing) = &mut routing {
        match asked {
            Some(port) => routing.port = port,
            None if routing.port_in_a_file => warnings.push(format!(
                "the routing sidecar reads its port from --configuration-file, which inject cannot read: llmslo \
                 takes {} (the default); if the sidecar listens elsewhere, set {} to its port",
                routing.port,
                annotations::LISTEN_PORT
            )),
            None => {}
        }
    }
    let (engine_index, engine_number, service_name, listen, used, mut serving) = match &routing {
        Some(routing) => {
            let used = used_ports(spec);
            let moved = free_port(&used, routing.port + 100);
            // It served TLS: so does llmslo, with its files (or one made at start, as it would).
            let mut serving = Serving::default();
            if routing.secure {
                let sidecar = router::container(spec, routing);
                serving.tls = Some(match &routing.cert_path {
                    Some(dir) => {
                        serving
                            .mounts
                            .extend(engine::mount_holding(sidecar, &format!("{dir}/tls.crt")));
                        ListenTls::Files(format!("{dir}/tls.crt"), format!("{dir}/tls.key"))
                    }
                    None => ListenTls::SelfSigned,
                });
            }
            let name = router::move_to(spec, routing, moved);
            took_port = true;
            (0, moved, name, routing.port, [used, vec![moved]].concat(), serving)
        }
        None => {
            let (index, number, name) = match find_engine_port(spec, annotation(annotations::ENGINE_PORT).as_deref())? {
                EnginePort::Declared { container, port } => {
                    let entry = &mut spec.get_mut("containers").expect("found above")[container]["ports"][port];
                    let number = entry["containerPort"]
                        .as_u64()
                        .ok_or("the engine's port has no containerPort")?;
                    let name = entry["name"].as_str().map(str::to_string);
                    // The engine's port entry is renamed: llmslo's port takes its name.
                    entry["name"] = json!(ENGINE_PORT_NAME);
                    (container, number, name)
                }
                EnginePort::Undeclared(number) => (0, number, None),
            };
            let flags = engine::read(&spec["containers"][index]);
            let mut serving = Serving {
                role: router::role(&meta)
                    .or(flags.kv_producer.then_some(Role::Prefill))
                    .or(flags.pd_router.then_some(Role::Router)),
                ..Serving::default()
            };
            // Where the engine's clients reach it by number (the routers of a disaggregated pool,
            // KServe's scheduler and HTTPS probes), llmslo takes the engine's port and the
            // engine moves.
            let take_over =
                flags.tls.is_some() || serving.role.is_some_and(|r| r != Role::Aggregated) || asked == Some(number);
            if take_over && flags.in_a_shell {
                warnings.push(format!(
                    "the engine runs in a shell whose flags llmslo cannot rewrite, so it keeps port {number} and \
                     llmslo listens on a port of its own: clients that reach the engine by number bypass llmslo{}",
                    if flags.tls.is_some() {
                        ", and llmslo cannot serve the engine's TLS"
                    } else {
                        ""
                    }
                ));
            }
            if take_over && !flags.in_a_shell {
                let used = [used_ports(spec), vec![number]].concat();
                let moved = free_port(&used, number + 100);
                let container = &mut spec.get_mut("containers").expect("found above")[index];
                engine::move_to(container, moved);
                if let Some(entry) = container["ports"]
                    .as_array_mut()
                    .into_iter()
                    .flatten()
                    .find(|p| p["containerPort"].as_u64() == Some(number))
                {
                    entry["containerPort"] = json!(moved);
                    entry["name"] = json!(ENGINE_PORT_NAME);
                }
                if let Some((cert, key)) = flags.tls {
                    let engine = &spec["containers"][index];
                    serving.mounts.extend(engine::mount_holding(engine, &cert));
                    if let Some(other) = engine::mount_holding(engine, &key).filter(|m| !serving.mounts.contains(m)) {
                        serving.mounts.push(other);
                    }
                    serving.tls = Some(ListenTls::Files(cert, key));
                }
                move_probes_by_number(spec, number, moved);
                took_port = true;
                (index, moved, name, number, [used, vec![moved]].concat(), serving)
            } else {
                let used = [used_ports(spec), vec![number]].concat();
                let listen = asked
                    .filter(|p| !used.contains(p))
                    .unwrap_or_else(|| free_port(&used, 8080));
                (index, number, name, listen, used, serving)
            }
        }
    };
    let metrics = free_port(&[used.as_slice(), &[listen]].concat(), 9464);
    if let Some(routing) = &routing {
        serving.role = Some(Role::Decode);
        match prefill_pool(annotation(annotations::PREFILL_POOL).as_deref())? {
            Some(_) if routing.to_prefill == ToPrefill::TlsVerified => warnings.push(
                "the prefill part of disaggregated requests is unmeasured: the routing sidecar speaks TLS to prefill \
                 pods and verifies them (--enable-tls=prefiller without --tls-insecure-skip-verify=prefiller), so it \
                 would not take the certificate of the relay that times the legs, which stays off (llmslo in front \
                 of each prefill pod still counts the legs)"
                    .to_string(),
            ),
            Some(_) if routing.to_prefill == ToPrefill::InAFile => warnings.push(
                "the prefill part of disaggregated requests is unmeasured: the routing sidecar reads its settings \
                 from a --configuration-file, which may have it speak TLS to prefill pods, so the relay that times \
                 the legs stays off (llmslo in front of each prefill pod still counts the legs); give the settings \
                 as arguments or inline --configuration to have it on"
                    .to_string(),
            ),
            Some(pool) => {
                serving.relay_tls = routing.to_prefill == ToPrefill::TlsUnverified;
                let port = free_port(&[used.as_slice(), &[listen, metrics]].concat(), 8299);
                // The relay's address is what the routing sidecar is told: with SSRF protection
                // it allows only its pool's pods, so the pod's own IP.
                let host = if routing.ssrf_protected {
                    "$(POD_IP)"
                } else {
                    "127.0.0.1"
                };
                serving.relay = Some((format!("{host}:{port}"), pool));
            }
            None => warnings.push(format!(
                "the prefill part of disaggregated requests is unmeasured: the relay that times it sends legs \
                 only to the prefill pool, and {} names none (the prefill pods' headless Service, like \
                 qwen-prefill.llm-d.svc.cluster.local:8000)",
                annotations::PREFILL_POOL
            )),
        }
    }

    if let Some(name) = &service_name {
        keep_probes_on_the_engine(spec, name);
    }
    let facing = service_name.clone().unwrap_or_else(|| "llmslo-http".to_string());
    let sidecar_ports = json!([
        {"name": facing, "containerPort": listen, "protocol": "TCP"},
        {"name": METRICS_PORT_NAME, "containerPort": metrics, "protocol": "TCP"},
    ]);
    let mut sidecar = sidecar_container(options, &annotation, engine_number, listen, metrics, &serving)?;
    match mode {
        SidecarMode::Classic => {
            sidecar["ports"] = sidecar_ports;
            spec.get_mut("containers")
                .and_then(Value::as_array_mut)
                .expect("found above")
                .push(sidecar);
        }
        SidecarMode::Native => {
            // Named ports of init containers are not resolved for Services before 1.32:
            // declare them on the engine container, in the shared network namespace.
            let engine = spec.get_mut("containers").expect("found above")[engine_index]
                .as_object_mut()
                .ok_or("a container is not a map")?;
            let ports = engine.entry("ports").or_insert_with(|| json!([]));
            ports
                .as_array_mut()
                .ok_or("a container's ports is not a list")?
                .extend(sidecar_ports.as_array().expect("built above").iter().cloned());
            sidecar["restartPolicy"] = json!("Always");
            let init = spec.entry("initContainers").or_insert_with(|| json!([]));
            init.as_array_mut()
                .ok_or("initContainers is not a list")?
                .insert(0, sidecar);
        }
    }
    if let Some(config_map) = annotation(annotations::CONFIG_MAP) {
        let volumes = spec.entry("volumes").or_insert_with(|| json!([]));
        volumes
            .as_array_mut()
            .ok_or("volumes is not a list")?
            // Optional: a missing ConfigMap never blocks the pod; the sidecar then forwards
            // without it and reports `llmslo_config_valid 0`.
            .push(json!({"name": "llmslo-config", "configMap": {"name": config_map, "optional": true}}));
    }
    let metadata = pod
        .as_object_mut()
        .expect("has a spec")
        .entry("metadata")
        .or_insert_with(|| json!({}));
    let annotations = metadata
        .as_object_mut()
        .ok_or("metadata is not a map")?
        .entry("annotations");
    let annotations = annotations
        .or_insert_with(|| json!({}))
        .as_object_mut()
        .ok_or("annotations is not a map")?;
    annotations.insert(annotations::INJECTED.into(), json!(env!("CARGO_PKG_VERSION")));
    if !warnings.is_empty() {
        annotations.insert(annotations::WARNING.into(), json!(warnings.join("; ")));
    }
    if service_name.is_none() && !took_port {
        annotations.insert(
            NOTE.into(),
            json!("the engine's port had no name: point Services at targetPort llmslo-http to go through llmslo"),
        );
    }
    quote_llmslo_values(metadata);
    Ok(true)
}

/// Writes the `llmslo.io/` labels and annotations that are numbers or booleans as the strings
/// Kubernetes requires (they were read as such).
fn quote_llmslo_values(metadata: &mut Value) {
    for place in ["labels", "annotations"] {
        let entries = metadata.get_mut(place).and_then(Value::as_object_mut);
        for (key, value) in entries.into_iter().flatten() {
            if key.starts_with("llmslo.io/") && (value.is_boolean() || value.is_number()) {
                *value = json!(as_text(value));
            }
        }
    }
}

/// Points the containers' probes that name port `from` by number (the engine's, now llmslo's)
/// at `to`, where the engine moved.
fn move_probes_by_number(spec: &mut Map<String, Value>, from: u64, to: u64) {
    let from_text = from.to_string();
    repoint_probes(
        spec,
        |port| port.as_u64() == Some(from) || port.as_str() == Some(&from_text),
        json!(to),
    );
}

/// Points the containers' probes that name the engine's port (now llmslo's) at the renamed
/// engine port, so the engine's health never depends on the sidecar's.
fn keep_probes_on_the_engine(spec: &mut Map<String, Value>, port_name: &str) {
    repoint_probes(spec, |port| port.as_str() == Some(port_name), json!(ENGINE_PORT_NAME));
}

/// Sets every container probe's port that `names_it` picks to `to`.
fn repoint_probes(spec: &mut Map<String, Value>, names_it: impl Fn(&Value) -> bool, to: Value) {
    let containers = spec.get_mut("containers").and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
            for action in ["httpGet", "tcpSocket"] {
                let port = container
                    .get_mut(probe)
                    .and_then(|p| p.get_mut(action))
                    .and_then(|a| a.get_mut("port"));
                if let Some(port) = port.filter(|port| names_it(port)) {
                    *port = to.clone();
                }
            }
        }
    }
}

/// The engine's port, as the pod declares it or only by the annotated number.
enum EnginePort {
    /// A declared container port: the container's and the port's index.
    Declared { container: usize, port: usize },
    /// A number no container declares (ports: is informational in Kubernetes): the engine
    /// is taken to be the first container.
    Undeclared(u64),
}

/// The engine's port: the annotated one (a declared port's name or number, or any number),
/// else the first port of the first container that declares one.
fn find_engine_port(spec: &Map<String, Value>, wanted: Option<&str>) -> Result<EnginePort, String> {
    let containers = spec
        .get("containers")
        .and_then(Value::as_array)
        .ok_or("has no containers")?;
    for (c, container) in containers.iter().enumerate() {
        for (p, port) in container["ports"].as_array().into_iter().flatten().enumerate() {
            let matches = match wanted {
                None => true,
                Some(w) => {
                    port["name"].as_str() == Some(w)
                        || port["containerPort"].as_u64().map(|n| n.to_string()).as_deref() == Some(w)
                }
            };
            if matches {
                return Ok(EnginePort::Declared { container: c, port: p });
            }
        }
    }
    match wanted {
        Some(w) => match w.parse::<u16>() {
            Ok(number) if number > 0 && !containers.is_empty() => Ok(EnginePort::Undeclared(number.into())),
            _ => Err(format!(
                "annotation {}: no container port is named `{w}`; give a declared port's name, or the \
                 engine's port number (like \"8000\")",
                annotations::ENGINE_PORT
            )),
        },
        None => Err(format!(
            "no container declares a port to take over: set the annotation {}: \"PORT\" to the engine's \
             port number (like \"8000\")",
            annotations::ENGINE_PORT
        )),
    }
}

/// A label or annotation value as text: strings as they are; numbers and booleans, which
/// Kubernetes refuses there, as YAML would print them ([`metadata_warnings`] says so).
fn as_text(value: &Value) -> Option<String> {
    match value {
        Value::String(s) => Some(s.clone()),
        Value::Bool(b) => Some(b.to_string()),
        Value::Number(n) => Some(n.to_string()),
        _ => None,
    }
}

/// The `llmslo.io/` labels and annotations, and which of the two each belongs in.
const KNOWN_KEYS: &[(&str, &str)] = &[
    (INJECT_LABEL, "labels"),
    (annotations::ENGINE_PORT, "annotations"),
    (annotations::ENGINE, "annotations"),
    (annotations::CONFIG_MAP, "annotations"),
    (annotations::CPU, "annotations"),
    (annotations::MEMORY, "annotations"),
    (annotations::SIDECAR, "annotations"),
    (annotations::IMAGE, "annotations"),
    (annotations::GPUS, "annotations"),
    (annotations::INJECTED, "annotations"),
    (annotations::PREFILL_POOL, "annotations"),
    (annotations::LISTEN_PORT, "annotations"),
    (annotations::WARNING, "annotations"),
    (NOTE, "annotations"),
];

/// One thing wrong with a pod template's `llmslo.io/` labels and annotations.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MetadataWarning {
    /// What is wrong, and what to write instead.
    pub text: String,
    /// Whether llmslo does not read the key (unknown, or in the wrong one of the two): what it
    /// says is lost, not only untidy.
    pub unread: bool,
}

/// What is wrong with a pod template's `llmslo.io/` labels and annotations: a key llmslo does
/// not know (with the nearest it does), a key in the wrong one of the two, a value that is not
/// a string (Kubernetes refuses those: quote it).
pub fn metadata_warnings(pod: &Value) -> Vec<MetadataWarning> {
    let mut warnings = Vec::new();
    for place in ["labels", "annotations"] {
        let entries = pod["metadata"][place].as_object().into_iter().flatten();
        for (key, value) in entries.filter(|(key, _)| key.starts_with("llmslo.io/")) {
            let singular = place.trim_end_matches('s');
            match KNOWN_KEYS.iter().find(|(known, _)| known == key) {
                Some((_, home)) if *home != place => warnings.push(MetadataWarning {
                    text: format!("{singular} {key} belongs in metadata.{home}, where llmslo reads it"),
                    unread: true,
                }),
                Some(_) => {}
                None => {
                    let nearest = KNOWN_KEYS
                        .iter()
                        .map(|(known, home)| (strsim::damerau_levenshtein(key, known), *known, *home))
                        .min_by_key(|(distance, _, _)| *distance)
                        .filter(|(distance, _, _)| *distance <= 3);
                    let text = match nearest {
                        Some((_, known, home)) => {
                            format!("unknown {singular} {key}, ignored (did you mean {known}, in metadata.{home}?)")
                        }
                        None => format!("unknown {singular} {key}, ignored"),
                    };
                    warnings.push(MetadataWarning { text, unread: true });
                }
            }
            if !value.is_string() {
                warnings.push(MetadataWarning {
                    text: format!(
                        "{singular} {key}: {value} is not a string, and Kubernetes takes only strings there: \
                         quote it (\"{}\")",
                        as_text(value).unwrap_or_default()
                    ),
                    unread: false,
                });
            }
        }
    }
    warnings
}

/// The `llmslo.io/prefill-pool` annotation, checked member by member: the members as the
/// sidecar's `LLMSLO_PREFILL_POOL` takes them.
fn prefill_pool(annotation: Option<&str>) -> Result<Option<String>, String> {
    let Some(text) = annotation else {
        return Ok(None);
    };
    let members = text
        .split(',')
        .filter(|m| !m.trim().is_empty())
        .map(|m| {
            crate::proxy::relay::pool::PoolMember::parse(m)
                .map(|m| m.to_string())
                .map_err(|e| format!("annotation {}: {e}", annotations::PREFILL_POOL))
        })
        .collect::<Result<Vec<_>, _>>()?;
    Ok((!members.is_empty()).then(|| members.join(",")))
}

/// The warning the injector left on a pod template, if any.
pub fn injected_warning(pod: &Value) -> Option<&str> {
    pod["metadata"]["annotations"][annotations::WARNING].as_str()
}

fn used_ports(spec: &Map<String, Value>) -> Vec<u64> {
    ["containers", "initContainers"]
        .iter()
        .flat_map(|key| spec.get(*key).and_then(Value::as_array).into_iter().flatten())
        .flat_map(|c| c["ports"].as_array().into_iter().flatten())
        .filter_map(|p| p["containerPort"].as_u64())
        .collect()
}

fn free_port(used: &[u64], preferred: u64) -> u64 {
    (preferred..).find(|p| !used.contains(p)).expect("some port is free")
}

mod container;
mod engine;
mod router;

#[cfg(test)]
mod tests;
