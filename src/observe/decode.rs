//! Decoding a compressed response body for the observer, while the client still receives the
//! compressed bytes untouched. Decoded bytes go straight to a sink as they come out of the
//! decoder, so memory stays bounded whatever the compression ratio; the work is bounded too:
//! a body may decode to at most `DECODED_PER_ENCODED` times its encoded bytes (plus
//! `DECODED_HEADROOM`), and a zstd frame may ask for a window of at most 8 MiB, so a
//! compression bomb stops being decoded (and measured) instead of holding a worker thread.

use brotli_decompressor::DecompressorWriter;
use flate2::write::{GzDecoder, ZlibDecoder};
use http::{header, HeaderMap};
use std::io::{self, Write};

/// Decoder buffer for brotli (gzip and deflate use flate2's own).
const BROTLI_BUFFER: usize = 16 * 1024;
/// Decoded bytes a body may produce per encoded byte received: LLM event streams compress
/// 10 to 20 times; a compression bomb, thousands of times.
const DECODED_PER_ENCODED: u64 = 256;
/// Decoded bytes a body may produce beyond that ratio.
const DECODED_HEADROOM: u64 = 4 << 20;
/// Largest zstd window accepted, as a power of two: 8 MiB, what RFC 9659 asks HTTP decoders
/// to support (zstd itself allows 128 MiB).
const ZSTD_WINDOW_LOG_MAX: u32 = 23;
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

/// The decompressors are boxed: an enum is as large as its largest variant, and nearly every
/// stream is sent as it is (a gzip decoder inline made each stream's observer 1 KiB, not 0.6).
enum Inner<W: Write> {
    Identity(W),
    Gzip(Box<GzDecoder<Bounded<W>>>),
    Deflate(Box<ZlibDecoder<Bounded<W>>>),
    Brotli(Box<DecompressorWriter<Bounded<W>>>),
    Zstd(Box<zstd::stream::write::Decoder<'static, Bounded<W>>>),
}

/// A sink that takes decoded bytes only within an allowance the encoded bytes grow.
struct Bounded<W> {
    sink: W,
    allowance: u64,
}

impl<W: Write> Write for Bounded<W> {
    fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
        let n = bytes.len() as u64;
        if n > self.allowance {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                "the body decodes to more than its compression ratio allows",
            ));
        }
        self.allowance -= n;
        self.sink.write_all(bytes)?;
        Ok(bytes.len())
    }

    fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }
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
        let bounded = |sink| Bounded {
            sink,
            allowance: DECODED_HEADROOM,
        };
        Ok(Self(match encoding {
            Encoding::Identity => Inner::Identity(sink),
            Encoding::Gzip => Inner::Gzip(Box::new(GzDecoder::new(bounded(sink)))),
            Encoding::Deflate => Inner::Deflate(Box::new(ZlibDecoder::new(bounded(sink)))),
            Encoding::Brotli => Inner::Brotli(Box::new(DecompressorWriter::new(bounded(sink), BROTLI_BUFFER))),
            Encoding::Zstd => {
                let mut decoder = zstd::stream::write::Decoder::new(bounded(sink))?;
                decoder.window_log_max(ZSTD_WINDOW_LOG_MAX)?;
                Inner::Zstd(Box::new(decoder))
            }
        }))
    }

    /// True when bytes reach the sink as they are.
    pub fn is_identity(&self) -> bool {
        matches!(self.0, Inner::Identity(_))
    }

    /// Decodes `bytes` into the sink; an error means the body cannot be decoded further.
    pub fn write(&mut self, bytes: &[u8]) -> io::Result<()> {
        let earned = DECODED_PER_ENCODED * bytes.len() as u64;
        match &mut self.0 {
            Inner::Identity(_) => {}
            Inner::Gzip(w) => w.get_mut().allowance += earned,
            Inner::Deflate(w) => w.get_mut().allowance += earned,
            Inner::Brotli(w) => w.get_mut().allowance += earned,
            Inner::Zstd(w) => w.get_mut().allowance += earned,
        }
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
            Inner::Gzip(w) => &w.get_ref().sink,
            Inner::Deflate(w) => &w.get_ref().sink,
            Inner::Brotli(w) => &w.get_ref().sink,
            Inner::Zstd(w) => &w.get_ref().sink,
        }
    }

    /// The sink, to change it between writes.
    pub fn sink_mut(&mut self) -> &mut W {
        match &mut self.0 {
            Inner::Identity(w) => w,
            Inner::Gzip(w) => &mut w.get_mut().sink,
            Inner::Deflate(w) => &mut w.get_mut().sink,
            Inner::Brotli(w) => &mut w.get_mut().sink,
            Inner::Zstd(w) => &mut w.get_mut().sink,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::HeaderValue;

    /// Counts what it is given.
    #[derive(Default)]
    struct Counter(u64);

    impl Write for Counter {
        fn write(&mut self, bytes: &[u8]) -> io::Result<usize> {
            self.0 += bytes.len() as u64;
            Ok(bytes.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn an_identity_decoder_is_the_size_of_its_sink_not_of_a_decompressor() {
        // Every stream's observer is kept in one: a decompressor inline would size them all.
        let sink = std::mem::size_of::<Counter>();
        assert!(std::mem::size_of::<Decoder<Counter>>() <= sink + 16);
    }

    #[test]
    fn a_compression_bomb_stops_being_decoded() {
        let mut bomb = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        bomb.write_all(&vec![0u8; 32 << 20]).unwrap();
        let bomb = bomb.finish().unwrap();
        let mut decoder = Decoder::new(Encoding::Gzip, Counter::default()).unwrap();
        let failed = bomb.chunks(4096).any(|chunk| decoder.write(chunk).is_err());
        assert!(failed, "32 MiB of zeros from {} bytes is over the ratio", bomb.len());
        let allowed = DECODED_HEADROOM + DECODED_PER_ENCODED * bomb.len() as u64;
        assert!(
            decoder.sink().0 <= allowed,
            "decoded {} of at most {allowed}",
            decoder.sink().0
        );
    }

    #[test]
    fn a_zstd_frame_asking_for_a_window_over_8_mib_is_refused() {
        let mut encoder = zstd::stream::write::Encoder::new(Vec::new(), 1).unwrap();
        encoder.window_log(24).unwrap();
        encoder.include_contentsize(false).unwrap();
        encoder.write_all(&vec![7u8; 20 << 20]).unwrap();
        let frame = encoder.finish().unwrap();
        let mut decoder = Decoder::new(Encoding::Zstd, Counter::default()).unwrap();
        assert!(decoder.write(&frame).is_err(), "a 16 MiB window is refused");
        assert_eq!(decoder.sink().0, 0);
    }

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
