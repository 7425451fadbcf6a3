//! What a hostile client can try on a decode pod's sidecar that relays prefill legs: steer the
//! relay to an address of its choosing, pass its own requests off as legs, and knock on the
//! relay's port. Each is bounded in size and time and comes from [`ATTACKER`]; used by
//! `llmslo soak --attacks --disaggregated`.

use super::attacks::{connect_from, ATTACKER};
use crate::proxy::relay::RELAY_HEADER;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio::task::JoinSet;

/// Where the attacks aim: the sidecar's port, its relay's, and a service inside the pod's
/// network that no request may reach through llmslo.
#[derive(Debug, Clone, Copy)]
pub struct PdTargets {
    /// The sidecar's proxy port.
    pub proxy: SocketAddr,
    /// The prefill relay's port.
    pub relay: SocketAddr,
    /// The internal service the steering attack names.
    pub internal: SocketAddr,
}

/// One kind of attack on disaggregated serving.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PdAttack {
    /// Requests that name an internal service, or another port, as their prefill pod.
    SteeredRelay,
    /// Requests that carry a leg's fields (`kv_transfer_params`, `bootstrap_room`).
    LegFields,
    /// Prefill legs sent straight to the relay, with ids no request in flight holds.
    RelayProbes,
}

impl PdAttack {
    /// Every attack, in the order the soak runs them.
    pub const ALL: [PdAttack; 3] = [PdAttack::SteeredRelay, PdAttack::LegFields, PdAttack::RelayProbes];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            PdAttack::SteeredRelay => "relay steered to an internal service",
            PdAttack::LegFields => "leg fields on user requests",
            PdAttack::RelayProbes => "relay probes",
        }
    }

    /// Runs the attack; it is over within a few seconds.
    pub async fn run(self, targets: PdTargets) {
        match self {
            PdAttack::SteeredRelay => {
                let names = [targets.internal.to_string(), format!("{}:6379", targets.internal.ip())];
                let requests = names.map(|name| (header("x-prefiller-host-port", name), chat("{}")));
                send_all(targets.proxy, requests.to_vec(), 20).await
            }
            PdAttack::LegFields => {
                let fields = [
                    r#"{"kv_transfer_params":{"do_remote_decode":true}}"#,
                    r#"{"kv_transfer_params":{"do_remote_prefill":true}}"#,
                    r#"{"bootstrap_room":1}"#,
                ];
                send_all(targets.proxy, fields.map(|f| (String::new(), chat(f))).to_vec(), 20).await
            }
            PdAttack::RelayProbes => {
                let requests = (0..50)
                    .map(|_| {
                        (
                            header(RELAY_HEADER.as_str(), rand::random::<u64>().to_string()),
                            chat("{}"),
                        )
                    })
                    .collect();
                send_all(targets.relay, requests, 1).await
            }
        }
    }
}

/// A listener standing for a service inside the pod's network: it counts every connection
/// that reaches it, and answers each as a server would.
pub async fn internal_service() -> std::io::Result<(SocketAddr, Arc<AtomicUsize>)> {
    let listener = TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    let reached = Arc::new(AtomicUsize::new(0));
    let count = reached.clone();
    tokio::spawn(async move {
        while let Ok((mut stream, _)) = listener.accept().await {
            count.fetch_add(1, Ordering::SeqCst);
            let _ = stream
                .write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\nconnection: close\r\n\r\nok")
                .await;
        }
    });
    Ok((addr, reached))
}

/// One header line.
fn header(name: &str, value: String) -> String {
    format!("{name}: {value}\r\n")
}

/// A small chat request whose body has `extra`'s fields.
fn chat(extra: &str) -> String {
    let mut body: serde_json::Value = serde_json::json!({
        "model": "sim",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": 2,
    });
    if let (Some(body), Ok(serde_json::Value::Object(extra))) = (body.as_object_mut(), serde_json::from_str(extra)) {
        body.extend(extra);
    }
    body.to_string()
}

/// Sends each request (its extra header lines, its body) `times` times, twenty at once, each
/// on a connection of its own.
async fn send_all(addr: SocketAddr, requests: Vec<(String, String)>, times: usize) {
    let mut tasks = JoinSet::new();
    for (head, body) in requests {
        let request = format!(
            "POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n\
             {head}content-length: {}\r\n\r\n{body}",
            body.len()
        );
        for _ in 0..times {
            let request = request.clone();
            tasks.spawn(async move {
                let Ok(mut stream) = connect_from(ATTACKER, addr).await else {
                    return;
                };
                let _ = stream.write_all(request.as_bytes()).await;
                let mut answer = Vec::new();
                let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
            });
            if tasks.len() >= 20 {
                tasks.join_next().await;
            }
        }
    }
    while tasks.join_next().await.is_some() {}
}
