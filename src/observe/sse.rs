//! Incremental Server-Sent Events parser over raw bytes (WHATWG event-stream rules).
//!
//! Bytes go in as they arrive from the network, in frames of any size; complete events
//! come out through a callback. Line ends may be `\n`, `\r\n` or `\r`, an event may span
//! any number of frames, and a UTF-8 sequence may be split between frames: the parser
//! never looks at characters, only at the ASCII bytes that delimit lines and fields.
//! Memory is bounded: an event larger than the limit is skipped unbuffered (the caller keeps
//! forwarding its bytes), and the stream counts as given up for measurement; later events are
//! still framed, marked as coming after it.

/// One dispatched event: its `event:` type (empty when absent), its joined `data:` lines,
/// and where its raw bytes lie in the stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SseEvent<'a> {
    /// The `event:` field, empty when the event had none.
    pub event_type: &'a [u8],
    /// The `data:` lines joined with `\n`, without the final newline.
    pub data: &'a [u8],
    /// Stream offset where the event's raw bytes start (just after the previous blank line).
    pub start: u64,
    /// Stream offset just after the blank line that ended the event.
    pub end: u64,
    /// An earlier event of the stream was over the limit: the stream is no longer measured,
    /// and its events are framed only for the usage stripper.
    pub after_oversized: bool,
}

/// Incremental SSE parser with a bounded buffer.
#[derive(Debug)]
pub struct SseParser {
    max_event_bytes: usize,
    /// Bytes of a line whose end has not arrived yet.
    line: Vec<u8>,
    /// Data of the event being assembled, each line followed by `\n`.
    data: Vec<u8>,
    event_type: Vec<u8>,
    /// The previous byte was a `\r` that ended a line: a following `\n` belongs to it.
    skip_lf: bool,
    /// Still at the very start of the stream, where a UTF-8 byte order mark is dropped.
    at_start: bool,
    gave_up: bool,
    /// Inside an event over the limit: its lines are consumed unbuffered until it ends.
    skipping: bool,
    /// While skipping: the line being consumed has bytes (it is not the blank line).
    skipped_line_has_bytes: bool,
    /// Stream offset of the first byte not yet consumed.
    pos: u64,
    /// Stream offset just after the last blank line (where the next event starts).
    boundary: u64,
}

impl SseParser {
    /// A parser that gives up once one event (its pending line plus data) exceeds `max_event_bytes`.
    pub fn new(max_event_bytes: usize) -> Self {
        Self {
            max_event_bytes,
            line: Vec::new(),
            data: Vec::new(),
            event_type: Vec::new(),
            skip_lf: false,
            at_start: true,
            gave_up: false,
            skipping: false,
            skipped_line_has_bytes: false,
            pos: 0,
            boundary: 0,
        }
    }

    /// Stream offset up to which every byte may be forwarded: just after the last blank line
    /// (every byte before it belongs to a finished event, or to a comment or blank line
    /// between events); inside an oversized event, everything fed so far.
    pub fn boundary(&self) -> u64 {
        if self.skipping {
            self.pos
        } else {
            self.boundary
        }
    }

    /// True once an oversized event made the stream unmeasurable.
    pub fn gave_up(&self) -> bool {
        self.gave_up
    }

