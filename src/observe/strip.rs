//! Removing the usage-only chunk that llmslo asked for on the client's behalf, so the client
//! receives exactly the other bytes the engine sent.

use bytes::{Bytes, BytesMut};

/// Holds back the bytes of an incomplete event, and forwards complete ones minus the
/// removed spans. Offsets are stream offsets as the SSE parser counts them.
#[derive(Debug, Default)]
pub struct UsageStripper {
    held: BytesMut,
    held_start: u64,
    /// A cut event ended with `\r` at the end of what was ready: a `\n` right there
    /// completes its line end and goes with it.
    lf_to_cut_at: Option<u64>,
}

impl UsageStripper {
    /// Takes the next frame; returns what may be forwarded now: every byte before
    /// `boundary` except the `removed` spans.
    pub fn push(&mut self, frame: &Bytes, boundary: u64, removed: &[(u64, u64)]) -> Bytes {
        let held_end = self.held_start + (self.held.len() + frame.len()) as u64;
        if self.held.is_empty() && removed.is_empty() && boundary == held_end && self.lf_to_cut_at.is_none() {
            self.held_start = held_end;
            return frame.clone(); // the common case: a frame of whole events, nothing to cut
        }
        self.held.extend_from_slice(frame);
        let base = self.held_start;
        let mut ready = self.held.split_to((boundary - base) as usize);
        self.held_start = boundary;
        if self.lf_to_cut_at.take() == Some(base) && ready.first() == Some(&b'\n') {
            let _ = ready.split_to(1);
        }
        let skipped = boundary - base - ready.len() as u64;
        if removed.is_empty() {
            return ready.freeze();
        }
        let mut out = BytesMut::with_capacity(ready.len());
        let mut cursor = 0;
        for &(start, end) in removed {
            let (start, end) = ((start - base - skipped) as usize, (end - base - skipped) as usize);
            out.extend_from_slice(&ready[cursor..start]);
            cursor = end;
            if end == ready.len() && ready[end - 1] == b'\r' {
                self.lf_to_cut_at = Some(boundary);
            }
        }
        out.extend_from_slice(&ready[cursor..]);
        out.freeze()
    }

    /// The bytes still held at the end of the stream (an unfinished last event).
    pub fn finish(&mut self) -> Bytes {
        self.held.split().freeze()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn whole_frames_pass_without_copy() {
        let mut s = UsageStripper::default();
        let frame = Bytes::from_static(b"data: a\n\n");
        let out = s.push(&frame, 9, &[]);
        assert_eq!(out.as_ptr(), frame.as_ptr());
    }

    #[test]
    fn partial_events_are_held_and_spans_cut() {
        let mut s = UsageStripper::default();
        assert_eq!(
            s.push(&Bytes::from_static(b"data: a\n\ndata: u"), 9, &[]),
            "data: a\n\n"
        );
        let out = s.push(&Bytes::from_static(b"\n\ndata: [DONE]\n\n"), 32, &[(9, 18)]);
        assert_eq!(out, "data: [DONE]\n\n");
        assert!(s.finish().is_empty());
    }

    #[test]
    fn a_crlf_split_after_a_cut_event_loses_its_lf_too() {
        let mut s = UsageStripper::default();
        // "data: u\r\n\r" + "\n...": the cut event ends at offset 10, where the frame ends.
        assert_eq!(s.push(&Bytes::from_static(b"data: u\r\n\r"), 10, &[(0, 10)]), "");
        assert_eq!(
            s.push(&Bytes::from_static(b"\ndata: [DONE]\r\n\r\n"), 27, &[]),
            "data: [DONE]\r\n\r\n"
        );
    }

    #[test]
    fn a_boundary_at_the_end_forwards_everything_held() {
        let mut s = UsageStripper::default();
        assert!(s.push(&Bytes::from_static(b"data: par"), 0, &[]).is_empty());
        assert_eq!(s.push(&Bytes::from_static(b"tial"), 13, &[]), "data: partial");
        assert_eq!(
            s.push(&Bytes::from_static(b"data: x"), 13, &[]),
            "",
            "nothing complete yet"
        );
        assert_eq!(s.finish(), "data: x");
    }
}
