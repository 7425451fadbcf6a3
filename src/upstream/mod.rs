//! The one engine the sidecar forwards to: the pooled HTTP client bound to it, the body
//! type sent to it, and how its failures read.

mod body;
mod pool;
pub mod tls;
mod wake;

pub use body::ResponseBody;
pub use pool::{BoxError, Replayable, SendError, UpstreamBody, H2_STREAM_WINDOW};

use bytes::Bytes;
use http::{Request, Response, StatusCode, Uri};
use http_body_util::{BodyExt, Empty};
use pool::Pool;
use std::sync::Arc;
use std::time::Duration;
use tls::{EngineTls, UpstreamTls};
use tokio::sync::Notify;

pub use crate::body::StreamIdle;

/// The innermost cause of an error: "Connection refused" rather than "client error (Connect)".
pub fn innermost_cause(error: &dyn std::error::Error) -> String {
    let mut cause = error;
    while let Some(source) = cause.source() {
        cause = source;
    }
    cause.to_string()
}

/// How long connecting to the upstream may take before it counts as unreachable.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(10);

/// A pooled HTTP/1.1 client bound to one upstream; it can reach no other target.
#[derive(Clone, Debug)]
pub struct UpstreamClient {
    pool: Arc<Pool>,
    /// The `Host` header for requests that bring none.
    host: http::HeaderValue,
    base_path: String,
    /// Woken when a request could not connect to the engine (the readiness probe listens).
    connect_failed: Arc<Notify>,
}

impl UpstreamClient {
    /// A plain-HTTP client for `upstream`: [`Self::with_tls`] without TLS settings.
    pub fn new(upstream: &Uri, max_idle: usize, idle_timeout: Duration) -> Self {
        Self::with_tls(upstream, &UpstreamTls::default(), max_idle, idle_timeout)
            .expect("an http upstream needs no TLS settings")
    }

    /// A client for `upstream` (an `http://` or `https://host:port[/base]` URI, validated by
    /// the config; an https one in TLS as `tls` says) that keeps at most `max_idle`
    /// connections open between requests, each for at most `idle_timeout`. Each request in
    /// flight holds one HTTP/1.1 connection, so with the proxy's in-flight cap as `max_idle`,
    /// connections to the engine never exceed about that cap; an https engine that chooses h2
    /// takes every request on one connection. An error says which TLS setting does not load.
    pub fn with_tls(
        upstream: &Uri,
        tls: &UpstreamTls,
        max_idle: usize,
        idle_timeout: Duration,
    ) -> Result<Self, String> {
        let authority = upstream
            .authority()
            .cloned()
            .expect("validated upstream has an authority");
        let https = upstream.scheme_str() == Some("https");
        let port = authority.port_u16().unwrap_or(if https { 443 } else { 80 });
        let address = format!("{}:{port}", authority.host());
        let tls = https.then(|| EngineTls::new(authority.host(), tls)).transpose()?;
        Ok(Self {
            pool: Pool::new(address, tls, max_idle, idle_timeout, CONNECT_TIMEOUT),
            host: http::HeaderValue::from_str(authority.as_str()).expect("an authority is a valid header value"),
            base_path: upstream.path().trim_end_matches('/').to_string(),
            connect_failed: Arc::default(),
        })
    }

    /// The upstream's origin-form URI for a request's path and query (the configured base path
    /// before it); the client's URI never picks the target.
    pub fn uri_for(&self, path_and_query: &str) -> Uri {
        Uri::builder()
            .path_and_query(format!("{}{}", self.base_path, path_and_query))
            .build()
            .expect("an origin-form path makes a valid URI")
    }

