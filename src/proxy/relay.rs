//! The prefill relay of a decode pod's sidecar. In disaggregated serving the router names a
//! prefill pod in `x-prefiller-host-port`, and the routing sidecar behind llmslo sends the
//! prompt there as a prefill leg. With the relay on, llmslo names itself instead (its relay
//! address) and tags the request; the routing sidecar copies the request's headers onto the
//! leg, so the leg comes to the relay, which sends it on to the prefill pod the router named
//! and times it: the prefill part of that very request's TTFT, measured in one process.
//!
//! The relay only ever sends a leg to the address the router gave a request in flight here,
//! and only when that address is a pod of the prefill pool ([`pool`]): a request naming any
//! other address goes on untouched (the routing sidecar then does what it would without
//! llmslo), and a leg for any other request (or none) is refused with one answer, whatever is
//! at any address.

pub mod pool;

use super::error::error_response;
use super::ProxyBody;
use crate::record::{PrefillDiverter, PrefillTimer, RelaySkip, PREFILLER_HEADERS};
use crate::upstream::tls::UpstreamTls;
use http::header::{self, HeaderName, HeaderValue};
use http::{HeaderMap, Request, Response, StatusCode, Uri};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_rustls::HttpsConnector;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use pool::PrefillPool;
use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::time::Instant;
use tracing::warn;

/// The header that tags a request, and so its prefill leg, with its relay entry.
pub static RELAY_HEADER: HeaderName = HeaderName::from_static("x-llmslo-relay");

/// Longest `x-prefiller-host-port` value read (an IPv6 address in brackets and a port).
const MAX_TARGET_BYTES: usize = 64;

/// The relay: the requests in flight whose prefill legs it expects, and its client.
#[derive(Debug)]
pub struct PrefillRelay {
    /// The address the routing sidecar is given instead of the prefill pod's.
    advertised: HeaderValue,
    /// Keyed by a random id: a leg cannot name another request's entry by guessing.
    pending: Mutex<HashMap<u64, Arc<Pending>>>,
    client: Client<HttpsConnector<HttpConnector>, Incoming>,
    /// `https` when the legs go to the prefill pods in TLS, else `http`.
    scheme: &'static str,
    /// How long the prefill pod may take to answer a leg.
    timeout: Duration,
    /// The only pods legs are sent to.
    pool: Arc<PrefillPool>,
    /// When a leg that could not reach its prefill pod was last logged (one line a minute).
    unreachable_logged: Mutex<Option<Instant>>,
}

/// One request's expected leg.
#[derive(Debug)]
struct Pending {
    /// The prefill pod the router named, one of the pool's.
    target: SocketAddr,
    /// How long its leg took, once it answered successfully.
    prefill: Mutex<Option<Duration>>,
}

/// A request's claim on the relay: its prefill leg's time once relayed; dropped with the
/// request, after which its leg is refused.
#[derive(Debug)]
pub struct RelayTicket {
    relay: Arc<PrefillRelay>,
    id: u64,
    pending: Arc<Pending>,
}

impl PrefillTimer for RelayTicket {
    /// From the relay receiving the leg to the prefill pod's answer, when it was relayed and
    /// answered successfully.
    fn prefill(&self) -> Option<Duration> {
        *self.pending.prefill.lock().expect("relay entry lock")
    }
}

impl Drop for RelayTicket {
    fn drop(&mut self) {
        self.relay.pending.lock().expect("relay table lock").remove(&self.id);
    }
}

impl PrefillRelay {
    /// A relay listening on `address` that sends legs to the pods of `pool` alone, over https
    /// verified as `tls` says when it is given, waiting `timeout` at most for a prefill pod's
    /// answer. An error says which TLS setting does not load.
    pub fn new(
        address: SocketAddr,
        timeout: Duration,
        pool: Arc<PrefillPool>,
        tls: Option<&UpstreamTls>,
    ) -> Result<Arc<Self>, String> {
        let mut connector = HttpConnector::new();
        connector.set_connect_timeout(Some(Duration::from_secs(10)));
        connector.set_nodelay(true);
        connector.enforce_http(false);
        let settings = tls.cloned().unwrap_or_default();
        let connector = hyper_rustls::HttpsConnectorBuilder::new()
            .with_tls_config(crate::upstream::tls::client_config(&settings, "prefill_tls")?)
            .https_or_http()
            .enable_http1()
            .wrap_connector(connector);
        Ok(Arc::new(Self {
            advertised: HeaderValue::from_str(&address.to_string()).expect("a socket address is a header value"),
            pending: Mutex::default(),
            client: Client::builder(TokioExecutor::new())
                .pool_idle_timeout(Duration::from_secs(4))
                .build(connector),
            scheme: if tls.is_some() { "https" } else { "http" },
            timeout,
            pool,
            unreachable_logged: Mutex::default(),
        }))
    }