    /// Feed the next bytes of the stream; `on_event` is called for every event they complete.
    pub fn feed(&mut self, mut bytes: &[u8], mut on_event: impl FnMut(SseEvent<'_>)) {
        if self.at_start {
            let before = bytes.len();
            match self.strip_bom(bytes) {
                Some(rest) => bytes = rest,
                None => {
                    self.pos += before as u64;
                    return;
                }
            }
            self.pos += (before - bytes.len()) as u64;
        }
        if self.skip_lf && !bytes.is_empty() {
            self.skip_lf = false;
            if bytes[0] == b'\n' {
                bytes = &bytes[1..];
                self.pos += 1;
                self.boundary = self.boundary.max(self.pos_if_blank());
            }
        }
        // The one data line of an event that lies in these bytes, dispatched from them uncopied
        // (the common case: an engine writes each event whole); copied only when the event
        // goes on past them or has more data lines.
        let mut in_place = None;
        while let Some(end) = memchr::memchr2(b'\n', b'\r', bytes) {
            let terminator = bytes[end];
            let tail = &bytes[..end];
            let mut consumed = end + 1;
            if terminator == b'\r' {
                match bytes.get(end + 1) {
                    Some(b'\n') => consumed += 1,
                    Some(_) => {}
                    None => self.skip_lf = true,
                }
            }
            self.pos += consumed as u64;
            if self.skipping {
                self.skip_line(!tail.is_empty());
            } else if self.line.is_empty() {
                self.process_line(tail, &mut in_place, &mut on_event);
            } else {
                // Only the first line of these bytes can continue one kept from earlier bytes,
                // so no data line is in place yet.
                let mut line = std::mem::take(&mut self.line);
                line.extend_from_slice(tail);
                // A line that came in pieces is kept whole already: its data is copied.
                let mut joined = None;
                self.process_line(&line, &mut joined, &mut on_event);
                self.keep_data(joined);
                line.clear();
                self.line = line;
            }
            bytes = &bytes[consumed..];
        }
        self.keep_data(in_place);
        self.pos += bytes.len() as u64;
        if self.skipping {
            self.skipped_line_has_bytes |= !bytes.is_empty();
        } else {
            self.line.extend_from_slice(bytes);
            self.check_bound();
        }
    }

    /// A line of an oversized event ended: a blank one ends the event, and framing resumes.
    fn skip_line(&mut self, has_bytes: bool) {
        let had_bytes = std::mem::take(&mut self.skipped_line_has_bytes);
        let blank = !has_bytes && !had_bytes;
        if blank {
            self.skipping = false;
            self.boundary = self.pos;
        }
    }

    /// After a `\r` line end completed by a late `\n`: the boundary moves past that `\n`
    /// when the line it ended was blank.
    fn pos_if_blank(&self) -> u64 {
        if self.boundary == self.pos - 1 {
            self.pos
        } else {
            self.boundary
        }
    }

    /// Handles the optional BOM at the start; `None` means the bytes were all consumed.
    fn strip_bom<'b>(&mut self, bytes: &'b [u8]) -> Option<&'b [u8]> {
        const BOM: &[u8] = b"\xEF\xBB\xBF";
        // Collect up to three bytes in `line` to decide whether the stream starts with a BOM.
        let seen = self.line.len();
        let take = (BOM.len() - seen).min(bytes.len());
        let mut head = self.line.clone();
        head.extend_from_slice(&bytes[..take]);
        if !BOM.starts_with(&head) {
            self.at_start = false;
            return Some(bytes);
        }
        if head.len() < BOM.len() {
            self.line = head;
            return None;
        }
        self.at_start = false;
        self.line.clear();
        Some(&bytes[take..])
    }

    /// Handles one complete line; `in_place` holds the event's data line while it is the only
    /// one, uncopied.
    fn process_line<'b>(
        &mut self,
        line: &'b [u8],
        in_place: &mut Option<&'b [u8]>,
        on_event: &mut impl FnMut(SseEvent<'_>),
    ) {
        // The same bound as for a line still arriving, so that where frames split never
        // decides whether the parser gives up.
        let data_len = self.data.len() + in_place.map_or(0, |value| value.len() + 1);
        if line.len() + data_len > self.max_event_bytes {
            *in_place = None;
            self.give_up();
            // The line that crossed the limit is over: the event's next line decides.
            self.skipped_line_has_bytes = false;
            if line.is_empty() {
                self.skip_line(false);
            }
            return;
        }
        if line.is_empty() {
            self.dispatch(in_place.take(), on_event);
            self.boundary = self.pos;
            return;
        }
        if line[0] == b':' {
            return; // comment
        }
        let (field, value) = match memchr::memchr(b':', line) {
            Some(colon) => {
                let value = &line[colon + 1..];
                (&line[..colon], value.strip_prefix(b" ").unwrap_or(value))
            }
            None => (line, &b""[..]),
        };
        match field {
            b"data" if self.data.is_empty() && in_place.is_none() => *in_place = Some(value),
            b"data" => {
                self.keep_data(in_place.take());
                self.keep_data(Some(value));
                self.check_bound();
            }
            b"event" => {
                self.event_type.clear();
                self.event_type.extend_from_slice(value);
            }
            _ => {} // id, retry and unknown fields do not matter for measurement
        }
    }

    /// Appends a data line, and the newline that follows each, to the event's kept data.
    fn keep_data(&mut self, value: Option<&[u8]>) {
        if let Some(value) = value {
            self.data.extend_from_slice(value);
            self.data.push(b'\n');
        }
    }

    /// The event is complete: hands it over, its data `in_place` or as kept.
    fn dispatch(&mut self, in_place: Option<&[u8]>, on_event: &mut impl FnMut(SseEvent<'_>)) {
        let data = in_place.or_else(|| self.data.split_last().map(|(_newline, data)| data));
        if let Some(data) = data {
            on_event(SseEvent {
                event_type: &self.event_type,
                data,
                start: self.boundary,
                end: self.pos,
                after_oversized: self.gave_up,
            });
        }
        self.data.clear();
        self.event_type.clear();
    }

    fn check_bound(&mut self) {
        if self.line.len() + self.data.len() > self.max_event_bytes {
            self.give_up();
        }
    }

    /// Stops buffering the event over the limit: skips it to its end.
    fn give_up(&mut self) {
        self.gave_up = true;
        self.skipping = true;
        self.skipped_line_has_bytes = !self.line.is_empty();
        self.line = Vec::new();
        self.data = Vec::new();
        self.event_type = Vec::new();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn events_of(chunks: &[&[u8]], limit: usize) -> (Vec<(String, String)>, bool) {
        let mut parser = SseParser::new(limit);
        let mut out = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, |e| {
                out.push((
                    String::from_utf8(e.event_type.to_vec()).unwrap(),
                    String::from_utf8(e.data.to_vec()).unwrap(),
                ))
            });
        }
        (out, parser.gave_up())
    }

    fn data_of(chunks: &[&[u8]]) -> Vec<String> {
        events_of(chunks, 1 << 20).0.into_iter().map(|e| e.1).collect()
    }

    #[test]
    fn all_three_line_endings() {
        assert_eq!(
            data_of(&[b"data: a\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n"]),
            ["a", "b", "c", "d"]
        );
    }

    #[test]
    fn crlf_split_between_frames_is_one_line_end() {
        assert_eq!(data_of(&[b"data: a\r", b"\n\r", b"\ndata: b\r", b"\r"]), ["a", "b"]);
    }

    #[test]
    fn multi_line_data_is_joined_with_newline() {
        assert_eq!(data_of(&[b"data: one\ndata:two\ndata\n\n"]), ["one\ntwo\n"]);
    }

    #[test]
    fn comments_and_other_fields_are_not_events() {
        let (events, _) = events_of(&[b": keep-alive\n\nid: 7\nretry: 10\n\nevent: ping\ndata: x\n\n"], 1024);
        assert_eq!(events, [("ping".to_string(), "x".to_string())]);
    }

    #[test]
    fn event_split_at_every_byte_gives_the_same_events() {
        let stream = "data: {\"a\":\"héllo ✓\"}\r\n\r\n: c\n\ndata: [DONE]\n\n".as_bytes();
        let whole = data_of(&[stream]);
        let bytes: Vec<&[u8]> = stream.chunks(1).collect();
        assert_eq!(data_of(&bytes), whole);
        for cut in 0..stream.len() {
            assert_eq!(data_of(&[&stream[..cut], &stream[cut..]]), whole, "cut at {cut}");
        }
        assert_eq!(whole, ["{\"a\":\"héllo ✓\"}", "[DONE]"]);
    }

    #[test]
    fn an_event_within_one_frame_is_handed_over_from_it_and_one_across_frames_is_kept() {
        let frame = b"data: {\"a\":1}\n\ndata: {\"b\"";
        let mut parser = SseParser::new(1 << 20);
        let mut seen = Vec::new();
        parser.feed(frame, |e| {
            seen.push(e.data.to_vec());
            assert!(frame.as_ptr_range().contains(&e.data.as_ptr()), "not copied");
        });
        assert!(parser.data.capacity() == 0, "nothing kept for it");
        parser.feed(b":2}\n", |e| seen.push(e.data.to_vec()));
        parser.feed(b"data: 3\n\n", |e| seen.push(e.data.to_vec()));
        assert_eq!(seen, [&b"{\"a\":1}"[..], b"{\"b\":2}\n3"]);
    }

    #[test]
    fn utf8_split_across_frames_is_reassembled() {
        let stream = "data: ✓\n\n".as_bytes();
        // Cut inside the three-byte check mark.
        assert_eq!(data_of(&[&stream[..7], &stream[7..]]), ["✓"]);
    }

    #[test]
    fn byte_order_mark_is_dropped_even_when_split() {
        assert_eq!(data_of(&[b"\xEF", b"\xBB", b"\xBFdata: x\n\n"]), ["x"]);
        assert_eq!(data_of(&[b"\xEF\xBB\xBFdata: x\n\n"]), ["x"]);
    }

    #[test]
    fn incomplete_event_at_end_is_not_dispatched() {
        assert_eq!(data_of(&[b"data: a\n\ndata: b\n"]), ["a"]);
    }

    /// Every event's span, cut from the stream, must be exactly its raw bytes.
    fn spans_of(chunks: &[&[u8]]) -> Vec<(u64, u64)> {
        let mut parser = SseParser::new(1 << 20);
        let mut spans = Vec::new();
        for chunk in chunks {
            parser.feed(chunk, |e| spans.push((e.start, e.end)));
        }
        spans
    }

    #[test]
    fn spans_cover_each_event_exactly() {
        let stream = b"data: a\n\n: ping\n\ndata: b\r\n\r\ndata: c\r\rdata: d\n\n";
        let spans = spans_of(&[stream]);
        let cut: Vec<&[u8]> = spans.iter().map(|(s, e)| &stream[*s as usize..*e as usize]).collect();
        assert_eq!(
            cut,
            [&b"data: a\n\n"[..], b"data: b\r\n\r\n", b"data: c\r\r", b"data: d\n\n"]
        );
        for split in 0..stream.len() {
            let mut expected = spans.clone();
            if split == 27 {
                // Split between the CR and LF ending event b: it is dispatched at the CR
                // (its timing must not wait for the next frame), so its span ends there.
                expected[1].1 = 27;
            }
            assert_eq!(
                spans_of(&[&stream[..split], &stream[split..]]),
                expected,
                "split at {split}"
            );
        }
        let mut parser = SseParser::new(1 << 20);
        parser.feed(b"data: a\n\ndata: partial", |_| {});
        assert_eq!(parser.boundary(), 9);
    }

    #[test]
    fn crlf_blank_line_split_after_the_cr_moves_the_boundary_past_the_lf() {
        let mut parser = SseParser::new(1 << 20);
        parser.feed(b"data: a\r\n\r", |_| {});
        assert_eq!(parser.boundary(), 10);
        parser.feed(b"\n", |_| {});
        assert_eq!(parser.boundary(), 11);
    }

    #[test]
    fn an_oversized_event_is_skipped_unbuffered_and_later_events_are_marked() {
        let big = vec![b'x'; 100];
        let mut chunk = b"data: ".to_vec();
        chunk.extend_from_slice(&big);
        let mut parser = SseParser::new(64);
        let mut seen = Vec::new();
        let mut feed = |parser: &mut SseParser, bytes: &[u8]| {
            parser.feed(bytes, |e| {
                seen.push((String::from_utf8(e.data.to_vec()).unwrap(), e.after_oversized))
            });
        };
        feed(&mut parser, b"data: ok\n\n");
        feed(&mut parser, &chunk);
        assert!(parser.gave_up());
        assert_eq!(
            parser.boundary(),
            10 + chunk.len() as u64,
            "the oversized bytes may all go on"
        );
        assert!(parser.line.capacity() + parser.data.capacity() < 64, "and are not kept");
        feed(&mut parser, b"more\ndata: still the same event\n");
        feed(&mut parser, b"\ndata: later\n\n");
        assert_eq!(seen, [("ok".to_string(), false), ("later".to_string(), true)]);
        assert_eq!(parser.boundary(), parser.pos, "framing resumed after the blank line");
    }

    #[test]
    fn oversized_multi_line_data_also_counts() {
        let (_, gave_up) = events_of(&[b"data: 0123456789\ndata: 0123456789\ndata: 0123456789\n"], 24);
        assert!(gave_up);
    }
}
