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

use serde_json::{json, Map, Value};

/// The injected sidecar's memory request and limit unless `llmslo.io/memory` says otherwise:
/// the default limits' worst case (docs/configuration.md, "Memory budget") fits under it.
pub const DEFAULT_MEMORY_LIMIT: &str = "128Mi";
/// [`DEFAULT_MEMORY_LIMIT`] in bytes.
pub const DEFAULT_MEMORY_LIMIT_BYTES: u64 = 128 << 20;

/// The pod label that opts in.
pub const INJECT_LABEL: &str = "llmslo.io/inject";
/// The injected container's name (also how injection is recognised, for idempotence).
pub const CONTAINER: &str = "llmslo";
/// The name the engine's own port gets.
pub const ENGINE_PORT_NAME: &str = "llmslo-engine";
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
    /// Set by the injector: the llmslo version injected.
    pub const INJECTED: &str = "llmslo.io/injected";
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
    /// Sidecar image.
    pub image: String,
    /// Native or classic sidecar.
    pub mode: SidecarMode,
}

impl Default for InjectOptions {
    fn default() -> Self {
        Self {
            image: format!("ghcr.io/llmslo/llmslo:{}", env!("CARGO_PKG_VERSION")),
            mode: SidecarMode::Native,
        }
    }
}

/// Why a pod template that opted in could not be injected.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{object}: {message}")]
pub struct InjectError {
    /// `Kind/name` of the object.
    pub object: String,
    /// What is wrong.
    pub message: String,
}

/// Injects every document of a YAML stream; returns the stream and how many pod templates changed.
pub fn inject_yaml(input: &str, options: &InjectOptions) -> Result<(String, usize), InjectError> {
    let mut out = Vec::new();
    let mut changed = 0;
    for document in serde_yaml::Deserializer::from_str(input) {
        let mut value: Value = serde::Deserialize::deserialize(document).map_err(|e| InjectError {
            object: "input".into(),
            message: format!("not valid YAML: {e}"),
        })?;
        if value.is_null() {
            continue;
        }
        changed += inject_object(&mut value, options)?;
        out.push(serde_yaml::to_string(&value).expect("a JSON value serializes as YAML"));
    }
    Ok((out.join("---\n"), changed))
}

/// Injects one object (a List's items too); returns how many pod templates changed.
pub fn inject_object(object: &mut Value, options: &InjectOptions) -> Result<usize, InjectError> {
    let kind = object["kind"].as_str().unwrap_or_default().to_string();
    let name = object["metadata"]["name"].as_str().unwrap_or("?").to_string();
    let label = format!("{kind}/{name}");
    let template = match kind.as_str() {
        "List" => {
            let mut changed = 0;
            for item in object["items"].as_array_mut().into_iter().flatten() {
                changed += inject_object(item, options)?;
            }
            return Ok(changed);
        }
        "Pod" => Some(object),
        "Deployment" | "StatefulSet" | "DaemonSet" | "ReplicaSet" | "Job" | "ReplicationController" => {
            object.get_mut("spec").and_then(|s| s.get_mut("template"))
        }
        "CronJob" => object.pointer_mut("/spec/jobTemplate/spec/template"),
        _ => None,
    };
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
    if meta["labels"][INJECT_LABEL].as_str() != Some("true") {
        return Ok(false);
    }
    let annotation = |key: &str| meta["annotations"][key].as_str().map(str::to_string);
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
    let (engine_index, port_index) = find_engine_port(spec, annotation(annotations::ENGINE_PORT).as_deref())?;
    let engine_port = spec["containers"][engine_index]["ports"][port_index].clone();
    let engine_number = engine_port["containerPort"]
        .as_u64()
        .ok_or("the engine's port has no containerPort")?;
    let service_name = engine_port["name"].as_str().map(str::to_string);
    let used = used_ports(spec);
    let listen = free_port(&used, 8080);
    let metrics = free_port(&[used.as_slice(), &[listen]].concat(), 9464);

    // The engine keeps listening where it did; its port entry is renamed.
    let port_entry = &mut spec.get_mut("containers").expect("found above")[engine_index]["ports"][port_index];
    port_entry["name"] = json!(ENGINE_PORT_NAME);

    if let Some(name) = &service_name {
        keep_probes_on_the_engine(spec, name);
    }
    let facing = service_name.clone().unwrap_or_else(|| "llmslo-http".to_string());
    let sidecar_ports = json!([
        {"name": facing, "containerPort": listen, "protocol": "TCP"},
        {"name": METRICS_PORT_NAME, "containerPort": metrics, "protocol": "TCP"},
    ]);
    let mut sidecar = sidecar_container(options, &annotation, engine_number, listen, metrics)?;
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
            let engine = &mut spec.get_mut("containers").expect("found above")[engine_index];
            let ports = engine["ports"].as_array_mut().expect("found above");
            ports.extend(sidecar_ports.as_array().expect("built above").iter().cloned());
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
    if service_name.is_none() {
        annotations.insert(
            "llmslo.io/note".into(),
            json!("the engine's port had no name: point Services at targetPort llmslo-http to go through llmslo"),
        );
    }
    Ok(true)
}

