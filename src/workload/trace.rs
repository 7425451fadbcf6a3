//! Request traces: when each request arrived and how long its prompt and answer were, never
//! their text. Read from Mooncake-style JSONL (`timestamp` in ms, `input_length`,
//! `output_length`, optional `hash_ids`; the sidecar's export adds `api`, `model`,
//! `reasoning_length` and `stream`) or Azure's LLM inference CSV (`TIMESTAMP`,
//! `ContextTokens`, `GeneratedTokens`), and written as that JSONL.

use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Longest prompt or answer a trace line may state, in tokens.
pub const MAX_LENGTH: u32 = 1_000_000;
/// Most lines a trace may hold.
pub const MAX_ROWS: usize = 1_000_000;
/// Largest trace read (a file, or a sidecar's page): with the other bounds, what reading it
/// holds stays within a few times this.
pub const MAX_TRACE_BYTES: u64 = 64 << 20;
/// Latest arrival a trace may state, in milliseconds (30 days): a replay that would take longer
/// is a broken trace, not a workload.
pub const MAX_TIMESTAMP_MS: u64 = 30 * 24 * 3600 * 1000;
/// Longest model name a trace line may state, in bytes.
const MAX_MODEL_BYTES: usize = 128;
/// The prompt block Mooncake's `hash_ids` count in, in tokens.
const HASH_BLOCK_TOKENS: u32 = 512;
/// The APIs a trace line may name.
const APIS: [&str; 4] = ["chat", "completions", "responses", "messages"];

/// Reads the trace file at `path`, within [`MAX_TRACE_BYTES`] (named `name` in errors).
pub fn read_trace_file(name: &str, path: &std::path::Path) -> Result<Trace, String> {
    let text = crate::flags::read_bounded(path, MAX_TRACE_BYTES).map_err(|e| format!("{name}: {e}"))?;
    Trace::parse(name, &text)
}

/// One request of a trace.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TraceRow {
    /// Arrival, in milliseconds from the trace's first request.
    pub timestamp: u64,
    /// Prompt tokens.
    pub input_length: u32,
    /// Output tokens.
    pub output_length: u32,
    /// The API it called (`chat`, `completions`, `responses`, `messages`), when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub api: Option<String>,
    /// The model it asked for, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// Output tokens spent on reasoning, when reported.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning_length: Option<u32>,
    /// Whether the answer was streamed, when recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stream: Option<bool>,
    /// Mooncake's prompt blocks (512 tokens each): equal ids share a prefix.
    #[serde(
        default,
        skip_serializing_if = "Vec::is_empty",
        deserialize_with = "bounded_hash_ids"
    )]
    pub hash_ids: Vec<u64>,
}

/// The most prompt blocks a line may list: one per [`HASH_BLOCK_TOKENS`] of the longest prompt.
const MAX_HASH_IDS: usize = (MAX_LENGTH / HASH_BLOCK_TOKENS + 1) as usize;

/// `hash_ids`, refused as soon as it lists more than [`MAX_HASH_IDS`] (never held whole first).
fn bounded_hash_ids<'de, D: serde::Deserializer<'de>>(deserializer: D) -> Result<Vec<u64>, D::Error> {
    struct Blocks;
    impl<'de> serde::de::Visitor<'de> for Blocks {
        type Value = Vec<u64>;
        fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
            write!(f, "a list of at most {MAX_HASH_IDS} block ids")
        }
        fn visit_seq<A: serde::de::SeqAccess<'de>>(self, mut seq: A) -> Result<Vec<u64>, A::Error> {
            let mut ids = Vec::new();
            while let Some(id) = seq.next_element()? {
                if ids.len() == MAX_HASH_IDS {
                    return Err(serde::de::Error::custom(format!("more than {MAX_HASH_IDS} hash_ids")));
                }
                ids.push(id);
            }
            Ok(ids)
        }
    }
    deserializer.deserialize_seq(Blocks)
}

impl TraceRow {
    /// The arrival as a duration from the trace's start.
    pub fn offset(&self) -> Duration {
        Duration::from_millis(self.timestamp)
    }
}

/// A whole trace, in arrival order, starting at 0 ms.
#[derive(Debug, Clone, PartialEq, Default)]
pub struct Trace {
    /// Its requests, sorted by arrival.
    pub rows: Vec<TraceRow>,
}

impl Trace {
    /// A trace of `rows`, sorted by arrival and shifted so that the first arrives at 0.
    pub fn new(mut rows: Vec<TraceRow>) -> Self {
        rows.sort_by_key(|r| r.timestamp);
        let first = rows.first().map_or(0, |r| r.timestamp);
        for row in &mut rows {
            row.timestamp -= first;
        }
        Self { rows }
    }

