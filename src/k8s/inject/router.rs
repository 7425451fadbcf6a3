//! llm-d's routing sidecar in a decode pod: it takes the client's stream on the port the
//! router sends to, sends the prompt to a prefill pod, then the request to the local engine.
//! llmslo belongs in front of it, where the client's stream enters the pod: llmslo takes the
//! routing sidecar's port (routers reach pods by number), the routing sidecar moves to a free
//! port, and llmslo runs as the decode pod it is, relaying the prefill legs to time them.

use crate::record::Role;
use serde_json::{json, Map, Value};

/// The port llm-d's routing sidecar listens on when its arguments name none.
const DEFAULT_PORT: u64 = 8000;
/// The pod label llm-d names a pod's role with.
pub const ROLE_LABEL: &str = "llm-d.ai/role";

/// A routing sidecar found in a pod spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct RoutingSidecar {
    /// `containers` or `initContainers` (a native sidecar).
    list: &'static str,
    index: usize,
    /// The port it listens on: the one clients use.
    pub(super) port: u64,
    /// Whether it allows only prefill pods of its InferencePool (then the relay must be on the
    /// pod's IP, which the pool holds; loopback is refused).
    pub(super) ssrf_protected: bool,
    /// Whether it serves TLS (`--secure-serving`, or its older name `--secure-proxy`: on
    /// unless set to false).
    pub(super) secure: bool,
    /// The directory of its `tls.crt` and `tls.key` (`--cert-path`); without one it serves a
    /// certificate it made.
    pub(super) cert_path: Option<String>,
    /// Its port is in a `--configuration-file`, which the injector cannot read (it is assumed
    /// to be the default unless `llmslo.io/listen-port` says).
    pub(super) port_in_a_file: bool,
    /// How it speaks to prefill pods: the relay between must speak the same.
    pub(super) to_prefill: ToPrefill,
}

/// How a routing sidecar speaks to prefill pods.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum ToPrefill {
    /// Plain HTTP.
    Plain,
    /// TLS, their certificates unverified (`--tls-insecure-skip-verify=prefiller`): the relay
    /// serves it TLS with a certificate of its own and speaks TLS to the pods, unverified too.
    TlsUnverified,
    /// TLS, their certificates verified against its system roots: it would not take a relay's
    /// certificate for the relay's address, so the relay stays off.
    TlsVerified,
    /// Unknown: its settings are in a `--configuration-file` the injector cannot read, so the
    /// relay stays off (a plain relay would break legs the file sends in TLS).
    InAFile,
}

/// llm-d's routing sidecar, by its image (the older `llm-d-routing-sidecar`, or
/// `llm-d-router-disagg-sidecar` from llm-d 0.8) or the names llm-d's charts give it.
fn is_routing_sidecar(container: &Value) -> bool {
    let image = container["image"].as_str().unwrap_or_default();
    let name = container["name"].as_str().unwrap_or_default();
    image.contains("llm-d-routing-sidecar")
        || image.contains("llm-d-router-disagg-sidecar")
        || matches!(name, "routing-proxy" | "llm-d-routing-sidecar")
}

/// A Go boolean flag: absent is `default`, `-name` alone is true, `-name=false` is false.
fn bool_flag(args: &[Value], name: &str, default: bool) -> Option<bool> {
    let forms = [format!("-{name}"), format!("--{name}")];
    let alone = args
        .iter()
        .any(|a| forms.iter().any(|f| a.as_str() == Some(f.as_str())));
    if alone {
        return Some(true);
    }
    let valued = args.iter().find_map(|a| {
        let a = a.as_str()?;
        forms.iter().find_map(|f| a.strip_prefix(f.as_str())?.strip_prefix('='))
    });
    match valued {
        None => Some(default),
        Some(v) => v.parse().ok(),
    }
}

/// The `--configuration` YAML given inline, if there is one.
fn configuration(args: &[Value]) -> Option<serde_yaml::Value> {
    let (_, _, text) = flag(args, "configuration")?;
    serde_yaml::from_str(text).ok()
}

