//! The pod-template transform.

use super::*;

const DEPLOYMENT: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm}
spec:
  selector: {matchLabels: {app: vllm}}
  template:
    metadata:
      labels: {app: vllm, llmslo.io/inject: "true"}
    spec:
      containers:
        - name: vllm
          image: vllm/vllm-openai:v0.32.0
          args: [--model, meta-llama/Llama-3.1-8B-Instruct, --port, "8000"]
          ports: [{name: http, containerPort: 8000}]
"#;

fn options() -> InjectOptions {
    InjectOptions::with_image("registry.example/llmslo:test")
}

fn inject(yaml: &str, mode: SidecarMode) -> Value {
    let options = InjectOptions { mode, ..options() };
    let Injected {
        output: out, changed, ..
    } = inject_yaml(yaml, &options).unwrap();
    assert_eq!(changed, 1);
    serde_yaml::from_str(&out).unwrap()
}

fn port_names(container: &Value) -> Vec<(String, u64)> {
    container["ports"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| {
            (
                p["name"].as_str().unwrap().to_string(),
                p["containerPort"].as_u64().unwrap(),
            )
        })
        .collect()
}

#[test]
fn native_sidecar_takes_over_the_named_port() {
    let d = inject(DEPLOYMENT, SidecarMode::Native);
    let spec = &d["spec"]["template"]["spec"];
    let sidecar = &spec["initContainers"][0];
    assert_eq!(sidecar["name"], "llmslo");
    assert_eq!(sidecar["restartPolicy"], "Always");
    assert_eq!(
        sidecar["args"],
        json!([
            "run",
            "--upstream",
            "http://127.0.0.1:8000",
            "--listen",
            "0.0.0.0:8080",
            "--metrics-listen",
            "0.0.0.0:9464"
        ])
    );
    // The Service's `targetPort: http` now lands on llmslo (declared on the engine container).
    assert_eq!(
        port_names(&spec["containers"][0]),
        [
            ("llmslo-engine".into(), 8000),
            ("http".into(), 8080),
            ("llmslo-metrics".into(), 9464)
        ]
    );
    assert!(
        sidecar.get("ports").is_none(),
        "no named ports on an init container (< 1.32)"
    );
    assert_eq!(
        sidecar["readinessProbe"]["httpGet"],
        json!({"path": "/readyz", "port": 9464})
    );
    assert_eq!(
        sidecar["livenessProbe"]["httpGet"],
        json!({"path": "/healthz", "port": 9464})
    );
    assert_eq!(
        d["spec"]["template"]["metadata"]["annotations"]["llmslo.io/injected"],
        env!("CARGO_PKG_VERSION")
    );
}

#[test]
fn classic_sidecar_carries_its_own_ports() {
    let d = inject(DEPLOYMENT, SidecarMode::Classic);
    let containers = d["spec"]["template"]["spec"]["containers"].as_array().unwrap();
    assert_eq!(containers.len(), 2);
    assert_eq!(port_names(&containers[0]), [("llmslo-engine".into(), 8000)]);
    assert_eq!(
        port_names(&containers[1]),
        [("http".into(), 8080), ("llmslo-metrics".into(), 9464)]
    );
    assert!(d["spec"]["template"]["spec"].get("initContainers").is_none());
}

#[test]
fn injecting_twice_changes_nothing() {
    let options = options();
    let once = inject_yaml(DEPLOYMENT, &options).unwrap().output;
    let Injected {
        output: twice, changed, ..
    } = inject_yaml(&once, &options).unwrap();
    assert_eq!(changed, 0);
    assert_eq!(once, twice);
}

#[test]
fn only_labelled_templates_and_known_kinds_change() {
    let unlabelled = DEPLOYMENT.replace("llmslo.io/inject: \"true\"", "llmslo.io/inject: \"false\"");
    let Injected {
        output: out, changed, ..
    } = inject_yaml(&unlabelled, &options()).unwrap();
    assert_eq!(changed, 0);
    assert_eq!(
        serde_yaml::from_str::<Value>(&out).unwrap(),
        serde_yaml::from_str::<Value>(&unlabelled).unwrap()
    );
    let service =
        "apiVersion: v1\nkind: Service\nmetadata: {name: vllm}\nspec: {ports: [{port: 80, targetPort: http}]}\n";
    assert_eq!(inject_yaml(service, &options()).unwrap().changed, 0);
}

#[test]
fn multi_document_streams_lists_pods_statefulsets_and_cronjobs() {
    let pod_spec = "spec: {containers: [{name: tgi, image: tgi, ports: [{name: web, containerPort: 80}]}]}";
    let labels = "labels: {llmslo.io/inject: \"true\"}";
    let stream = format!(
        "apiVersion: v1\nkind: Pod\nmetadata: {{name: p, {labels}}}\n{pod_spec}\n---\n\
         apiVersion: v1\nkind: List\nitems:\n  - apiVersion: apps/v1\n    kind: StatefulSet\n    metadata: {{name: s}}\n    \
         spec: {{template: {{metadata: {{{labels}}}, {pod_spec}}}}}\n---\n\
         apiVersion: batch/v1\nkind: CronJob\nmetadata: {{name: c}}\nspec: {{jobTemplate: {{spec: {{template: {{metadata: {{{labels}}}, {pod_spec}}}}}}}}}\n"
    );
    let Injected {
        output: out, changed, ..
    } = inject_yaml(&stream, &options()).unwrap();
    assert_eq!(changed, 3);
    assert_eq!(out.matches("name: llmslo\n").count(), 3);
    assert_eq!(out.matches("--upstream\n").count(), 3);
    assert!(out.contains("http://127.0.0.1:80"));
}

