//! A reader of llmslo's request records: one JSON line per finished request, appended to a
//! file, for a warehouse to load. It runs the whole sidecar with this reader beside llmslo's
//! own (Prometheus, SLOs, capacity, OTLP), so `/metrics` is unchanged.
//!
//! ```sh
//! cargo run --example json_lines -- http://127.0.0.1:8000 requests.jsonl
//! # send requests to 127.0.0.1:8080; each finished one is a line of requests.jsonl
//! ```

use llmslo::config::Config;
use llmslo::record::{Engine, Reader, RequestRecord};
use llmslo::sidecar::{termination_signal, Sidecar};
use serde_json::json;
use std::fs::{File, OpenOptions};
use std::io::{LineWriter, Write};
use std::path::Path;
use std::sync::{Arc, Mutex};

/// Appends one JSON object per request to a file. A line holds the labels and the exact
/// measurements, never a prompt or a completion (the record has neither).
pub struct JsonLines(Mutex<LineWriter<File>>);

impl JsonLines {
    /// Appends to `path`, creating it when it does not exist.
    pub fn append_to(path: &Path) -> std::io::Result<Self> {
        let file = OpenOptions::new().create(true).append(true).open(path)?;
        Ok(Self(Mutex::new(LineWriter::new(file))))
    }
}

impl Reader for JsonLines {
    fn finished(&self, record: &RequestRecord) {
        let seconds = |d: Option<std::time::Duration>| d.map(|d| d.as_secs_f64());
        let line = json!({
            "model": record.model,
            "operation": record.operation.as_str(),
            "provider": Engine::label(record.provider),
            "outcome": record.outcome.as_str(),
            "ttft_s": seconds(record.ttft),
            "answer_ttft_s": seconds(record.answer_ttft),
            "tpot_s": seconds(record.tpot()),
            "tpot_basis": record.tpot_basis.map(|b| b.as_str()),
            "e2e_s": record.e2e.as_secs_f64(),
            "input_tokens": record.input_tokens,
            "output_tokens": record.output_tokens,
            "reasoning_tokens": record.reasoning_tokens,
            "token_count_source": record.count_source.map(|s| s.as_str()),
            "trace_id": record.trace.map(|t| t.trace_id.to_string()),
        });
        let mut file = self.0.lock().expect("the log's lock");
        // A full disk loses lines, never requests: a reader must not stop traffic.
        if let Err(error) = writeln!(file, "{line}") {
            tracing::warn!(%error, "a request's line could not be written");
        }
    }
}

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let upstream = args.next().unwrap_or_else(|| "http://127.0.0.1:8000".into());
    let path = args.next().unwrap_or_else(|| "requests.jsonl".into());
    let config = Config::from_yaml(&format!("upstream: {upstream}\nlisten: 127.0.0.1:8080\n"))?;
    let lines = Arc::new(JsonLines::append_to(Path::new(&path))?);
    let sidecar = Sidecar::start_with(&config, vec![lines]).await?;
    println!(
        "proxy on http://{}, /metrics on http://{}, one line per request in {path}",
        sidecar.proxy_addr, sidecar.metrics_addr
    );
    termination_signal().await;
    sidecar.shutdown().await;
    Ok(())
}
