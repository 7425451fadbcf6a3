//! The injected sidecar container itself, from the injection's options and the pod's
//! annotations.

use super::{annotations, InjectOptions, CONTAINER, DEFAULT_MEMORY_LIMIT, NO_IMAGE, RELAY_MEMORY_LIMIT};
use crate::record::Role;
use serde_json::{json, Value};

/// How the injected sidecar serves: its role in disaggregated serving, and TLS where the
/// container it stands in front of served TLS.
#[derive(Debug, Default)]
pub(super) struct Serving {
    /// The pod's role, when llm-d names one or the pod has a routing sidecar.
    pub(super) role: Option<Role>,
    /// The prefill relay's address, in front of a routing sidecar, and the prefill pool it
    /// sends legs to.
    pub(super) relay: Option<(String, String)>,
    /// The relay speaks TLS, taking the prefill pods' certificates unverified, as the routing
    /// sidecar does.
    pub(super) relay_tls: bool,
    /// The port's TLS, as the container llmslo moved served it.
    pub(super) tls: Option<ListenTls>,
    /// The volumes holding its certificate, mounted read-only as that container mounts them.
    pub(super) mounts: Vec<Value>,
}

/// Where the injected sidecar's certificate comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) enum ListenTls {
    /// The files the moved container served (its certificate and key).
    Files(String, String),
    /// Made at start, as the moved container would have.
    SelfSigned,
}

/// The sidecar container: its arguments, environment, resources, probes and security context.
pub(super) fn sidecar_container(
    options: &InjectOptions,
    annotation: &dyn Fn(&str) -> Option<String>,
    engine_port: u64,
    listen: u64,
    metrics: u64,
    serving: &Serving,
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
        // As many runtime threads as the CPU request, rounded up: without a CPU limit the
        // runtime would otherwise start one per CPU of the node, and each thread more costs
        // kernel time per token (docs/benchmarks.md, "Worker threads").
        json!({"name": "LLMSLO_WORKER_THREADS",
               "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}}),
    ];
    match annotation(annotations::GPUS).as_deref() {
        None => {}
        Some("all") => env.push(json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})),
        Some(other) => return Err(format!("annotation {}: `{other}` is not `all`", annotations::GPUS)),
    }
    if let Some(role) = serving.role {
        env.push(json!({"name": "LLMSLO_ROLE", "value": role.as_str()}));
    }
    if let Some((relay, pool)) = &serving.relay {
        if relay.starts_with("$(POD_IP)") {
            env.push(json!({"name": "POD_IP", "valueFrom": {"fieldRef": {"fieldPath": "status.podIP"}}}));
        }
        env.push(json!({"name": "LLMSLO_PREFILL_RELAY", "value": relay}));
        env.push(json!({"name": "LLMSLO_PREFILL_POOL", "value": pool}));
        if serving.relay_tls {
            env.push(json!({"name": "LLMSLO_PREFILL_TLS", "value": "true"}));
            env.push(json!({"name": "LLMSLO_PREFILL_INSECURE_SKIP_VERIFY", "value": "true"}));
        }
    }
    let mut mounts = serving.mounts.clone();
    match &serving.tls {
        None => {}
        Some(tls) => {
            // The container behind llmslo serves TLS on 127.0.0.1 with a certificate made for
            // the pod, which llmslo takes unverified there alone.
            env.push(json!({"name": "LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY", "value": "true"}));
            match tls {
                ListenTls::Files(cert, key) => {
                    env.push(json!({"name": "LLMSLO_TLS_CERT_FILE", "value": cert}));
                    env.push(json!({"name": "LLMSLO_TLS_KEY_FILE", "value": key}));
                }
                ListenTls::SelfSigned => env.push(json!({"name": "LLMSLO_TLS_SELF_SIGNED", "value": "true"})),
            }
        }
    }
    if annotation(annotations::CONFIG_MAP).is_some() {
        env.push(json!({"name": "LLMSLO_CONFIG", "value": "/etc/llmslo/llmslo.yaml"}));
        mounts.push(json!({"name": "llmslo-config", "mountPath": "/etc/llmslo", "readOnly": true}));
    }
    let cpu = annotation(annotations::CPU).unwrap_or_else(|| "100m".into());
    let memory = annotation(annotations::MEMORY).unwrap_or_else(|| {
        match serving.relay {
            Some(_) => RELAY_MEMORY_LIMIT,
            None => DEFAULT_MEMORY_LIMIT,
        }
        .into()
    });
    let probe = |path: &str, period: u64| json!({"httpGet": {"path": path, "port": metrics}, "periodSeconds": period});
    let image = annotation(annotations::IMAGE)
        .or_else(|| options.image.clone())
        .ok_or(NO_IMAGE)?;
    let mut container = json!({
        "name": CONTAINER,
        "image": image,
        "args": [
            "run",
            "--upstream", format!("{}://127.0.0.1:{engine_port}", if serving.tls.is_some() { "https" } else { "http" }),
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