#[test]
fn annotations_override_the_defaults() {
    let annotated = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/engine-port: \"8000\", llmslo.io/engine: vllm, \
         llmslo.io/slo-configmap: chat-slos, llmslo.io/cpu: 250m, llmslo.io/memory: 256Mi, llmslo.io/sidecar: classic, \
         llmslo.io/image: registry.local/llmslo:dev}",
    );
    let d = inject(&annotated, SidecarMode::Native);
    let spec = &d["spec"]["template"]["spec"];
    let sidecar = &spec["containers"][1];
    assert_eq!(sidecar["image"], "registry.local/llmslo:dev");
    assert_eq!(
        sidecar["resources"],
        json!({"requests": {"cpu": "250m", "memory": "256Mi"}, "limits": {"memory": "256Mi"}})
    );
    assert!(sidecar["env"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "LLMSLO_ENGINE", "value": "vllm"})));
    // The runtime's threads follow the CPU request (the downward API rounds 250m up to 1).
    assert!(sidecar["env"].as_array().unwrap().contains(&json!({
        "name": "LLMSLO_WORKER_THREADS",
        "valueFrom": {"resourceFieldRef": {"resource": "requests.cpu", "divisor": "1"}}
    })));
    assert!(sidecar["env"]
        .as_array()
        .unwrap()
        .contains(&json!({"name": "LLMSLO_CONFIG", "value": "/etc/llmslo/llmslo.yaml"})));
    assert_eq!(
        spec["volumes"],
        json!([{"name": "llmslo-config", "configMap": {"name": "chat-slos", "optional": true}}]),
        "optional: a missing ConfigMap never blocks the pod"
    );
}

#[test]
fn ports_in_use_are_avoided_and_unnamed_ports_are_flagged() {
    let busy = DEPLOYMENT.replace(
        "ports: [{name: http, containerPort: 8000}]",
        "ports: [{containerPort: 8000}, {name: other, containerPort: 8080}, {name: m, containerPort: 9464}]",
    );
    let d = inject(&busy, SidecarMode::Classic);
    let sidecar = &d["spec"]["template"]["spec"]["containers"][1];
    assert_eq!(
        port_names(sidecar),
        [("llmslo-http".into(), 8081), ("llmslo-metrics".into(), 9465)]
    );
    assert!(d["spec"]["template"]["metadata"]["annotations"]["llmslo.io/note"]
        .as_str()
        .unwrap()
        .contains("llmslo-http"));
}

#[test]
fn bad_annotations_and_portless_pods_are_clear_errors() {
    let bad = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/engine-port: grpc}",
    );
    let error = inject_yaml(&bad, &options()).unwrap_err();
    assert_eq!(error.object, "Deployment/vllm");
    assert!(
        error.message.contains("llmslo.io/engine-port") && error.message.contains("grpc"),
        "{error}"
    );
    let portless = DEPLOYMENT.replace("          ports: [{name: http, containerPort: 8000}]\n", "");
    assert!(inject_yaml(&portless, &options())
        .unwrap_err()
        .message
        .contains("llmslo.io/engine-port"));
    let engine = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/engine: triton}",
    );
    assert!(inject_yaml(&engine, &options()).unwrap_err().message.contains("triton"));
    let gpus = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/gpus: \"0,1\"}",
    );
    assert_eq!(
        inject_yaml(&gpus, &options()).unwrap_err().message,
        "annotation llmslo.io/gpus: `0,1` is not `all`"
    );
    assert!(inject_yaml("kind: [", &options()).unwrap_err().message.contains("YAML"));
}

#[test]
fn engine_probes_on_the_taken_over_port_keep_probing_the_engine() {
    let with_probes = DEPLOYMENT.replace(
        "          ports: [{name: http, containerPort: 8000}]\n",
        "          ports: [{name: http, containerPort: 8000}]
          readinessProbe: {httpGet: {path: /health, port: http}}
          livenessProbe: {tcpSocket: {port: 8000}}
          startupProbe: {httpGet: {path: /health, port: http}, failureThreshold: 60}
",
    );
    let d = inject(&with_probes, SidecarMode::Native);
    let engine = &d["spec"]["template"]["spec"]["containers"][0];
    assert_eq!(
        engine["readinessProbe"],
        json!({"httpGet": {"path": "/health", "port": "llmslo-engine"}})
    );
    assert_eq!(
        engine["livenessProbe"],
        json!({"tcpSocket": {"port": 8000}}),
        "a number already names the engine"
    );
    assert_eq!(engine["startupProbe"]["httpGet"]["port"], "llmslo-engine");
    assert_eq!(engine["startupProbe"]["failureThreshold"], 60);
}

#[test]
fn gpus_all_lets_the_sidecar_see_the_nodes_gpus() {
    let plain = inject(DEPLOYMENT, SidecarMode::Native);
    let env = |d: &Value| d["spec"]["template"]["spec"]["initContainers"][0]["env"].clone();
    assert!(!env(&plain).to_string().contains("NVIDIA_VISIBLE_DEVICES"));
    let annotated = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/gpus: all}",
    );
    let d = inject(&annotated, SidecarMode::Native);
    assert!(env(&d)
        .as_array()
        .unwrap()
        .contains(&json!({"name": "NVIDIA_VISIBLE_DEVICES", "value": "all"})));
}

const SERVICES: &str = r#"
apiVersion: v1
kind: Service
metadata: {name: by-number}
spec: {selector: {app: vllm}, ports: [{name: web, port: 80, targetPort: 8000}]}
---
apiVersion: v1
kind: Service
metadata: {name: no-target}
spec: {selector: {app: vllm}, ports: [{port: 8000}]}
---
apiVersion: v1
kind: Service
metadata: {name: by-name}
spec: {selector: {app: vllm}, ports: [{port: 80, targetPort: http}]}
---
apiVersion: v1
kind: Service
metadata: {name: engine-name}
spec: {selector: {app: vllm}, ports: [{port: 80, targetPort: llmslo-engine}]}
---
apiVersion: v1
kind: Service
metadata: {name: other-app}
spec: {selector: {app: tgi}, ports: [{port: 80, targetPort: 8000}]}
---
apiVersion: v1
kind: Service
metadata: {name: other-namespace, namespace: team-b}
spec: {selector: {app: vllm}, ports: [{port: 80, targetPort: 8000}]}
"#;