    /// Sends a request whose URI came from [`Self::uri_for`]; one without a `Host` header is
    /// sent with the upstream's.
    pub async fn send(&self, mut request: Request<UpstreamBody>) -> Result<Response<ResponseBody>, SendError> {
        if !request.headers().contains_key(http::header::HOST) {
            request.headers_mut().insert(http::header::HOST, self.host.clone());
        }
        let sent = self.pool.send(request).await.map(|(response, carrier)| {
            let pool = Arc::downgrade(&self.pool);
            response.map(|body| ResponseBody::new(body, carrier, pool))
        });
        if sent.as_ref().is_err_and(SendError::is_connect) {
            self.connect_failed.notify_one();
        }
        sent
    }

    /// Completes when a request has failed to connect to the engine since the last call.
    pub async fn connect_failed(&self) {
        self.connect_failed.notified().await
    }

    /// GETs `path` on the upstream: its status and body (bounded to 1 MiB).
    pub async fn get(&self, path: &str) -> Result<(StatusCode, Bytes), SendError> {
        let (status, body) = self.get_bounded(path, "*/*", 1 << 20).await?;
        Ok((status, body.unwrap_or_default()))
    }

    /// GETs `path` on the upstream asking for `accept`: its status, and its body unless it
    /// was longer than `limit` bytes or broke off (`None`).
    pub async fn get_bounded(
        &self,
        path: &str,
        accept: &str,
        limit: usize,
    ) -> Result<(StatusCode, Option<Bytes>), SendError> {
        let request = Request::get(self.uri_for(path))
            .header(http::header::ACCEPT, accept)
            .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync())
            .expect("a GET with a valid URI and a static header is a valid request");
        let response = self.send(request).await?;
        let status = response.status();
        // Copied into one buffer as the frames arrive: the page is held once, not as frames
        // and then again whole.
        let declared = response
            .headers()
            .get(http::header::CONTENT_LENGTH)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<usize>().ok());
        let mut body = response.into_body();
        let mut page = Vec::with_capacity(declared.unwrap_or(0).min(limit));
        while let Some(frame) = body.frame().await {
            let Ok(frame) = frame else {
                return Ok((status, None));
            };
            if let Ok(data) = frame.into_data() {
                if page.len() + data.len() > limit {
                    return Ok((status, None));
                }
                page.extend_from_slice(&data);
            }
        }
        Ok((status, Some(Bytes::from(page))))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use hyper::body::Body;
    use std::pin::Pin;
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    use tokio::net::{TcpListener, TcpStream};
    use tokio::sync::mpsc;

    /// What the engine saw of a connection.
    #[derive(Debug, PartialEq)]
    enum Seen {
        Accepted,
        /// The sidecar closed it.
        ClosedBySidecar,
    }

    /// How many chunks the engine's `/chunks` stream sends, 20 ms apart.
    const CHUNKS: usize = 10;

    /// An engine on 127.0.0.1 that answers each GET with `ok`, or with a stream that sends one
    /// chunk and then holds (path `/stream`), or with [`CHUNKS`] chunks (path `/chunks`); it
    /// closes a connection itself after `keep_alive` answers. Reports what it saw of its
    /// connections.
    async fn engine(keep_alive: usize) -> (Uri, mpsc::UnboundedReceiver<Seen>) {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        let (seen, events) = mpsc::unbounded_channel();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                seen.send(Seen::Accepted).unwrap();
                tokio::spawn(serve(stream, keep_alive, seen.clone()));
            }
        });
        (uri, events)
    }

    async fn serve(mut stream: TcpStream, keep_alive: usize, seen: mpsc::UnboundedSender<Seen>) {
        let mut head = Vec::new();
        let mut answered = 0;
        let mut buf = [0u8; 1024];
        while answered < keep_alive {
            let n = stream.read(&mut buf).await.unwrap_or(0);
            if n == 0 {
                let _ = seen.send(Seen::ClosedBySidecar);
                return;
            }
            head.extend_from_slice(&buf[..n]);
            let Some(end) = head.windows(4).position(|w| w == b"\r\n\r\n") else {
                continue;
            };
            let request = String::from_utf8_lossy(&head[..end]).to_string();
            head.drain(..end + 4);
            answered += 1;
            if request.starts_with("GET /chunks") {
                stream
                    .write_all(b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n")
                    .await
                    .unwrap();
                for _ in 0..CHUNKS {
                    tokio::time::sleep(Duration::from_millis(20)).await;
                    stream.write_all(b"5\r\nchunk\r\n").await.unwrap();
                }
                stream.write_all(b"0\r\n\r\n").await.unwrap();
                continue;
            }
            let answer: &[u8] = if request.starts_with("GET /stream") {
                b"HTTP/1.1 200 OK\r\ntransfer-encoding: chunked\r\n\r\n5\r\nfirst\r\n"
            } else {
                b"HTTP/1.1 200 OK\r\ncontent-length: 2\r\n\r\nok"
            };
            stream.write_all(answer).await.unwrap();
        }
    }

    async fn next(events: &mut mpsc::UnboundedReceiver<Seen>) -> Seen {
        tokio::time::timeout(Duration::from_secs(5), events.recv())
            .await
            .unwrap()
            .unwrap()
    }

    #[tokio::test]
    async fn a_connection_is_parked_between_requests_and_reused() {
        let (uri, mut seen) = engine(usize::MAX).await;
        let client = UpstreamClient::new(&uri, 4, Duration::from_secs(60));
        for _ in 0..3 {
            assert_eq!(client.get("/").await.unwrap(), (StatusCode::OK, Bytes::from("ok")));
        }
        assert_eq!(next(&mut seen).await, Seen::Accepted);
        assert!(seen.try_recv().is_err(), "one connection served all three");
        assert_eq!(client.pool.idle(), 1);
    }

    #[tokio::test]
    async fn a_parked_connection_the_engine_closed_is_replaced() {
        let (uri, mut seen) = engine(1).await;
        let client = UpstreamClient::new(&uri, 4, Duration::from_secs(60));
        assert_eq!(client.get("/").await.unwrap().1, "ok");
        assert_eq!(next(&mut seen).await, Seen::Accepted);
        // The engine closes it after its one answer; the next request does not fail for it.
        tokio::time::sleep(Duration::from_millis(50)).await;
        assert_eq!(client.get("/").await.unwrap().1, "ok");
        assert_eq!(next(&mut seen).await, Seen::Accepted);
    }

    #[tokio::test]
    async fn an_idle_connection_is_closed_after_the_idle_timeout() {
        let (uri, mut seen) = engine(usize::MAX).await;
        let client = UpstreamClient::new(&uri, 4, Duration::from_millis(200));
        assert_eq!(client.get("/").await.unwrap().1, "ok");
        assert_eq!(next(&mut seen).await, Seen::Accepted);
        assert_eq!(next(&mut seen).await, Seen::ClosedBySidecar);
        assert_eq!(client.pool.idle(), 0);
        assert_eq!(client.get("/").await.unwrap().1, "ok", "a new one is opened");
        assert_eq!(next(&mut seen).await, Seen::Accepted);
    }

    #[tokio::test]
    async fn a_body_dropped_part_way_closes_its_connection() {
        let (uri, mut seen) = engine(usize::MAX).await;
        let client = UpstreamClient::new(&uri, 4, Duration::from_secs(60));
        let request = Request::get(client.uri_for("/stream"))
            .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync())
            .unwrap();
        let mut body = client.send(request).await.unwrap().into_body();
        let first = body.frame().await.unwrap().unwrap().into_data().unwrap();
        assert_eq!(first, "first");
        drop(body);
        assert_eq!(next(&mut seen).await, Seen::Accepted);
        assert_eq!(next(&mut seen).await, Seen::ClosedBySidecar);
        assert_eq!(client.pool.idle(), 0);
    }

    #[tokio::test]
    async fn each_chunk_of_a_stream_wakes_the_reading_task_once() {
        let (uri, _seen) = engine(usize::MAX).await;
        let client = UpstreamClient::new(&uri, 4, Duration::from_secs(60));
        let request = Request::get(client.uri_for("/chunks"))
            .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync())
            .unwrap();
        let mut body = client.send(request).await.unwrap().into_body();
        let (mut polls, mut chunks) = (0, 0);
        std::future::poll_fn(|cx| {
            polls += 1;
            loop {
                match std::task::ready!(Pin::new(&mut body).poll_frame(cx)) {
                    Some(frame) => {
                        assert_eq!(frame.unwrap().into_data().unwrap(), "chunk");
                        chunks += 1;
                    }
                    None => return std::task::Poll::Ready(()),
                }
            }
        })
        .await;
        assert_eq!(chunks, CHUNKS);
        // The connection hands each chunk to the body, which takes it: passed on to the task,
        // their wake-ups of each other would have it polled twice per chunk.
        assert!(polls <= CHUNKS + 2, "{polls} polls for {CHUNKS} chunks");
        assert_eq!(client.pool.idle(), 1, "parked at the end");
    }

    #[tokio::test]
    async fn at_most_max_idle_connections_are_kept() {
        let (uri, mut seen) = engine(usize::MAX).await;
        let client = UpstreamClient::new(&uri, 2, Duration::from_secs(60));
        // Three responses held at once hold three connections; read, they are parked.
        let mut bodies = Vec::new();
        for _ in 0..3 {
            let request = Request::get(client.uri_for("/"))
                .body(Empty::<Bytes>::new().map_err(|never| match never {}).boxed_unsync())
                .unwrap();
            bodies.push(client.send(request).await.unwrap().into_body());
        }
        for _ in 0..3 {
            assert_eq!(next(&mut seen).await, Seen::Accepted);
        }
        for body in bodies {
            assert_eq!(body.collect().await.unwrap().to_bytes(), "ok");
        }
        assert_eq!(client.pool.idle(), 2);
        assert_eq!(next(&mut seen).await, Seen::ClosedBySidecar, "the third is closed");
    }

    /// An https engine on 127.0.0.1 whose ALPN offers `alpn`, answering each request `ok` after
    /// 100 ms; it counts its connections and notes each request's HTTP version.
    async fn tls_engine(
        alpn: &[&[u8]],
    ) -> (
        Uri,
        Arc<std::sync::atomic::AtomicUsize>,
        mpsc::UnboundedReceiver<http::Version>,
    ) {
        use hyper_util::rt::{TokioExecutor, TokioIo};
        let key = rcgen::KeyPair::generate().unwrap();
        let certificate = rcgen::CertificateParams::new(vec!["localhost".to_string()])
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let mut config =
            rustls::ServerConfig::builder_with_provider(Arc::new(rustls::crypto::ring::default_provider()))
                .with_safe_default_protocol_versions()
                .unwrap()
                .with_no_client_auth()
                .with_single_cert(
                    vec![certificate.der().clone()],
                    rustls::pki_types::PrivateKeyDer::Pkcs8(key.serialize_der().into()),
                )
                .unwrap();
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        let acceptor = tokio_rustls::TlsAcceptor::from(Arc::new(config));
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let uri = format!("https://{}", listener.local_addr().unwrap()).parse().unwrap();
        let accepted = Arc::new(std::sync::atomic::AtomicUsize::new(0));
        let (versions, seen) = mpsc::unbounded_channel();
        let counted = accepted.clone();
        tokio::spawn(async move {
            loop {
                let (stream, _) = listener.accept().await.unwrap();
                counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
                let (acceptor, versions) = (acceptor.clone(), versions.clone());
                tokio::spawn(async move {
                    let Ok(stream) = acceptor.accept(stream).await else {
                        return;
                    };
                    let service = hyper::service::service_fn(move |request: Request<hyper::body::Incoming>| {
                        let _ = versions.send(request.version());
                        async {
                            tokio::time::sleep(Duration::from_millis(100)).await;
                            Ok::<_, std::convert::Infallible>(Response::new(http_body_util::Full::new(Bytes::from(
                                "ok",
                            ))))
                        }
                    });
                    let _ = hyper_util::server::conn::auto::Builder::new(TokioExecutor::new())
                        .serve_connection(TokioIo::new(stream), service)
                        .await;
                });
            }
        });
        (uri, accepted, seen)
    }

    /// Sends three requests at once to `client` and checks each is answered `ok`.
    async fn three_at_once(client: &UpstreamClient) {
        let answers = futures_util::future::join_all((0..3).map(|_| client.get("/"))).await;
        for answer in answers {
            assert_eq!(answer.unwrap(), (StatusCode::OK, Bytes::from("ok")));
        }
    }

    fn skip_verify() -> UpstreamTls {
        UpstreamTls {
            insecure_skip_verify: true,
            ..UpstreamTls::default()
        }
    }

    #[tokio::test]
    async fn an_https_engine_that_chooses_h2_takes_every_request_on_one_connection() {
        let (uri, accepted, mut versions) = tls_engine(&[b"h2", b"http/1.1"]).await;
        let client = UpstreamClient::with_tls(&uri, &skip_verify(), 4, Duration::from_secs(60)).unwrap();
        three_at_once(&client).await;
        three_at_once(&client).await;
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            1,
            "six requests, one connection"
        );
        for _ in 0..6 {
            assert_eq!(versions.recv().await, Some(http::Version::HTTP_2));
        }
        assert_eq!(client.pool.idle(), 0, "an HTTP/2 connection is shared, never parked");
        assert_eq!(client.pool.shared(), 1);
    }

    #[tokio::test]
    async fn a_shared_h2_connection_carries_a_hundred_streams_and_more_open_another() {
        let (uri, accepted, _versions) = tls_engine(&[b"h2"]).await;
        let client = UpstreamClient::with_tls(&uri, &skip_verify(), 1024, Duration::from_secs(60)).unwrap();
        let answers = futures_util::future::join_all((0..150).map(|_| client.get("/"))).await;
        assert!(answers
            .iter()
            .all(|answer| answer.as_ref().is_ok_and(|(status, _)| *status == StatusCode::OK)));
        assert_eq!(
            accepted.load(std::sync::atomic::Ordering::SeqCst),
            2,
            "150 streams at once on two connections"
        );
        assert_eq!(client.pool.shared(), 2);
    }

    #[tokio::test]
    async fn an_https_engine_that_serves_only_http1_gets_a_connection_per_request_in_flight() {
        let (uri, accepted, mut versions) = tls_engine(&[b"http/1.1"]).await;
        let client = UpstreamClient::with_tls(&uri, &skip_verify(), 4, Duration::from_secs(60)).unwrap();
        three_at_once(&client).await;
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 3);
        for _ in 0..3 {
            assert_eq!(versions.recv().await, Some(http::Version::HTTP_11));
        }
        assert_eq!(client.pool.idle(), 3);
    }

    #[tokio::test]
    async fn a_shared_h2_connection_unused_for_the_idle_timeout_is_let_go_and_another_opened() {
        let (uri, accepted, _versions) = tls_engine(&[b"h2"]).await;
        let client = UpstreamClient::with_tls(&uri, &skip_verify(), 4, Duration::from_millis(200)).unwrap();
        assert_eq!(client.get("/").await.unwrap().1, "ok");
        tokio::time::sleep(Duration::from_millis(600)).await;
        assert!(client.pool.shared() == 0, "let go after the idle timeout");
        assert_eq!(client.get("/").await.unwrap().1, "ok");
        assert_eq!(accepted.load(std::sync::atomic::Ordering::SeqCst), 2);
    }

    #[tokio::test]
    async fn an_engine_that_cannot_be_reached_is_a_connect_error() {
        let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let uri: Uri = format!("http://{}", listener.local_addr().unwrap()).parse().unwrap();
        drop(listener);
        let client = UpstreamClient::new(&uri, 2, Duration::from_secs(60));
        let error = client.get("/").await.unwrap_err();
        assert!(error.is_connect(), "{error:?}");
        assert_eq!(innermost_cause(&error), "Connection refused (os error 111)");
    }
}