/// Whether `stage` is among the stages a list flag names (`--enable-tls=prefiller,decoder`,
/// given once or more), in the arguments or the inline configuration.
fn names_stage(args: &[Value], configured: Option<&serde_yaml::Value>, name: &str, stage: &str) -> bool {
    let forms = [format!("-{name}"), format!("--{name}")];
    let in_args = args.iter().enumerate().any(|(i, arg)| {
        let Some(arg) = arg.as_str() else { return false };
        forms.iter().any(|form| {
            let value = match arg.strip_prefix(form.as_str()) {
                Some(value) if value.starts_with('=') => &value[1..],
                Some("") => args.get(i + 1).and_then(Value::as_str).unwrap_or_default(),
                _ => return false,
            };
            value.split(',').any(|s| s.trim() == stage)
        })
    });
    let in_configuration = configured
        .and_then(|c| c.get(name))
        .and_then(serde_yaml::Value::as_sequence)
        .is_some_and(|stages| stages.iter().any(|s| s.as_str() == Some(stage)));
    in_args || in_configuration
}

/// A boolean set in the arguments (Go's forms) or the inline configuration; absent is false.
fn set(args: &[Value], configured: Option<&serde_yaml::Value>, name: &str) -> Option<bool> {
    let in_configuration = configured
        .and_then(|c| c.get(name))
        .and_then(serde_yaml::Value::as_bool)
        .unwrap_or(false);
    Some(bool_flag(args, name, false)? || in_configuration)
}

/// How the routing sidecar speaks to prefill pods: `--enable-tls=prefiller` (or the older
/// `--prefiller-use-tls`), verified unless `--tls-insecure-skip-verify=prefiller` (or the
/// older `--prefiller-tls-insecure-skip-verify`).
fn to_prefill(args: &[Value], configured: Option<&serde_yaml::Value>, in_a_file: bool) -> Option<ToPrefill> {
    if in_a_file {
        return Some(ToPrefill::InAFile);
    }
    let tls = names_stage(args, configured, "enable-tls", "prefiller") || set(args, configured, "prefiller-use-tls")?;
    let unverified = names_stage(args, configured, "tls-insecure-skip-verify", "prefiller")
        || set(args, configured, "prefiller-tls-insecure-skip-verify")?;
    Some(match (tls, unverified) {
        (false, _) => ToPrefill::Plain,
        (true, true) => ToPrefill::TlsUnverified,
        (true, false) => ToPrefill::TlsVerified,
    })
}

/// The value of flag `name` (Go's flag package: `-name`, `--name`, `=value` or the next
/// argument) and where it is.
fn flag<'a>(args: &'a [Value], name: &str) -> Option<(usize, usize, &'a str)> {
    let forms = [format!("-{name}"), format!("--{name}")];
    args.iter().enumerate().find_map(|(i, arg)| {
        let arg = arg.as_str()?;
        forms.iter().find_map(|form| match arg.strip_prefix(form.as_str()) {
            Some(value) if value.starts_with('=') => Some((i, 1, &value[1..])),
            Some("") => args.get(i + 1)?.as_str().map(|value| (i, 2, value)),
            _ => None,
        })
    })
}

/// Finds llm-d's routing sidecar in a pod spec.
pub(super) fn find(spec: &Map<String, Value>) -> Option<RoutingSidecar> {
    ["initContainers", "containers"].into_iter().find_map(|list| {
        let containers = spec.get(list)?.as_array()?;
        let index = containers.iter().position(is_routing_sidecar)?;
        let args = containers[index]["args"].as_array().cloned().unwrap_or_default();
        let configured = configuration(&args);
        let named = match flag(&args, "port") {
            Some((_, _, value)) => Some(value.parse().ok()?),
            None => configured
                .as_ref()
                .and_then(|c| c.get("port"))
                .and_then(serde_yaml::Value::as_u64),
        };
        let in_a_file = flag(&args, "configuration-file").is_some();
        let port_in_a_file = named.is_none() && in_a_file;
        let port = named.unwrap_or(DEFAULT_PORT);
        let ssrf_protected = bool_flag(&args, "enable-ssrf-protection", false)?;
        let secure = bool_flag(&args, "secure-serving", true)? && bool_flag(&args, "secure-proxy", true)?;
        let cert_path = flag(&args, "cert-path").map(|(_, _, dir)| dir.trim_end_matches('/').to_string());
        let to_prefill = to_prefill(&args, configured.as_ref(), in_a_file)?;
        Some(RoutingSidecar {
            list,
            index,
            port,
            ssrf_protected,
            secure,
            cert_path,
            to_prefill,
            port_in_a_file,
        })
    })
}

