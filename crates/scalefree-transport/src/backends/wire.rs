//! A note on the wire, as the network backends send it (UCX's write header and a lane's
//! frame): `(note, index, value)`. A post's 64-bit value travels as its high half in the
//! note's upper 32 bits and its low half in `value` (see [`post_value`]).

use super::Note;

pub(crate) const NOTE_NONE: u64 = 0;
pub(crate) const NOTE_SLOT: u64 = 1;
pub(crate) const NOTE_WORD: u64 = 2;
/// Mesh post: store a 64-bit value (high half in the note's upper 32 bits) at `index`, then
/// ring the region's mesh bell (see [`crate::mesh`]).
pub(crate) const NOTE_POST: u64 = 3;

/// `note` as `(note, index, value)`.
pub(crate) fn note_parts(note: Note) -> (u64, u64, u32) {
    match note {
        Note::None => (NOTE_NONE, 0, 0),
        Note::Slot(s, v) => (NOTE_SLOT, s as u64, v),
        Note::Word(o, v) => (NOTE_WORD, o, v),
        Note::Post(o, v) => (NOTE_POST | ((v >> 32) << 32), o, v as u32),
    }
}

/// A post's 64-bit value from its note and `value` (see [`note_parts`]).
pub(crate) fn post_value(note: u64, value: u32) -> u64 {
    (note >> 32) << 32 | value as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A post's 64-bit counter and offset past 2^32 survive the note's encoding.
    #[test]
    fn notes_carry_64_bit_posts_and_offsets() {
        for v in [0u64, 1, u32::MAX as u64, 1 << 32, (7 << 32) | 5, u64::MAX] {
            let (note, index, value) = note_parts(Note::Post((5 << 32) + 8, v));
            assert_eq!((note & 0xffff_ffff, index), (NOTE_POST, (5 << 32) + 8));
            assert_eq!(post_value(note, value), v);
        }
        assert_eq!(note_parts(Note::Word(1 << 40, 3)), (NOTE_WORD, 1 << 40, 3));
        assert_eq!(note_parts(Note::Slot(9, u32::MAX)), (NOTE_SLOT, 9, u32::MAX));
        assert_eq!(note_parts(Note::None), (NOTE_NONE, 0, 0));
    }
}