    /// When the router named one prefill pod of the pool, names the relay instead and tags the
    /// request; the ticket says how long its leg took. Several pods named (the routing sidecar
    /// then picks one itself), anything but one `address:port`, the older URL header, or an
    /// address outside the pool: the request goes on untouched, its prefill part unmeasured,
    /// and the reason is returned.
    pub fn divert(self: &Arc<Self>, headers: &mut HeaderMap) -> Result<RelayTicket, RelaySkip> {
        let name = &PREFILLER_HEADERS[0];
        let mut values = headers.get_all(name).iter();
        let (Some(value), None) = (values.next(), values.next()) else {
            return Err(RelaySkip::NotOneAddress);
        };
        let text = value.to_str().map_err(|_| RelaySkip::NotOneAddress)?.trim();
        if text.len() > MAX_TARGET_BYTES {
            return Err(RelaySkip::NotOneAddress);
        }
        let target: SocketAddr = text.parse().map_err(|_| RelaySkip::NotOneAddress)?;
        if !self.pool.allows(target) {
            return Err(RelaySkip::OutsidePool);
        }
        let pending = Arc::new(Pending {
            target,
            prefill: Mutex::new(None),
        });
        let id = {
            let mut table = self.pending.lock().expect("relay table lock");
            let id = std::iter::repeat_with(rand::random::<u64>)
                .find(|id| !table.contains_key(id))
                .expect("a free id");
            table.insert(id, pending.clone());
            id
        };
        headers.insert(name, self.advertised.clone());
        headers.insert(&RELAY_HEADER, HeaderValue::from(id));
        Ok(RelayTicket {
            relay: self.clone(),
            id,
            pending,
        })
    }

    /// Requests whose legs the relay expects now.
    #[cfg(test)]
    fn pending(&self) -> usize {
        self.pending.lock().expect("relay table lock").len()
    }

    /// Sends a prefill leg on to the prefill pod its request's router named, and notes how
    /// long the pod took to answer.
    pub async fn relay(self: Arc<Self>, mut request: Request<Incoming>) -> Response<ProxyBody> {
        let arrived = Instant::now();
        let id = request
            .headers()
            .get(&RELAY_HEADER)
            .and_then(|v| v.to_str().ok())
            .and_then(|v| v.parse::<u64>().ok());
        let pending = id.and_then(|id| self.pending.lock().expect("relay table lock").get(&id).cloned());
        let Some(pending) = pending else {
            return refusal(
                StatusCode::NOT_FOUND,
                "no request in flight here expects this prefill leg: llmslo relays only the legs of requests it forwards",
            );
        };
        let path = request.uri().path_and_query().map_or("/", |p| p.as_str());
        let uri = Uri::builder()
            .scheme(self.scheme)
            .authority(pending.target.to_string())
            .path_and_query(path)
            .build();
        let Ok(uri) = uri else {
            return refusal(StatusCode::BAD_REQUEST, "the prefill leg's path is not a valid URI");
        };
        *request.uri_mut() = uri;
        let headers = request.headers_mut();
        headers.remove(&RELAY_HEADER);
        headers.remove(header::HOST);
        match tokio::time::timeout(self.timeout, self.client.request(request)).await {
            Ok(Ok(response)) => {
                if response.status().is_success() {
                    *pending.prefill.lock().expect("relay entry lock") = Some(arrived.elapsed());
                }
                response.map(|body| body.map_err(Into::into).boxed_unsync())
            }
            Ok(Err(error)) => {
                self.log_unreachable(&error);
                refusal(StatusCode::BAD_GATEWAY, "the prefill pod could not be reached")
            }
            Err(_) => refusal(StatusCode::GATEWAY_TIMEOUT, "the prefill pod sent no answer in time"),
        }
    }
}

