//! Cache hints for a stream's state. With hundreds of streams, each stream's state has left the
//! cache by the time its next frame comes, and every line of it read first is a wait of its
//! own. Asked for together, the lines arrive in the time of one, while the frame is read.

/// Asks the CPU to start bringing `value`'s memory into the cache, without waiting for it.
/// A hint only: it changes no value, and where the CPU has no such hint it does nothing.
pub fn prefetch<T: ?Sized>(value: &T) {
    #[cfg(target_arch = "x86_64")]
    {
        use std::arch::x86_64::{_mm_prefetch, _MM_HINT_T0};
        let start = std::ptr::from_ref(value).cast::<i8>();
        for offset in (0..std::mem::size_of_val(value)).step_by(64) {
            // SAFETY: SSE, which `_mm_prefetch` needs, is part of every x86-64 CPU; a prefetch
            // reads nothing into the program and cannot fault, and each address lies in `value`.
            unsafe { _mm_prefetch::<_MM_HINT_T0>(start.wrapping_add(offset)) };
        }
    }
    #[cfg(not(target_arch = "x86_64"))]
    let _ = value;
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_hint_changes_nothing_whatever_the_size() {
        let long = vec![7u8; 1000];
        let empty: [u64; 0] = [];
        let small = (1u8, 2u16);
        prefetch(long.as_slice());
        prefetch(&empty[..]);
        prefetch(&small);
        prefetch(&());
        assert!(long.iter().all(|&b| b == 7));
        assert_eq!(small, (1, 2));
    }
}