/// Points the containers' probes that name the engine's port (now llmslo's) at the renamed
/// engine port, so the engine's health never depends on the sidecar's.
fn keep_probes_on_the_engine(spec: &mut Map<String, Value>, port_name: &str) {
    let containers = spec.get_mut("containers").and_then(Value::as_array_mut);
    for container in containers.into_iter().flatten() {
        for probe in ["readinessProbe", "livenessProbe", "startupProbe"] {
            for action in ["httpGet", "tcpSocket"] {
                let port = container
                    .get_mut(probe)
                    .and_then(|p| p.get_mut(action))
                    .and_then(|a| a.get_mut("port"));
                if let Some(port) = port.filter(|port| port.as_str() == Some(port_name)) {
                    *port = json!(ENGINE_PORT_NAME);
                }
            }
        }
    }
}

/// The container and port index of the engine's port: the annotated one (name or number),
/// else the first port of the first container that has one.
fn find_engine_port(spec: &Map<String, Value>, wanted: Option<&str>) -> Result<(usize, usize), String> {
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
                return Ok((c, p));
            }
        }
    }
    Err(match wanted {
        Some(w) => format!(
            "annotation {}: no container port named or numbered `{w}`",
            annotations::ENGINE_PORT
        ),
        None => format!(
            "no container declares a port to take over; set the {} annotation",
            annotations::ENGINE_PORT
        ),
    })
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

fn sidecar_container(
    options: &InjectOptions,
    annotation: &dyn Fn(&str) -> Option<String>,
    engine_port: u64,
    listen: u64,
    metrics: u64,
) -> Result<Value, String> {
    let engine = annotation(annotations::ENGINE).unwrap_or_else(|| "auto".into());
    if !["auto", "vllm", "tgi", "sglang", "llamacpp", "openai"].contains(&engine.as_str()) {
        return Err(format!(
            "annotation {}: `{engine}` is not a known engine",
            annotations::ENGINE
        ));
    }
    let mut env = vec![
        json!({"name": "LLMSLO_LOG_FORMAT", "value": "json"}),
        json!({"name": "LLMSLO_ENGINE", "value": engine}),
    ];
    match annotation(annotations::GPUS).as_deref() {
        None => {}
        Some("all") => env.push(json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})),
        Some(other) => return Err(format!("annotation {}: `{other}` is not `all`", annotations::GPUS)),
    }
    let mut mounts = Vec::new();
    if annotation(annotations::CONFIG_MAP).is_some() {
        env.push(json!({"name": "LLMSLO_CONFIG", "value": "/etc/llmslo/llmslo.yaml"}));
        mounts.push(json!({"name": "llmslo-config", "mountPath": "/etc/llmslo", "readOnly": true}));
    }
    let cpu = annotation(annotations::CPU).unwrap_or_else(|| "100m".into());
    let memory = annotation(annotations::MEMORY).unwrap_or_else(|| DEFAULT_MEMORY_LIMIT.into());
    let probe = |path: &str, period: u64| json!({"httpGet": {"path": path, "port": metrics}, "periodSeconds": period});
    let mut container = json!({
        "name": CONTAINER,
        "image": annotation(annotations::IMAGE).unwrap_or_else(|| options.image.clone()),
        "args": [
            "run",
            "--upstream", format!("http://127.0.0.1:{engine_port}"),
            "--listen", format!("0.0.0.0:{listen}"),
            "--metrics-listen", format!("0.0.0.0:{metrics}"),
        ],
        "env": env,
        "volumeMounts": mounts,
        "resources": {"requests": {"cpu": cpu, "memory": memory}, "limits": {"memory": memory}},
        "readinessProbe": probe("/readyz", 5),
        "livenessProbe": probe("/healthz", 10),
        "securityContext": {
            "allowPrivilegeEscalation": false,
            "readOnlyRootFilesystem": true,
            "runAsNonRoot": true,
            "runAsUser": 65532,
            "capabilities": {"drop": ["ALL"]},
        },
    });
    if mounts.is_empty() {
        container
            .as_object_mut()
            .expect("built as an object")
            .remove("volumeMounts");
    }
    Ok(container)
}

#[cfg(test)]
mod tests;