#[test]
fn services_that_target_the_engine_port_by_number_or_engine_name_are_found() {
    let stream = format!("{DEPLOYMENT}---{SERVICES}");
    let injected = inject_yaml(&stream, &options()).unwrap();
    let found: Vec<(&str, &str, &str)> = injected
        .bypasses
        .iter()
        .map(|b| (b.service.as_str(), b.port.as_str(), b.target.as_str()))
        .collect();
    assert_eq!(
        found,
        [
            ("Service/by-number", "web", "8000"),
            ("Service/no-target", "8000", "8000"),
            ("Service/engine-name", "80", "llmslo-engine"),
        ]
    );
    let warning = injected.bypasses[0].to_string();
    assert!(
        warning.contains("bypasses llmslo") && warning.contains("targetPort: http"),
        "{warning}"
    );
    // Without --rewrite-services the Services are left as they were.
    assert!(injected.output.contains("targetPort: 8000"));

    // Found the same way in a stream that was injected before (the sidecar's args tell).
    let again = inject_yaml(&injected.output, &options()).unwrap();
    assert_eq!(again.changed, 0);
    assert_eq!(again.bypasses, injected.bypasses);
}

#[test]
fn rewrite_services_points_them_at_the_sidecar() {
    let stream = format!("{DEPLOYMENT}---{SERVICES}");
    let options = InjectOptions {
        rewrite_services: true,
        ..options()
    };
    let injected = inject_yaml(&stream, &options).unwrap();
    assert_eq!(injected.bypasses.len(), 3);
    assert!(injected.bypasses.iter().all(|b| b.rewritten));
    assert!(injected.bypasses[0]
        .to_string()
        .contains("rewrote targetPort 8000 to http"));
    let services: Vec<Value> = serde_yaml::Deserializer::from_str(&injected.output)
        .map(|d| serde::Deserialize::deserialize(d).unwrap())
        .filter(|v: &Value| v["kind"] == "Service")
        .collect();
    let target = |name: &str| {
        let service = services.iter().find(|s| s["metadata"]["name"] == name).unwrap();
        service["spec"]["ports"][0]["targetPort"].clone()
    };
    for name in ["by-number", "no-target", "engine-name", "by-name"] {
        assert_eq!(target(name), "http", "{name}");
    }
    assert_eq!(target("other-app"), 8000, "a Service of other pods is left alone");
    assert_eq!(target("other-namespace"), 8000);
    // Once rewritten, nothing bypasses.
    assert!(inject_yaml(&injected.output, &options).unwrap().bypasses.is_empty());
}

#[test]
fn an_unnamed_engine_port_is_reached_through_llmslo_http() {
    let unnamed = DEPLOYMENT.replace("{name: http, containerPort: 8000}", "{containerPort: 8000}");
    let stream = format!("{unnamed}---{SERVICES}");
    let injected = inject_yaml(&stream, &options()).unwrap();
    assert!(injected.bypasses.iter().all(|b| b.facing == "llmslo-http"));
    assert_eq!(injected.bypasses.len(), 3);
}

#[test]
fn without_an_image_injection_says_how_to_build_one() {
    let options = InjectOptions {
        image: None,
        ..options()
    };
    let error = inject_yaml(DEPLOYMENT, &options).unwrap_err();
    assert!(error.message.contains("docker build"), "{error}");
    assert!(error.message.contains("--image"), "{error}");
    // A pod that names its image needs none.
    let annotated = DEPLOYMENT.replace(
        "labels: {app: vllm, llmslo.io/inject: \"true\"}",
        "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/image: registry.local/llmslo:dev}",
    );
    assert_eq!(inject_yaml(&annotated, &options).unwrap().changed, 1);
}

#[test]
fn the_engine_port_annotation_works_without_a_ports_entry() {
    let portless = DEPLOYMENT
        .replace("          ports: [{name: http, containerPort: 8000}]\n", "")
        .replace(
            "labels: {app: vllm, llmslo.io/inject: \"true\"}",
            "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/engine-port: \"8000\"}",
        );
    for mode in [SidecarMode::Native, SidecarMode::Classic] {
        let d = inject(&portless, mode);
        let spec = &d["spec"]["template"]["spec"];
        let sidecar = spec["initContainers"][0].clone();
        let sidecar = if sidecar.is_null() {
            spec["containers"][1].clone()
        } else {
            sidecar
        };
        let args = sidecar["args"].as_array().unwrap();
        assert!(args.contains(&json!("http://127.0.0.1:8000")), "{args:?}");
        assert!(args.contains(&json!("0.0.0.0:8080")), "{args:?}");
        let ports = match mode {
            SidecarMode::Native => port_names(&spec["containers"][0]),
            SidecarMode::Classic => port_names(&sidecar),
        };
        assert_eq!(ports, [("llmslo-http".into(), 8080), ("llmslo-metrics".into(), 9464)]);
        assert!(d["spec"]["template"]["metadata"]["annotations"]["llmslo.io/note"]
            .as_str()
            .unwrap()
            .contains("llmslo-http"));
    }
    // The listen port never collides with the undeclared engine port.
    let on_8080 = DEPLOYMENT
        .replace("          ports: [{name: http, containerPort: 8000}]\n", "")
        .replace(
            "labels: {app: vllm, llmslo.io/inject: \"true\"}",
            "labels: {app: vllm, llmslo.io/inject: \"true\"}\n      annotations: {llmslo.io/engine-port: \"8080\"}",
        );
    let d = inject(&on_8080, SidecarMode::Native);
    let args = &d["spec"]["template"]["spec"]["initContainers"][0]["args"];
    assert!(args.as_array().unwrap().contains(&json!("0.0.0.0:8081")), "{args}");
    // Without the annotation, the error says what to set, and that works (above).
    let bare = DEPLOYMENT.replace("          ports: [{name: http, containerPort: 8000}]\n", "");
    let message = inject_yaml(&bare, &options()).unwrap_err().message;
    assert!(
        message.contains("llmslo.io/engine-port: \"PORT\"") && message.contains("(like \"8000\")"),
        "{message}"
    );
}