impl PrefillRelay {
    /// Says why a leg could not reach its prefill pod (a refused connection, a certificate that
    /// does not verify), at most once a minute.
    fn log_unreachable(&self, error: &hyper_util::client::legacy::Error) {
        let mut logged = self.unreachable_logged.lock().expect("relay log lock");
        if logged.is_some_and(|at| at.elapsed() < Duration::from_secs(60)) {
            return;
        }
        *logged = Some(Instant::now());
        warn!(
            error = %crate::upstream::innermost_cause(error),
            "a prefill leg could not reach its prefill pod: answered 502 to the routing sidecar (with prefill_tls, \
             a pod whose certificate does not verify is never trusted: name its CA in prefill_tls.ca_file)"
        );
    }
}

impl PrefillDiverter for PrefillRelay {
    /// Only llmslo tags a request for its relay.
    fn untag(&self, headers: &mut HeaderMap) {
        headers.remove(&RELAY_HEADER);
    }

    fn divert_prefill(self: Arc<Self>, headers: &mut HeaderMap) -> Result<Box<dyn PrefillTimer>, RelaySkip> {
        self.divert(headers)
            .map(|ticket| Box::new(ticket) as Box<dyn PrefillTimer>)
    }
}

/// The relay's own answer, in the OpenAI error shape.
fn refusal(status: StatusCode, message: &str) -> Response<ProxyBody> {
    error_response(status, "prefill_relay", message)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn relay() -> Arc<PrefillRelay> {
        let pool = PrefillPool::new(vec![pool::PoolMember::parse("10.0.0.0/24:8000").unwrap()]);
        PrefillRelay::new("127.0.0.1:9".parse().unwrap(), Duration::from_secs(1), pool, None).unwrap()
    }

    fn headers(values: &[&str]) -> HeaderMap {
        let mut headers = HeaderMap::new();
        for v in values {
            headers.append(&PREFILLER_HEADERS[0], HeaderValue::from_str(v).unwrap());
        }
        headers
    }

    #[tokio::test]
    async fn one_named_prefill_pod_is_diverted_to_the_relay_until_the_request_ends() {
        let relay = relay();
        let mut h = headers(&["10.0.0.5:8000"]);
        let ticket = relay.divert(&mut h).expect("diverted");
        assert_eq!(h.get(&PREFILLER_HEADERS[0]).unwrap(), "127.0.0.1:9");
        assert!(h.contains_key(&RELAY_HEADER));
        assert_eq!((relay.pending(), ticket.prefill()), (1, None));
        drop(ticket);
        assert_eq!(relay.pending(), 0, "a finished request's leg is refused from then on");
    }

    #[tokio::test]
    async fn what_cannot_be_relayed_goes_on_untouched() {
        let relay = relay();
        for (values, why) in [
            (&["10.0.0.5:8000,10.0.0.6:8000"][..], RelaySkip::NotOneAddress),
            (&["10.0.0.5:8000", "10.0.0.6:8000"], RelaySkip::NotOneAddress),
            (&["10.0.0.5"], RelaySkip::NotOneAddress),
            (&["http://10.0.0.5:8000/x"], RelaySkip::NotOneAddress),
            (&["user@10.0.0.5:8000"], RelaySkip::NotOneAddress),
            (&["prefill.example:8000"], RelaySkip::NotOneAddress),
            (&[""], RelaySkip::NotOneAddress),
            // Where only a request named it: an internal service, another port of a pod.
            (&["10.9.0.1:8000"], RelaySkip::OutsidePool),
            (&["169.254.169.254:80"], RelaySkip::OutsidePool),
            (&["10.0.0.5:6379"], RelaySkip::OutsidePool),
        ] {
            let mut h = headers(values);
            let before = h.clone();
            assert_eq!(relay.divert(&mut h).unwrap_err(), why, "{values:?}");
            assert_eq!(h, before);
        }
        assert_eq!(relay.pending(), 0);
    }
}