    /// Reads a trace in either format: CSV when the first line is Azure's header, else JSONL.
    /// `name` labels the errors (`FILE:LINE: what is wrong`).
    pub fn parse(name: &str, text: &str) -> Result<Self, String> {
        let first = text.lines().find(|l| !l.trim().is_empty()).unwrap_or_default();
        let trace = if first.contains("TIMESTAMP") && first.contains(',') {
            Self::parse_azure(name, text)?
        } else {
            Self::parse_jsonl(name, text)?
        };
        if trace.rows.is_empty() {
            return Err(format!("{name}: no requests in the trace"));
        }
        if trace.span() > Duration::from_millis(MAX_TIMESTAMP_MS) {
            return Err(format!("{name}: its requests span more than 30 days"));
        }
        Ok(trace)
    }

    fn parse_jsonl(name: &str, text: &str) -> Result<Self, String> {
        let mut rows = Vec::new();
        for (index, line) in text.lines().enumerate() {
            if line.trim().is_empty() {
                continue;
            }
            let at = |message: String| format!("{name}:{}: {message}", index + 1);
            if rows.len() == MAX_ROWS {
                return Err(at(format!("more than {MAX_ROWS} requests")));
            }
            let row: TraceRow = serde_json::from_str(line).map_err(|e| {
                at(format!(
                    "expected {{\"timestamp\": ms, \"input_length\": n, \"output_length\": n}} ({e})"
                ))
            })?;
            check_lengths(row.input_length, row.output_length).map_err(at)?;
            check_row(&row).map_err(at)?;
            rows.push(row);
        }
        Ok(Self::new(rows))
    }

    fn parse_azure(name: &str, text: &str) -> Result<Self, String> {
        let format = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second].[subsecond]");
        let whole = time::macros::format_description!("[year]-[month]-[day] [hour]:[minute]:[second]");
        let mut reader = csv::ReaderBuilder::new()
            .trim(csv::Trim::All)
            .from_reader(text.as_bytes());
        let headers = reader.headers().map_err(|e| format!("{name}:1: {e}"))?.clone();
        let column = |wanted: &str| {
            headers.iter().position(|h| h == wanted).ok_or_else(|| {
                format!("{name}:1: no {wanted} column (Azure's CSV has TIMESTAMP,ContextTokens,GeneratedTokens)")
            })
        };
        let (time_at, context_at, generated_at) = (
            column("TIMESTAMP")?,
            column("ContextTokens")?,
            column("GeneratedTokens")?,
        );
        let mut arrivals = Vec::new();
        for (index, record) in reader.records().enumerate() {
            let line = index + 2;
            let at = |message: String| format!("{name}:{line}: {message}");
            if arrivals.len() == MAX_ROWS {
                return Err(at(format!("more than {MAX_ROWS} requests")));
            }
            let record = record.map_err(|e| at(e.to_string()))?;
            let field = |i: usize| record.get(i).unwrap_or_default();
            let stamp = field(time_at);
            let stamp = stamp.get(..stamp.len().min(40)).unwrap_or_default();
            let when = time::PrimitiveDateTime::parse(stamp, format)
                .or_else(|_| time::PrimitiveDateTime::parse(stamp, whole))
                .map_err(|_| at("TIMESTAMP is not like 2023-11-16 18:15:46.6805900".into()))?;
            let tokens = |i: usize, what: &str| {
                field(i)
                    .parse::<u32>()
                    .map_err(|_| at(format!("{what} is not a whole number of tokens")))
            };
            let (input, output) = (
                tokens(context_at, "ContextTokens")?,
                tokens(generated_at, "GeneratedTokens")?,
            );
            check_lengths(input, output).map_err(at)?;
            arrivals.push((when, input, output));
        }
        let Some(start) = arrivals.iter().map(|a| a.0).min() else {
            return Ok(Self::default());
        };
        let rows = arrivals
            .into_iter()
            .map(|(when, input, output)| TraceRow {
                timestamp: (when - start).whole_milliseconds() as u64,
                ..TraceRow::lengths(input, output)
            })
            .collect();
        Ok(Self::new(rows))
    }

    /// The trace as JSONL, one request a line.
    pub fn to_jsonl(&self) -> String {
        let mut out = String::with_capacity(self.rows.len() * 96);
        for row in &self.rows {
            out.push_str(&serde_json::to_string(row).expect("a row serializes"));
            out.push('\n');
        }
        out
    }

    /// From the first arrival to the last.
    pub fn span(&self) -> Duration {
        self.rows.last().map_or(Duration::ZERO, TraceRow::offset)
    }

    /// Its mean arrival rate, requests per second (over its span; NaN for one request).
    pub fn rate(&self) -> f64 {
        (self.rows.len().saturating_sub(1)) as f64 / self.span().as_secs_f64()
    }
}

impl TraceRow {
    /// A row of only the two lengths, arriving at 0.
    pub fn lengths(input_length: u32, output_length: u32) -> Self {
        Self {
            timestamp: 0,
            input_length,
            output_length,
            api: None,
            model: None,
            reasoning_length: None,
            stream: None,
            hash_ids: Vec::new(),
        }
    }
}

