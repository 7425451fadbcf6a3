//! Decoding a compressed response body for the observer, while the client still receives the
//! compressed bytes untouched. Decoded bytes go straight to a sink as they come out of the
//! decoder, so memory stays bounded whatever the compression ratio.

use brotli_decompressor::DecompressorWriter;
use flate2::write::{GzDecoder, ZlibDecoder};
use http::{header, HeaderMap};
use std::io::{self, Write};

/// Decoder buffer for brotli (gzip and deflate use flate2's own).
const BROTLI_BUFFER: usize = 16 * 1024;
/// Longest `Content-Encoding` value repeated in a log line.
const MAX_LOGGED_ENCODING: usize = 32;

/// A response's `Content-Encoding`, as far as llmslo can decode it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Encoding {
    /// No encoding (or `identity`).
    Identity,
    /// `gzip` (or `x-gzip`).
    Gzip,
    /// `deflate`: the zlib format (RFC 9110 §8.4.1.2).
    Deflate,
    /// `br`.
    Brotli,
    /// `zstd`.
    Zstd,
}

impl Encoding {
    /// The encoding named by `headers`, or the (bounded) value that llmslo cannot decode:
    /// an unknown coding, or several codings stacked.
    pub fn from_headers(headers: &HeaderMap) -> Result<Self, String> {
        let mut codings = headers
            .get_all(header::CONTENT_ENCODING)
            .iter()
            .flat_map(|v| v.as_bytes().split(|b| *b == b','))
            .map(|c| String::from_utf8_lossy(c.trim_ascii()).to_ascii_lowercase())
            .filter(|c| !c.is_empty() && c != "identity");
        let Some(coding) = codings.next() else {
            return Ok(Encoding::Identity);
        };
        let bounded = |mut text: String| {
            if text.len() > MAX_LOGGED_ENCODING {
                let mut end = MAX_LOGGED_ENCODING;
                while !text.is_char_boundary(end) {
                    end -= 1;
                }
                text.truncate(end);
            }
            text
        };
        if codings.next().is_some() {
            return Err(bounded(format!("{coding}, …")));
        }
        match coding.as_str() {
            "gzip" | "x-gzip" => Ok(Encoding::Gzip),
            "deflate" => Ok(Encoding::Deflate),
            "br" => Ok(Encoding::Brotli),
            "zstd" => Ok(Encoding::Zstd),
            _ => Err(bounded(coding)),
        }
    }
}

/// Writes a body's bytes, decoded, into a sink.
pub struct Decoder<W: Write>(Inner<W>);

enum Inner<W: Write> {
    Identity(W),
    Gzip(GzDecoder<W>),
    Deflate(ZlibDecoder<W>),
    Brotli(Box<DecompressorWriter<W>>),
    Zstd(zstd::stream::write::Decoder<'static, W>),
}

impl<W: Write> std::fmt::Debug for Decoder<W> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self.0 {
            Inner::Identity(_) => "identity",
            Inner::Gzip(_) => "gzip",
            Inner::Deflate(_) => "deflate",
            Inner::Brotli(_) => "br",
            Inner::Zstd(_) => "zstd",
        };
        f.debug_tuple("Decoder").field(&name).finish()
    }
}

impl<W: Write> Decoder<W> {
    /// A decoder for `encoding` writing into `sink`.
    pub fn new(encoding: Encoding, sink: W) -> io::Result<Self> {
        Ok(Self(match encoding {
            Encoding::Identity => Inner::Identity(sink),
            Encoding::Gzip => Inner::Gzip(GzDecoder::new(sink)),
            Encoding::Deflate => Inner::Deflate(ZlibDecoder::new(sink)),
            Encoding::Brotli => Inner::Brotli(Box::new(DecompressorWriter::new(sink, BROTLI_BUFFER))),
            Encoding::Zstd => Inner::Zstd(zstd::stream::write::Decoder::new(sink)?),
        }))
    }

    /// True when bytes reach the sink as they are.
    pub fn is_identity(&self) -> bool {
        matches!(self.0, Inner::Identity(_))
    }