#[test]
fn unknown_misplaced_and_unquoted_llmslo_keys_are_warned_with_the_nearest_key() {
    let annotated = |annotations: &str| {
        DEPLOYMENT.replace(
            "labels: {app: vllm, llmslo.io/inject: \"true\"}",
            &format!("labels: {{app: vllm, llmslo.io/inject: \"true\"}}\n      annotations: {{{annotations}}}"),
        )
    };
    let typo = inject_yaml(&annotated("llmslo.io/slo-config-map: chat-slos"), &options()).unwrap();
    assert_eq!(
        typo.changed, 1,
        "a typo warns here; the command refuses it unless --lenient"
    );
    assert_eq!(typo.unread_keys, 1);
    assert_eq!(
        typo.warnings,
        ["Deployment/vllm: unknown annotation llmslo.io/slo-config-map, ignored \
          (did you mean llmslo.io/slo-configmap, in metadata.annotations?)"]
    );
    let far = inject_yaml(&annotated("llmslo.io/whatever-else: x"), &options()).unwrap();
    assert_eq!(
        far.warnings,
        ["Deployment/vllm: unknown annotation llmslo.io/whatever-else, ignored"]
    );
    let misplaced = inject_yaml(&annotated("llmslo.io/inject: \"true\""), &options()).unwrap();
    assert_eq!(misplaced.unread_keys, 1);
    assert_eq!(
        misplaced.warnings,
        ["Deployment/vllm: annotation llmslo.io/inject belongs in metadata.labels, where llmslo reads it"]
    );
    // Unquoted values are read as the strings they spell, warned, and written quoted.
    let unquoted = DEPLOYMENT.replace(
        "llmslo.io/inject: \"true\"}",
        "llmslo.io/inject: true}\n      annotations: {llmslo.io/engine-port: 8000}",
    );
    let injected = inject_yaml(&unquoted, &options()).unwrap();
    assert_eq!(injected.changed, 1, "an unquoted true still opts in");
    assert_eq!(injected.unread_keys, 0, "read, and written quoted");
    assert_eq!(
        injected.warnings,
        [
            "Deployment/vllm: label llmslo.io/inject: true is not a string, and Kubernetes takes only strings \
             there: quote it (\"true\")",
            "Deployment/vllm: annotation llmslo.io/engine-port: 8000 is not a string, and Kubernetes takes only \
             strings there: quote it (\"8000\")",
        ]
    );
    let d: Value = serde_yaml::from_str(&injected.output).unwrap();
    let metadata = &d["spec"]["template"]["metadata"];
    assert_eq!(metadata["labels"]["llmslo.io/inject"], "true");
    assert_eq!(metadata["annotations"]["llmslo.io/engine-port"], "8000");
    // A template that does not opt in is still checked: a misspelt label is why.
    let misspelt = DEPLOYMENT.replace("llmslo.io/inject: \"true\"", "llmslo.io/injct: \"true\"");
    let untouched = inject_yaml(&misspelt, &options()).unwrap();
    assert_eq!(untouched.changed, 0);
    assert_eq!(
        untouched.warnings,
        ["Deployment/vllm: unknown label llmslo.io/injct, ignored (did you mean llmslo.io/inject, in metadata.labels?)"]
    );
    assert!(inject_yaml(DEPLOYMENT, &options()).unwrap().warnings.is_empty());
}

#[test]
fn the_defaults_fit_the_memory_limit_the_injector_gives() {
    let config = crate::config::Config::from_yaml("upstream: http://127.0.0.1:8000\n").unwrap();
    let limit = DEFAULT_MEMORY_LIMIT_BYTES;
    let worst = config.worst_case_memory_bytes(1);
    assert!(
        worst < limit,
        "worst case {} MiB, limit {} MiB",
        worst >> 20,
        limit >> 20
    );
    assert_eq!(
        worst >> 20,
        123,
        "the arithmetic in docs/configuration.md, one worker thread"
    );
    let merge = crate::config::Config::from_yaml("upstream: http://127.0.0.1:8000\nengine_metrics: merge\n").unwrap();
    assert_eq!(merge.worst_case_memory_bytes(1) >> 20, 127, "with merge");
    assert!(merge.worst_case_memory_bytes(1) < limit);
    assert_eq!(DEFAULT_MEMORY_LIMIT, format!("{}Mi", limit >> 20));
    let https = crate::config::Config::from_yaml(
        "upstream: https://127.0.0.1:8000
",
    )
    .unwrap();
    assert_eq!(
        https.engine_h2_bytes() >> 20,
        4,
        "1024 h2 stream windows: docs/configuration.md"
    );
    assert_eq!(https.worst_case_memory_bytes(1), worst + https.engine_h2_bytes());
    assert!(https.worst_case_memory_bytes(1) < limit, "an https engine fits too");
}

#[test]
fn a_relaying_sidecar_counts_the_relays_legs_and_gets_room_for_them() {
    let pool = "prefill_pool: [10.0.0.0/24:8000]\n";
    let plain =
        crate::config::Config::from_yaml(&format!("upstream: http://127.0.0.1:8000\nrole: decode\n{pool}")).unwrap();
    let relaying = crate::config::Config::from_yaml(&format!(
        "upstream: http://127.0.0.1:8000\nrole: decode\nprefill_relay: 127.0.0.1:8001\n{pool}"
    ))
    .unwrap();
    let legs = relaying.worst_case_memory_bytes(1) - plain.worst_case_memory_bytes(1);
    assert_eq!(legs, relaying.relay_bytes());
    assert_eq!(
        legs >> 20,
        52,
        "1024 legs, each a connection in and one out: docs/configuration.md"
    );
    assert!(plain.worst_case_memory_bytes(1) < DEFAULT_MEMORY_LIMIT_BYTES);
    assert!(relaying.worst_case_memory_bytes(1) > DEFAULT_MEMORY_LIMIT_BYTES);
    assert_eq!(relaying.worst_case_memory_bytes(1) >> 20, 175);
    assert!(relaying.worst_case_memory_bytes(1) < RELAY_MEMORY_LIMIT_BYTES);
    assert_eq!(RELAY_MEMORY_LIMIT, format!("{}Mi", RELAY_MEMORY_LIMIT_BYTES >> 20));
}