/// What a line may state beyond its lengths: an arrival within [`MAX_TIMESTAMP_MS`], a known
/// API, a model name of plausible length, and no more prompt blocks than its prompt has.
fn check_row(row: &TraceRow) -> Result<(), String> {
    if row.timestamp > MAX_TIMESTAMP_MS {
        return Err(format!(
            "timestamp {} ms is past {MAX_TIMESTAMP_MS} (30 days)",
            row.timestamp
        ));
    }
    if let Some(api) = row.api.as_deref().filter(|api| !APIS.contains(api)) {
        return Err(format!(
            "api `{}` is not one of {}",
            api.chars().take(32).collect::<String>(),
            APIS.join(", ")
        ));
    }
    if row.model.as_ref().is_some_and(|m| m.len() > MAX_MODEL_BYTES) {
        return Err(format!("a model name longer than {MAX_MODEL_BYTES} bytes"));
    }
    let blocks = (row.input_length / HASH_BLOCK_TOKENS + 1) as usize;
    if row.hash_ids.len() > blocks {
        return Err(format!(
            "{} hash_ids for {} prompt tokens (one per {HASH_BLOCK_TOKENS})",
            row.hash_ids.len(),
            row.input_length
        ));
    }
    Ok(())
}

fn check_lengths(input: u32, output: u32) -> Result<(), String> {
    if input > MAX_LENGTH || output > MAX_LENGTH {
        return Err(format!("lengths above {MAX_LENGTH} tokens"));
    }
    if output == 0 {
        return Err("output_length 0: a replayed request asks for at least one token".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mooncake_lines_are_read_sorted_and_from_zero() {
        let text = "{\"timestamp\": 1500, \"input_length\": 6955, \"output_length\": 52, \"hash_ids\": [46, 47]}\n\n\
                    {\"timestamp\": 1000, \"input_length\": 20, \"output_length\": 8, \"api\": \"chat\", \"model\": \"m\", \"stream\": true}\n";
        let trace = Trace::parse("t.jsonl", text).unwrap();
        assert_eq!(trace.rows.len(), 2);
        assert_eq!(trace.rows[0].timestamp, 0);
        assert_eq!(trace.rows[0].api.as_deref(), Some("chat"));
        assert_eq!(trace.rows[1].timestamp, 500);
        assert_eq!(trace.rows[1].hash_ids, [46, 47]);
        assert_eq!(trace.span(), Duration::from_millis(500));
        assert_eq!(trace.rate(), 2.0);
        let again = Trace::parse("again", &trace.to_jsonl()).unwrap();
        assert_eq!(again, trace, "what is written reads back the same");
        assert!(
            !trace.to_jsonl().contains("reasoning_length"),
            "absent fields stay absent"
        );
    }

    #[test]
    fn azure_csv_is_read() {
        let text = "TIMESTAMP,ContextTokens,GeneratedTokens\n\
                    2023-11-16 18:15:46.6805900,374,44\n\
                    2023-11-16 18:15:50.9951690,396,109\n\
                    2023-11-16 18:15:46,100,3\n";
        let trace = Trace::parse("azure.csv", text).unwrap();
        let offsets: Vec<u64> = trace.rows.iter().map(|r| r.timestamp).collect();
        assert_eq!(offsets, [0, 680, 4995]);
        assert_eq!((trace.rows[1].input_length, trace.rows[1].output_length), (374, 44));
    }

    #[test]
    fn bad_traces_name_the_line_and_what_is_wrong() {
        let error = |text: &str| Trace::parse("f", text).unwrap_err();
        assert!(error("{\"timestamp\": 1}\n").starts_with("f:1: expected {\"timestamp\""));
        assert!(error("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1}\n{oops\n").starts_with("f:2: "));
        assert_eq!(
            error("{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 0}"),
            "f:1: output_length 0: a replayed request asks for at least one token"
        );
        assert_eq!(
            error("{\"timestamp\": 0, \"input_length\": 2000000, \"output_length\": 1}"),
            "f:1: lengths above 1000000 tokens"
        );
        assert_eq!(error("\n\n"), "f: no requests in the trace");
        // A line listing millions of blocks is refused at the first one too many, not once
        // it is all held.
        let many = format!(
            "{{\"timestamp\": 0, \"input_length\": 1, \"output_length\": 1, \"hash_ids\": [{}]}}",
            vec!["7"; 1_000_000].join(",")
        );
        let refused = error(&many);
        assert!(
            refused.starts_with("f:1: ") && refused.contains("more than 1954 hash_ids"),
            "{}",
            &refused[..200.min(refused.len())]
        );
        assert_eq!(MAX_HASH_IDS, 1954);
        assert_eq!(
            error("TIMESTAMP,GeneratedTokens\n"),
            "f:1: no ContextTokens column (Azure's CSV has TIMESTAMP,ContextTokens,GeneratedTokens)"
        );
        assert_eq!(
            error("TIMESTAMP,ContextTokens,GeneratedTokens\nyesterday,1,1\n"),
            "f:2: TIMESTAMP is not like 2023-11-16 18:15:46.6805900"
        );
        assert_eq!(
            error("TIMESTAMP,ContextTokens,GeneratedTokens\n2023-11-16 18:15:46,-1,1\n"),
            "f:2: ContextTokens is not a whole number of tokens"
        );
        assert_eq!(
            error("TIMESTAMP,ContextTokens,GeneratedTokens\n"),
            "f: no requests in the trace"
        );
    }
}
