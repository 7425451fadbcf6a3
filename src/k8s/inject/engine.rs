//! What the engine container's own flags say: the port it listens on, the TLS files it serves
//! (vLLM's and SGLang's `--ssl-certfile` and `--ssl-keyfile`), and whether its KV transfer
//! makes it a prefill pod (`kv_role: kv_producer`); and how to move it to another port when
//! llmslo takes its own.

use serde_json::{json, Value};

/// The engine container's flags that decide how llmslo goes in front of it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(super) struct EngineFlags {
    /// The TLS certificate and key files it serves, when it serves TLS.
    pub(super) tls: Option<(String, String)>,
    /// Its KV transfer only produces: it serves prefill legs.
    pub(super) kv_producer: bool,
    /// A shell runs it (`sh -c "vllm serve …"`): its flags cannot be rewritten.
    pub(super) in_a_shell: bool,
    /// It is a router that serves every request disaggregated (`vllm-router
    /// --vllm-pd-disaggregation`, SGLang's `launch_router --pd-disaggregation`), not an engine.
    pub(super) pd_router: bool,
}

/// The value of `--name` (`--name value` or `--name=value`) in `list`, and where it is.
fn flag<'a>(list: &'a [Value], name: &str) -> Option<(usize, usize, &'a str)> {
    let form = format!("--{name}");
    list.iter().enumerate().find_map(|(i, arg)| {
        let arg = arg.as_str()?;
        match arg.strip_prefix(form.as_str()) {
            Some(value) if value.starts_with('=') => Some((i, 1, &value[1..])),
            Some("") => list.get(i + 1)?.as_str().map(|value| (i, 2, value)),
            _ => None,
        }
    })
}

/// Whether `--name` is given, alone or with a value.
fn flag_given(list: &[Value], name: &str) -> bool {
    let form = format!("--{name}");
    list.iter()
        .filter_map(Value::as_str)
        .any(|arg| arg == form || arg.strip_prefix(form.as_str()).is_some_and(|v| v.starts_with('=')))
}

/// The container's command and args as one list of words.
fn words(container: &Value) -> Vec<Value> {
    ["command", "args"]
        .iter()
        .flat_map(|key| container[*key].as_array().cloned().unwrap_or_default())
        .collect()
}

/// Reads the engine container's flags.
pub(super) fn read(container: &Value) -> EngineFlags {
    let words = words(container);
    let value = |name: &str| flag(&words, name).map(|(_, _, v)| v.to_string());
    let tls = match (value("ssl-certfile"), value("ssl-keyfile")) {
        (Some(cert), Some(key)) => Some((cert, key)),
        _ => None,
    };
    let kv_producer = value("kv-transfer-config")
        .is_some_and(|config| serde_json::from_str::<Value>(&config).is_ok_and(|c| c["kv_role"] == "kv_producer"));
    let shell = |w: &Value| {
        w.as_str()
            .is_some_and(|w| matches!(w, "sh" | "bash" | "/bin/sh" | "/bin/bash"))
    };
    let in_a_shell = words.first().is_some_and(shell)
        && words
            .iter()
            .any(|w| w.as_str().is_some_and(|w| w.contains(' ') && w.contains("--")));
    let said = |word: &str| words.iter().any(|w| w.as_str().is_some_and(|w| w.contains(word)));
    let pd_router = (said("vllm-router") || said("vllm_router")) && flag_given(&words, "vllm-pd-disaggregation")
        || said("sglang_router") && flag_given(&words, "pd-disaggregation");
    EngineFlags {
        tls,
        kv_producer,
        in_a_shell,
        pd_router,
    }
}

/// Moves the engine to `port`: its `--port` flag where it has one (in `command` or `args`),
/// else a `--port` added to its args.
pub(super) fn move_to(container: &mut Value, port: u64) {
    for key in ["command", "args"] {
        let Some(list) = container[key].as_array().cloned() else {
            continue;
        };
        if let Some((at, len, _)) = flag(&list, "port") {
            let mut list = list;
            list.splice(at..at + len, [json!("--port"), json!(port.to_string())]);
            container[key] = json!(list);
            return;
        }
    }
    let mut args = container["args"].as_array().cloned().unwrap_or_default();
    args.extend([json!("--port"), json!(port.to_string())]);
    container["args"] = json!(args);
}

/// The volume mount of `container` that holds `path`, as llmslo mounts it: read-only.
pub(super) fn mount_holding(container: &Value, path: &str) -> Option<Value> {
    let mounts = container["volumeMounts"].as_array()?;
    let holding = mounts
        .iter()
        .filter(|m| {
            m["mountPath"]
                .as_str()
                .is_some_and(|at| path.starts_with(&format!("{}/", at.trim_end_matches('/'))))
        })
        .max_by_key(|m| m["mountPath"].as_str().map_or(0, str::len))?;
    let mut mount = holding.clone();
    mount["readOnly"] = json!(true);
    Some(mount)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tls_files_kv_role_and_port_are_read_in_either_form_and_the_port_moved() {
        let container = json!({
            "command": ["vllm", "serve", "Qwen/Qwen3-0.6B"],
            "args": ["--port", "8000", "--ssl-certfile=/etc/ssl/certs/tls.crt", "--ssl-keyfile", "/etc/ssl/certs/tls.key",
                     "--kv-transfer-config", "{\"kv_connector\":\"NixlConnector\",\"kv_role\":\"kv_producer\"}"],
            "volumeMounts": [{"name": "home", "mountPath": "/home"}, {"name": "certs", "mountPath": "/etc/ssl/certs/"}],
        });
        let flags = read(&container);
        assert_eq!(
            flags.tls,
            Some(("/etc/ssl/certs/tls.crt".into(), "/etc/ssl/certs/tls.key".into()))
        );
        assert!(flags.kv_producer && !flags.in_a_shell);
        assert_eq!(
            mount_holding(&container, "/etc/ssl/certs/tls.crt"),
            Some(json!({"name": "certs", "mountPath": "/etc/ssl/certs/", "readOnly": true}))
        );
        assert_eq!(mount_holding(&container, "/tls.crt"), None);
        let mut moved = container.clone();
        move_to(&mut moved, 8100);
        assert_eq!(
            moved["args"].as_array().unwrap()[0..2],
            [json!("--port"), json!("8100")]
        );
        let mut bare = json!({"command": ["vllm", "serve", "m", "--port=9000"]});
        move_to(&mut bare, 9100);
        assert_eq!(bare["command"], json!(["vllm", "serve", "m", "--port", "9100"]));
        let mut none = json!({"command": ["vllm", "serve", "m"]});
        move_to(&mut none, 8100);
        assert_eq!(none["args"], json!(["--port", "8100"]));
        let shell = json!({"command": ["/bin/sh", "-c"], "args": ["vllm serve m --port 8000 --ssl-certfile /c"]});
        assert!(read(&shell).in_a_shell);
        assert_eq!(
            read(&json!({"args": ["--ssl-certfile", "/c"]})).tls,
            None,
            "a certificate without its key"
        );
    }
}
