//! Header handling for a forwarding proxy: hop-by-hop removal (RFC 9110 §7.6.1) and
//! `x-forwarded-for`.

use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use std::net::IpAddr;

/// Headers that describe one connection, never forwarded.
static HOP_BY_HOP: [HeaderName; 8] = [
    header::CONNECTION,
    HeaderName::from_static("proxy-connection"),
    HeaderName::from_static("keep-alive"),
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
    HeaderName::from_static("http2-settings"),
];

/// The header that carries the chain of client addresses a request came through.
static X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");

/// Removes the hop-by-hop headers, including every header the `Connection` header names.
/// A message framed by Transfer-Encoding also loses its Content-Length (RFC 9112 §6.3): the
/// length it states is not the length of the message that is forwarded.
pub fn remove_hop_by_hop(headers: &mut HeaderMap) {
    if headers.contains_key(header::TRANSFER_ENCODING) {
        headers.remove(header::CONTENT_LENGTH);
    }
    let named: Vec<HeaderName> = headers
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|name| HeaderName::from_bytes(name.trim().as_bytes()).ok())
        .collect();
    for name in named {
        headers.remove(name);
    }
    for name in &HOP_BY_HOP {
        headers.remove(name);
    }
}

/// Appends `client` to `x-forwarded-for`, joining any values the client already sent.
pub fn append_forwarded_for(headers: &mut HeaderMap, client: IpAddr) {
    let client = client.to_string();
    let mut chain: Vec<&str> = headers
        .get_all(&X_FORWARDED_FOR)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .collect();
    let value = if chain.is_empty() {
        HeaderValue::from_str(&client)
    } else {
        chain.push(&client);
        HeaderValue::from_str(&chain.join(", "))
    };
    if let Ok(value) = value {
        headers.insert(&X_FORWARDED_FOR, value);
    }
}

/// Whether the body is a multipart form (an audio upload): no JSON in it names the model.
pub fn is_multipart(headers: &HeaderMap) -> bool {
    const MULTIPART: &str = "multipart/";
    headers
        .get(http::header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim_start().get(..MULTIPART.len()))
        .is_some_and(|kind| kind.eq_ignore_ascii_case(MULTIPART))
}

/// The declared Content-Length, when it is a valid one.
pub fn content_length(headers: &HeaderMap) -> Option<u64> {
    headers.get(http::header::CONTENT_LENGTH)?.to_str().ok()?.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn removes_standard_and_connection_named_headers() {
        let mut h = HeaderMap::new();
        h.insert("connection", HeaderValue::from_static("keep-alive, X-Secret-Hop"));
        h.insert("x-secret-hop", HeaderValue::from_static("1"));
        h.insert("keep-alive", HeaderValue::from_static("timeout=5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("proxy-connection", HeaderValue::from_static("keep-alive"));
        h.insert("trailer", HeaderValue::from_static("x-checksum"));
        h.insert("http2-settings", HeaderValue::from_static("AAMAAABkAAQAAP__"));
        h.insert("authorization", HeaderValue::from_static("Bearer x"));
        h.insert("content-type", HeaderValue::from_static("application/json"));
        remove_hop_by_hop(&mut h);
        let mut left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        left.sort();
        assert_eq!(left, ["authorization", "content-type"]);
    }

    #[test]
    fn content_length_goes_with_transfer_encoding() {
        let mut h = HeaderMap::new();
        h.insert("content-length", HeaderValue::from_static("5"));
        h.insert("transfer-encoding", HeaderValue::from_static("chunked"));
        remove_hop_by_hop(&mut h);
        assert!(h.is_empty(), "{h:?}");
        let mut plain = HeaderMap::new();
        plain.insert("content-length", HeaderValue::from_static("5"));
        remove_hop_by_hop(&mut plain);
        assert_eq!(plain["content-length"], "5");
    }

    #[test]
    fn forwarded_for_is_appended() {
        let mut h = HeaderMap::new();
        append_forwarded_for(&mut h, "10.0.0.1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        h.append("x-forwarded-for", HeaderValue::from_static("192.0.2.9"));
        append_forwarded_for(&mut h, "127.0.0.1".parse().unwrap());
        assert_eq!(h["x-forwarded-for"], "10.0.0.1, 192.0.2.9, 127.0.0.1");
    }

    #[test]
    fn multipart_is_told_by_its_content_type_in_any_case() {
        let with = |value: &str| {
            let mut h = HeaderMap::new();
            h.insert(http::header::CONTENT_TYPE, HeaderValue::from_str(value).unwrap());
            is_multipart(&h)
        };
        assert!(with("multipart/form-data; boundary=x"));
        assert!(with("  Multipart/Mixed"));
        assert!(!with("application/json"));
        assert!(!with("multipart"));
        assert!(!with("multipart-form"));
        assert!(!is_multipart(&HeaderMap::new()));
    }
}