/// The routing sidecar's container.
pub(super) fn container<'a>(spec: &'a Map<String, Value>, sidecar: &RoutingSidecar) -> &'a Value {
    &spec[sidecar.list][sidecar.index]
}

/// Moves the routing sidecar to `port`: its `--port` argument and its port entry. Returns the
/// name its port entry had (llmslo's port takes it, so Services by name reach llmslo).
pub(super) fn move_to(spec: &mut Map<String, Value>, sidecar: &RoutingSidecar, port: u64) -> Option<String> {
    let container = &mut spec.get_mut(sidecar.list).expect("found there")[sidecar.index];
    let mut args = container["args"].as_array().cloned().unwrap_or_default();
    match flag(&args, "port") {
        Some((at, len, _)) => {
            args.splice(at..at + len, [json!(format!("--port={port}"))]);
        }
        None => args.push(json!(format!("--port={port}"))),
    }
    container["args"] = json!(args);
    let entries = container.get_mut("ports").and_then(Value::as_array_mut);
    let entry = entries
        .into_iter()
        .flatten()
        .find(|p| p["containerPort"].as_u64() == Some(sidecar.port))?;
    entry["containerPort"] = json!(port);
    let name = entry["name"].as_str().map(str::to_string);
    entry["name"] = json!(super::ENGINE_PORT_NAME);
    name
}

/// The role llm-d's pod label names, if any.
pub(super) fn role(metadata: &Value) -> Option<Role> {
    metadata["labels"][ROLE_LABEL].as_str().and_then(Role::from_label)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(args: Value) -> Map<String, Value> {
        json!({
            "initContainers": [{"name": "routing-proxy", "image": "ghcr.io/llm-d/llm-d-routing-sidecar:v0.4.0",
                                "args": args, "ports": [{"containerPort": 8000}], "restartPolicy": "Always"}],
            "containers": [{"name": "vllm", "image": "vllm/vllm-openai", "ports": [{"containerPort": 8200}]}],
        })
        .as_object()
        .unwrap()
        .clone()
    }

    #[test]
    fn its_port_is_read_in_every_form_go_flags_take_and_moved() {
        for args in [
            json!(["--port=8000", "--vllm-port=8200"]),
            json!(["-port", "8000", "--vllm-port=8200"]),
            json!(["--vllm-port=8200"]),
        ] {
            let mut s = spec(args.clone());
            let found = find(&s).expect("found");
            assert_eq!((found.port, found.ssrf_protected), (8000, false), "{args}");
            assert_eq!(move_to(&mut s, &found, 8100), None, "its port had no name");
            let moved = &s["initContainers"][0];
            assert!(
                moved["args"].as_array().unwrap().contains(&json!("--port=8100")),
                "{moved}"
            );
            assert!(!moved["args"]
                .as_array()
                .unwrap()
                .iter()
                .any(|a| a == "8000" || a == "--port=8000"));
            assert_eq!(moved["ports"][0]["containerPort"], 8100);
            assert_eq!(find(&s).unwrap().port, 8100);
        }
        let protected = spec(json!(["--port=9000", "-enable-ssrf-protection=true"]));
        assert_eq!(
            (find(&protected).unwrap().port, find(&protected).unwrap().ssrf_protected),
            (9000, true)
        );
        assert_eq!(find(&spec(json!(["--port=eighty"]))), None, "a port that is no number");
        let plain = json!({"containers": [{"name": "vllm", "image": "vllm/vllm-openai"}]});
        assert_eq!(find(plain.as_object().unwrap()), None);
    }
}