    /// Decodes `bytes` into the sink; an error means the body cannot be decoded further.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        match &mut self.0 {
            Inner::Identity(w) => w.write_all(bytes),
            Inner::Gzip(w) => w.write_all(bytes).and_then(|()| w.flush()),
            Inner::Deflate(w) => w.write_all(bytes).and_then(|()| w.flush()),
            Inner::Brotli(w) => w.write_all(bytes).and_then(|()| w.flush()),
            Inner::Zstd(w) => w.write_all(bytes).and_then(|()| w.flush()),
        }
    }

    /// The sink.
    pub fn sink(&self) -> &W {
        match &self.0 {
            Inner::Identity(w) => w,
            Inner::Gzip(w) => w.get_ref(),
            Inner::Deflate(w) => w.get_ref(),
            Inner::Brotli(w) => w.get_ref(),
            Inner::Zstd(w) => w.get_ref(),
        }
    }

    /// The sink, to change it between writes.
    pub fn sink_mut(&mut self) -> &mut W {
        match &mut self.0 {
            Inner::Identity(w) => w,
            Inner::Gzip(w) => w.get_mut(),
            Inner::Deflate(w) => w.get_mut(),
            Inner::Brotli(w) => w.get_mut(),
            Inner::Zstd(w) => w.get_mut(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn encoding(value: &str) -> Result<Encoding, String> {
        let mut headers = HeaderMap::new();
        headers.insert(header::CONTENT_ENCODING, HeaderValue::from_str(value).unwrap());
        Encoding::from_headers(&headers)
    }

    #[test]
    fn content_encoding_names() {
        assert_eq!(Encoding::from_headers(&HeaderMap::new()), Ok(Encoding::Identity));
        assert_eq!(encoding("identity"), Ok(Encoding::Identity));
        assert_eq!(encoding("GZIP"), Ok(Encoding::Gzip));
        assert_eq!(encoding("x-gzip"), Ok(Encoding::Gzip));
        assert_eq!(encoding("deflate"), Ok(Encoding::Deflate));
        assert_eq!(encoding(" br "), Ok(Encoding::Brotli));
        assert_eq!(encoding("zstd"), Ok(Encoding::Zstd));
        assert_eq!(encoding("compress"), Err("compress".into()));
        assert_eq!(encoding("gzip, br"), Err("gzip, …".into()));
        let long = encoding(&"x".repeat(10_000)).unwrap_err();
        assert_eq!(long.len(), MAX_LOGGED_ENCODING, "log lines stay bounded");
    }

    /// Gzip of `pieces`, flushed after each as a streaming server does.
    fn gz(pieces: &[&[u8]]) -> Vec<u8> {
        let mut w = flate2::write::GzEncoder::new(Vec::new(), Default::default());
        for piece in pieces {
            w.write_all(piece).unwrap();
            w.flush().unwrap();
        }
        w.finish().unwrap()
    }

    #[test]
    fn every_encoding_decodes_byte_by_byte() {
        let plain = b"data: {\"choices\":[{\"delta\":{\"content\":\"hello\"}}]}\n\ndata: [DONE]\n\n".repeat(20);
        let encoded = [
            (Encoding::Gzip, gz(&[&plain])),
            (Encoding::Deflate, {
                let mut w = flate2::write::ZlibEncoder::new(Vec::new(), Default::default());
                w.write_all(&plain).unwrap();
                w.finish().unwrap()
            }),
            (Encoding::Brotli, {
                let mut w = brotli::CompressorWriter::new(Vec::new(), 4096, 5, 22);
                w.write_all(&plain).unwrap();
                w.into_inner()
            }),
            (Encoding::Zstd, zstd::encode_all(&plain[..], 3).unwrap()),
        ];
        for (encoding, bytes) in encoded {
            let mut decoder = Decoder::new(encoding, Vec::new()).unwrap();
            for byte in &bytes {
                decoder.write(std::slice::from_ref(byte)).unwrap();
            }
            assert_eq!(decoder.sink(), &plain, "{encoding:?}");
        }
    }
}