/// An llm-d decode pod as llm-d's chart makes it: the routing sidecar as a native sidecar on
/// the port routers use, the engine behind it.
const LLM_D_DECODE: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: qwen-decode}
spec:
  selector: {matchLabels: {app: qwen}}
  template:
    metadata:
      labels: {app: qwen, llm-d.ai/role: decode, llmslo.io/inject: "true"}
      annotations: {llmslo.io/prefill-pool: "qwen-prefill.llm-d.svc.cluster.local:8000"}
    spec:
      initContainers:
        - name: routing-proxy
          image: ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0
          args: [--port=8000, --vllm-port=8200, --connector=nixlv2]
          ports: [{containerPort: 8000}]
          restartPolicy: Always
      containers:
        - name: vllm
          image: ghcr.io/llm-d/llm-d-cuda:v0.3.1
          args: [--port, "8200", --kv-transfer-config, '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
          ports: [{containerPort: 8200}]
"#;

#[test]
fn in_an_llm_d_decode_pod_llmslo_takes_the_routing_sidecars_port_and_relays_its_prefill_legs() {
    let d = inject(LLM_D_DECODE, SidecarMode::Native);
    let spec = &d["spec"]["template"]["spec"];
    let llmslo = &spec["initContainers"][0];
    let routing = &spec["initContainers"][1];
    assert_eq!(
        (&llmslo["name"], &routing["name"]),
        (&json!("llmslo"), &json!("routing-proxy"))
    );
    let args: Vec<&str> = llmslo["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap())
        .collect();
    // Clients (the router, by number) reach llmslo; llmslo the routing sidecar; it the engine.
    // The routing sidecar serves TLS unless told not to: so does llmslo, and it reaches the
    // moved sidecar over TLS.
    assert_eq!(
        args,
        [
            "run",
            "--upstream",
            "https://127.0.0.1:8100",
            "--listen",
            "0.0.0.0:8000",
            "--metrics-listen",
            "0.0.0.0:9464"
        ]
    );
    assert_eq!(
        routing["args"],
        json!(["--port=8100", "--vllm-port=8200", "--connector=nixlv2"])
    );
    assert_eq!(
        routing["ports"],
        json!([{"containerPort": 8100, "name": ENGINE_PORT_NAME}])
    );
    let env = llmslo["env"].as_array().unwrap();
    let value = |name: &str| env.iter().find(|e| e["name"] == name).map(|e| e["value"].clone());
    assert_eq!(value("LLMSLO_ROLE"), Some(json!("decode")));
    assert_eq!(value("LLMSLO_PREFILL_RELAY"), Some(json!("127.0.0.1:8299")));
    assert_eq!(
        value("LLMSLO_PREFILL_POOL"),
        Some(json!("qwen-prefill.llm-d.svc.cluster.local:8000")),
        "the relay sends legs to the pool alone"
    );
    assert_eq!(value("POD_IP"), None);
    assert_eq!(
        value("LLMSLO_TLS_SELF_SIGNED"),
        Some(json!("true")),
        "as the sidecar made its own"
    );
    assert_eq!(value("LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY"), Some(json!("true")));
    assert_eq!(
        llmslo["resources"]["limits"]["memory"], RELAY_MEMORY_LIMIT,
        "room for the relay's legs"
    );
    let declared = spec["containers"][0]["ports"].as_array().unwrap();
    assert!(declared.contains(&json!({"name": "llmslo-http", "containerPort": 8000, "protocol": "TCP"})));
    assert!(d["spec"]["template"]["metadata"]["annotations"].get(NOTE).is_none());

    // With SSRF protection the routing sidecar only sends legs to its pool's pods: the relay
    // is on the pod's IP.
    let protected = LLM_D_DECODE.replace(
        "--connector=nixlv2]",
        "--connector=nixlv2, -enable-ssrf-protection=true]",
    );
    let d = inject(&protected, SidecarMode::Native);
    let env = d["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    let value = |name: &str| env.iter().find(|e| e["name"] == name).cloned();
    assert_eq!(value("LLMSLO_PREFILL_RELAY").unwrap()["value"], "$(POD_IP):8299");
    let pod_ip = env
        .iter()
        .position(|e| e["name"] == "POD_IP")
        .expect("POD_IP from the downward API");
    let relay = env.iter().position(|e| e["name"] == "LLMSLO_PREFILL_RELAY").unwrap();
    assert!(pod_ip < relay, "defined before the value that names it");
}

#[test]
fn an_llm_d_decode_pod_without_its_prefill_pool_gets_no_relay_and_says_so() {
    let unnamed = LLM_D_DECODE.replace(
        "      annotations: {llmslo.io/prefill-pool: \"qwen-prefill.llm-d.svc.cluster.local:8000\"}\n",
        "",
    );
    let injected = inject_yaml(&unnamed, &InjectOptions::with_image("llmslo:test")).unwrap();
    let d: Value = serde_yaml::from_str(&injected.output).unwrap();
    let env = d["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    assert!(env.contains(&json!({"name": "LLMSLO_ROLE", "value": "decode"})));
    assert!(
        !env.iter()
            .any(|e| e["name"] == "LLMSLO_PREFILL_RELAY" || e["name"] == "LLMSLO_PREFILL_POOL"),
        "no pool, no relay: {env:?}"
    );
    assert_eq!(
        d["spec"]["template"]["spec"]["initContainers"][0]["resources"]["limits"]["memory"],
        DEFAULT_MEMORY_LIMIT
    );
    let warning = d["spec"]["template"]["metadata"]["annotations"][annotations::WARNING]
        .as_str()
        .unwrap();
    assert!(
        warning.contains("prefill part") && warning.contains(annotations::PREFILL_POOL),
        "{warning}"
    );
    assert_eq!(injected.warnings.len(), 1, "{:?}", injected.warnings);
    assert!(injected.warnings[0].starts_with("Deployment/qwen-decode: the prefill part"));

    // A pool that is not one is refused, naming the annotation.
    let wrong = LLM_D_DECODE.replace("qwen-prefill.llm-d.svc.cluster.local:8000", "http://qwen-prefill:8000");
    let error = inject_yaml(&wrong, &InjectOptions::with_image("llmslo:test")).unwrap_err();
    assert!(
        error.message.contains("annotation llmslo.io/prefill-pool"),
        "{}",
        error.message
    );
}

#[test]
fn a_pods_llm_d_role_label_becomes_its_role() {
    let prefill = DEPLOYMENT.replace("labels: {app: vllm,", "labels: {app: vllm, llm-d.ai/role: prefill,");
    let d = inject(&prefill, SidecarMode::Native);
    let env = d["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    assert!(
        env.contains(&json!({"name": "LLMSLO_ROLE", "value": "prefill"})),
        "{env:?}"
    );
    assert!(!env.iter().any(|e| e["name"] == "LLMSLO_PREFILL_RELAY"));
    let d = inject(DEPLOYMENT, SidecarMode::Native);
    let env = d["spec"]["template"]["spec"]["initContainers"][0]["env"]
        .as_array()
        .unwrap()
        .clone();
    assert!(!env.iter().any(|e| e["name"] == "LLMSLO_ROLE"), "no label, no role");
}

/// The llmslo container of an injected Deployment, its args and its environment by name.
fn injected_sidecar(yaml: &str) -> (Value, Vec<String>, std::collections::BTreeMap<String, String>) {
    let injected = inject_yaml(yaml, &InjectOptions::with_image("llmslo:test")).unwrap();
    assert!(injected.warnings.is_empty(), "{:?}", injected.warnings);
    let d: Value = serde_yaml::from_str(&injected.output).unwrap();
    let spec = d["spec"]["template"]["spec"].clone();
    let llmslo = spec["initContainers"][0].clone();
    assert_eq!(llmslo["name"], "llmslo");
    let args = llmslo["args"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a.as_str().unwrap().to_string())
        .collect();
    let env = llmslo["env"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|e| Some((e["name"].as_str()?.to_string(), e["value"].as_str()?.to_string())))
        .collect();
    (spec, args, env)
}

#[test]
fn a_routing_sidecar_told_to_serve_plain_http_gets_plain_http_on_both_sides() {
    for off in ["--secure-proxy=false", "-secure-serving=false"] {
        let plain = LLM_D_DECODE.replace("--connector=nixlv2]", &format!("--connector=nixlv2, {off}]"));
        let (_, args, env) = injected_sidecar(&plain);
        assert_eq!(args[2], "http://127.0.0.1:8100", "{off}");
        assert!(
            !env.keys()
                .any(|k| k.starts_with("LLMSLO_TLS") || k.contains("INSECURE")),
            "{off}: {env:?}"
        );
    }
}

/// An llm-d 0.9 decode pod: the renamed routing sidecar with its newer flags, its own
/// certificate from a Secret, the engine on HTTPS too.
const LLM_D_09_DECODE: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: qwen-decode}
spec:
  selector: {matchLabels: {app: qwen}}
  template:
    metadata:
      labels: {app: qwen, llm-d.ai/role: decode, llmslo.io/inject: "true"}
      annotations: {llmslo.io/prefill-pool: "qwen-prefill.llm-d.svc.cluster.local:8000"}
    spec:
      initContainers:
        - name: routing-proxy
          image: ghcr.io/llm-d/llm-d-router-disagg-sidecar:v0.9.0
          args: [--port=8000, --model-server-port=8200, --kv-connector=nixlv2, --cert-path=/etc/routing-certs]
          ports: [{containerPort: 8000, name: http}]
          volumeMounts: [{name: routing-certs, mountPath: /etc/routing-certs}]
          restartPolicy: Always
      containers:
        - name: vllm
          image: ghcr.io/llm-d/llm-d-cuda:v0.5.0
          args: [--port, "8200", --kv-transfer-config, '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
          ports: [{containerPort: 8200}]
      volumes: [{name: routing-certs, secret: {secretName: qwen-decode-certs}}]
"#;

#[test]
fn an_llm_d_09_decode_pod_serves_its_routing_sidecars_certificate_through_llmslo() {
    let (spec, args, env) = injected_sidecar(LLM_D_09_DECODE);
    assert_eq!(
        args[2..6],
        ["https://127.0.0.1:8100", "--listen", "0.0.0.0:8000", "--metrics-listen"]
    );
    assert_eq!(env["LLMSLO_TLS_CERT_FILE"], "/etc/routing-certs/tls.crt");
    assert_eq!(env["LLMSLO_TLS_KEY_FILE"], "/etc/routing-certs/tls.key");
    assert_eq!(env["LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY"], "true");
    assert_eq!(env["LLMSLO_ROLE"], "decode");
    assert_eq!(
        spec["initContainers"][0]["volumeMounts"],
        json!([{"name": "routing-certs", "mountPath": "/etc/routing-certs", "readOnly": true}])
    );
    let routing = &spec["initContainers"][1];
    assert_eq!(
        routing["args"],
        json!([
            "--port=8100",
            "--model-server-port=8200",
            "--kv-connector=nixlv2",
            "--cert-path=/etc/routing-certs"
        ])
    );
    assert_eq!(
        routing["ports"],
        json!([{"containerPort": 8100, "name": ENGINE_PORT_NAME}])
    );
    // Its port's name is llmslo's now: Services by name reach llmslo.
    let declared = spec["containers"][0]["ports"].as_array().unwrap();
    assert!(
        declared.contains(&json!({"name": "http", "containerPort": 8000, "protocol": "TCP"})),
        "{declared:?}"
    );
}

/// An llm-d prefill pod: the router sends legs to the engine's port, by number.
const LLM_D_PREFILL: &str = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: qwen-prefill}
spec:
  selector: {matchLabels: {app: qwen-prefill}}
  template:
    metadata:
      labels: {app: qwen-prefill, llm-d.ai/role: prefill, llmslo.io/inject: "true"}
    spec:
      containers:
        - name: vllm
          image: ghcr.io/llm-d/llm-d-cuda:v0.5.0
          args: [--port, "8000", --kv-transfer-config, '{"kv_connector":"NixlConnector","kv_role":"kv_both"}']
          ports: [{containerPort: 8000}]
          readinessProbe: {httpGet: {path: /health, port: 8000}}
"#;

#[test]
fn in_a_prefill_pod_llmslo_takes_the_port_the_router_sends_legs_to() {
    let (spec, args, env) = injected_sidecar(LLM_D_PREFILL);
    assert_eq!(args[2..5], ["http://127.0.0.1:8100", "--listen", "0.0.0.0:8000"]);
    assert_eq!(env["LLMSLO_ROLE"], "prefill");
    let vllm = &spec["containers"][0];
    assert_eq!(vllm["args"].as_array().unwrap()[0..2], [json!("--port"), json!("8100")]);
    assert_eq!(
        vllm["readinessProbe"]["httpGet"]["port"], 8100,
        "the engine's probe follows it"
    );
    assert!(vllm["ports"]
        .as_array()
        .unwrap()
        .contains(&json!({"containerPort": 8100, "name": ENGINE_PORT_NAME})));
    // Told by its KV role alone, without llm-d's label.
    let unlabelled = LLM_D_PREFILL
        .replace("llm-d.ai/role: prefill, ", "")
        .replace("kv_both", "kv_producer");
    let (_, args, env) = injected_sidecar(&unlabelled);
    assert_eq!(
        (args[4].as_str(), env["LLMSLO_ROLE"].as_str()),
        ("0.0.0.0:8000", "prefill")
    );
    // Where the guess is wrong, an annotation says where llmslo listens.
    let aggregated = LLM_D_PREFILL.replace("llm-d.ai/role: prefill, ", "");
    let (_, args, _) = injected_sidecar(&aggregated);
    assert_eq!(args[4], "0.0.0.0:8080", "an aggregated pod keeps its engine's port");
    let asked = aggregated.replace(
        "    spec:\n      containers:",
        "      annotations: {llmslo.io/listen-port: \"8000\"}\n    spec:\n      containers:",
    );
    let (_, args, _) = injected_sidecar(&asked);
    assert_eq!(
        (args[2].as_str(), args[4].as_str()),
        ("http://127.0.0.1:8100", "0.0.0.0:8000")
    );
    let wrong = aggregated.replace(
        "    spec:\n      containers:",
        "      annotations: {llmslo.io/listen-port: \"eighty\"}\n    spec:\n      containers:",
    );
    let error = inject_yaml(&wrong, &InjectOptions::with_image("llmslo:test")).unwrap_err();
    assert!(error.to_string().contains("llmslo.io/listen-port"), "{error}");
}

/// The pod KServe's LLMInferenceService renders from its public template.
const KSERVE_LLM: &str = include_str!("../../../tests/fixtures/k8s/kserve-llm-pod.yaml");

#[test]
fn a_kserve_llm_pod_on_https_is_served_through_llmslo_with_its_own_certificate() {
    let (spec, args, env) = injected_sidecar(KSERVE_LLM);
    assert_eq!(args[2..5], ["https://127.0.0.1:8100", "--listen", "0.0.0.0:8000"]);
    assert_eq!(env["LLMSLO_TLS_CERT_FILE"], "/etc/ssl/certs/tls.crt");
    assert_eq!(env["LLMSLO_TLS_KEY_FILE"], "/etc/ssl/certs/tls.key");
    assert_eq!(env["LLMSLO_UPSTREAM_INSECURE_SKIP_VERIFY"], "true");
    assert!(!env.contains_key("LLMSLO_ROLE"));
    let llmslo = &spec["initContainers"][0];
    assert_eq!(
        llmslo["volumeMounts"],
        json!([{"name": "tls-certs", "mountPath": "/etc/ssl/certs", "readOnly": true}])
    );
    let main = &spec["containers"][0];
    let main_args = main["args"].as_array().unwrap();
    let at = main_args.iter().position(|a| a == "--port").unwrap();
    assert_eq!(main_args[at + 1], "8100", "the engine moved");
    for probe in ["livenessProbe", "readinessProbe"] {
        assert_eq!(
            main[probe]["httpGet"],
            json!({"path": "/health", "port": 8100, "scheme": "HTTPS"}),
            "the engine's HTTPS probes reach it where it moved"
        );
    }
    // llmslo's own probes are on its plain metrics port.
    assert_eq!(llmslo["readinessProbe"]["httpGet"]["port"], 9464);
}

#[test]
fn a_routing_sidecar_speaking_tls_to_prefill_pods_unverified_gets_a_relay_in_tls() {
    for (to_prefill, skip) in [
        ("--enable-tls=prefiller, --tls-insecure-skip-verify=prefiller", ""),
        (
            "--enable-tls, \"decoder,prefiller\", --tls-insecure-skip-verify=prefiller,decoder",
            "",
        ),
        // The older flags KServe renders.
        (
            "--prefiller-use-tls=true, --prefiller-tls-insecure-skip-verify=true",
            "",
        ),
        ("--prefiller-use-tls", ", --prefiller-tls-insecure-skip-verify"),
        // Inline configuration.
        (
            "\"--configuration=enable-tls: [prefiller]\\ntls-insecure-skip-verify: [prefiller]\"",
            "",
        ),
    ] {
        let pod = LLM_D_09_DECODE.replace(
            "--kv-connector=nixlv2,",
            &format!("--kv-connector=nixlv2, {to_prefill}{skip},"),
        );
        let (_, _, env) = injected_sidecar(&pod);
        assert!(env.contains_key("LLMSLO_PREFILL_RELAY"), "{to_prefill}: {env:?}");
        assert_eq!(env["LLMSLO_PREFILL_TLS"], "true", "{to_prefill}");
        assert_eq!(env["LLMSLO_PREFILL_INSECURE_SKIP_VERIFY"], "true", "{to_prefill}");
    }
    // Plain HTTP to prefill pods: a plain relay.
    let (_, _, env) = injected_sidecar(LLM_D_09_DECODE);
    assert!(env.contains_key("LLMSLO_PREFILL_RELAY"));
    assert!(!env.contains_key("LLMSLO_PREFILL_TLS"), "{env:?}");
    let off = LLM_D_09_DECODE.replace(
        "--kv-connector=nixlv2,",
        "--kv-connector=nixlv2, --prefiller-use-tls=false,",
    );
    assert!(!injected_sidecar(&off).2.contains_key("LLMSLO_PREFILL_TLS"));
}

#[test]
fn a_routing_sidecar_verifying_prefill_pods_or_configured_from_a_file_gets_no_relay_and_says_so() {
    for (shape, says) in [
        ("--enable-tls=prefiller,", "--tls-insecure-skip-verify=prefiller"),
        ("--prefiller-use-tls=true,", "--tls-insecure-skip-verify=prefiller"),
        ("--configuration-file=/etc/routing/config.yaml,", "--configuration-file"),
    ] {
        let pod = LLM_D_09_DECODE.replace("--kv-connector=nixlv2,", &format!("--kv-connector=nixlv2, {shape}"));
        let injected = inject_yaml(&pod, &InjectOptions::with_image("llmslo:test")).unwrap();
        assert_eq!(injected.warnings.len(), 1, "{shape}: {:?}", injected.warnings);
        assert!(
            injected.warnings[0].contains(says) && injected.warnings[0].contains("unmeasured"),
            "{:?}",
            injected.warnings
        );
        let d: Value = serde_yaml::from_str(&injected.output).unwrap();
        let env = d["spec"]["template"]["spec"]["initContainers"][0]["env"]
            .as_array()
            .unwrap()
            .clone();
        assert!(!env.iter().any(|e| e["name"] == "LLMSLO_PREFILL_RELAY"), "{env:?}");
        assert!(env.contains(&json!({"name": "LLMSLO_ROLE", "value": "decode"})));
        let annotations = &d["spec"]["template"]["metadata"]["annotations"];
        assert!(
            annotations.to_string().contains("unmeasured"),
            "the pod says so too: {annotations}"
        );
    }
}

#[test]
fn a_routing_sidecar_whose_port_is_in_a_file_takes_the_annotated_port_or_says_it_assumed_one() {
    let from_file = LLM_D_09_DECODE
        .replace("--port=8000, ", "--configuration-file=/etc/routing/config.yaml, ")
        .replace("containerPort: 8000", "containerPort: 9000");
    let injected = inject_yaml(&from_file, &InjectOptions::with_image("llmslo:test")).unwrap();
    assert_eq!(injected.warnings.len(), 1, "{:?}", injected.warnings);
    assert!(
        injected.warnings[0].contains("--configuration-file") && injected.warnings[0].contains("llmslo.io/listen-port")
    );
    assert!(injected.warnings[0].contains("the relay that times the legs stays off"));
    let told = from_file.replace(
        "annotations: {llmslo.io/prefill-pool",
        "annotations: {llmslo.io/listen-port: \"9000\", llmslo.io/prefill-pool",
    );
    let injected = inject_yaml(&told, &InjectOptions::with_image("llmslo:test")).unwrap();
    assert_eq!(
        injected.warnings.len(),
        1,
        "the relay's, not the port's: {:?}",
        injected.warnings
    );
    assert!(injected.warnings[0].contains("the relay that times the legs stays off"));
    let d: Value = serde_yaml::from_str(&injected.output).unwrap();
    let spec = &d["spec"]["template"]["spec"];
    let args = &spec["initContainers"][0]["args"];
    assert_eq!(args[4], "0.0.0.0:9000", "{args:?}");
    let routing = &spec["initContainers"][1];
    assert!(
        routing["args"].as_array().unwrap().contains(&json!("--port=9100")),
        "{routing}"
    );
    // Inline configuration names the port itself.
    let inline = LLM_D_09_DECODE.replace("--port=8000, ", "\"--configuration=port: 8000\", ");
    let (_, args, _) = injected_sidecar(&inline);
    assert_eq!(args[4], "0.0.0.0:8000");
}

#[test]
fn a_decode_pod_without_a_routing_sidecar_takes_the_port_its_router_sends_to() {
    // A decode server of vLLM's or SGLang's router: the router reaches it by number.
    let decode = LLM_D_PREFILL.replace("llm-d.ai/role: prefill", "llm-d.ai/role: decode");
    let (spec, args, env) = injected_sidecar(&decode);
    assert_eq!(args[2..5], ["http://127.0.0.1:8100", "--listen", "0.0.0.0:8000"]);
    assert_eq!(env["LLMSLO_ROLE"], "decode");
    assert!(
        !env.contains_key("LLMSLO_PREFILL_RELAY"),
        "no routing sidecar, no relay"
    );
    assert_eq!(spec["containers"][0]["readinessProbe"]["httpGet"]["port"], 8100);
}

#[test]
fn a_pd_router_pod_gets_llmslo_on_its_port_as_a_router() {
    let router = r#"
apiVersion: apps/v1
kind: Deployment
metadata: {name: vllm-router}
spec:
  selector: {matchLabels: {app: router}}
  template:
    metadata:
      labels: {app: router, llmslo.io/inject: "true"}
    spec:
      containers:
        - name: router
          image: ghcr.io/vllm-project/router:latest
          command: [vllm-router]
          args: [--vllm-pd-disaggregation, --host, 0.0.0.0, --port, "8000", --prefill, "http://prefill:8000",
                 --decode, "http://decode:8000"]
          ports: [{containerPort: 8000}]
"#;
    let (spec, args, env) = injected_sidecar(router);
    assert_eq!(env["LLMSLO_ROLE"], "router");
    assert_eq!(args[2..5], ["http://127.0.0.1:8100", "--listen", "0.0.0.0:8000"]);
    let moved = spec["containers"][0]["args"].as_array().unwrap();
    assert!(
        moved.windows(2).any(|w| w == [json!("--port"), json!("8100")]),
        "{moved:?}"
    );
    // SGLang's router in P/D mode is one too; without P/D, a router is no role of ours.
    let sglang = router
        .replace(
            "command: [vllm-router]",
            "command: [python3, -m, sglang_router.launch_router]",
        )
        .replace("--vllm-pd-disaggregation", "--pd-disaggregation");
    assert_eq!(injected_sidecar(&sglang).2["LLMSLO_ROLE"], "router");
    let balancing = router.replace("--vllm-pd-disaggregation, ", "");
    assert!(!injected_sidecar(&balancing).2.contains_key("LLMSLO_ROLE"));
}
