//! Plain-old-data element types that can live on flash, and the real scalars kernels compute on.

use std::fmt::Debug;
use std::ops::{Add, AddAssign, Mul, Sub};

/// A plain-old-data type stored on flash byte for byte (native endianness).
///
/// # Safety
/// Implementors must have no padding and no invalid bit patterns (every byte string of
/// `size_of::<Self>()` bytes is a valid value), so buffers can be viewed as `&[Self]`.
pub unsafe trait Element: Copy + Send + Sync + Default + PartialEq + Debug + 'static {
    /// A short name used in file headers and messages ("f32", "u64", ...).
    const NAME: &'static str;
}

macro_rules! element {
    ($($t:ty),*) => { $( unsafe impl Element for $t { const NAME: &'static str = stringify!($t); } )* };
}
element!(u8, i8, u16, i16, u32, i32, u64, i64, f32, f64);

/// Views a slice of elements as its bytes.
pub fn as_bytes<T: Element>(values: &[T]) -> &[u8] {
    // SAFETY: `Element` types are plain old data without padding.
    unsafe { std::slice::from_raw_parts(values.as_ptr().cast::<u8>(), std::mem::size_of_val(values)) }
}

/// Views a mutable slice of elements as its bytes.
pub fn as_bytes_mut<T: Element>(values: &mut [T]) -> &mut [u8] {
    let len = std::mem::size_of_val(values);
    // SAFETY: every byte pattern is a valid `Element`, so writes through the view are sound.
    unsafe { std::slice::from_raw_parts_mut(values.as_mut_ptr().cast::<u8>(), len) }
}

/// Views bytes as elements. Panics if the length or alignment does not fit `T` (misuse).
pub fn cast_slice<T: Element>(bytes: &[u8]) -> &[T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {}", bytes.len(), T::NAME);
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()), "buffer is not aligned for {}", T::NAME);
    // SAFETY: length and alignment checked; every bit pattern is a valid `T`.
    unsafe { std::slice::from_raw_parts(bytes.as_ptr().cast::<T>(), bytes.len() / size) }
}

/// Views mutable bytes as elements. Panics if the length or alignment does not fit `T`.
pub fn cast_slice_mut<T: Element>(bytes: &mut [u8]) -> &mut [T] {
    let size = std::mem::size_of::<T>();
    assert!(bytes.len().is_multiple_of(size), "{} bytes is not a whole number of {}", bytes.len(), T::NAME);
    assert!((bytes.as_ptr() as usize).is_multiple_of(std::mem::align_of::<T>()), "buffer is not aligned for {}", T::NAME);
    // SAFETY: length and alignment checked; every bit pattern is a valid `T`.
    unsafe { std::slice::from_raw_parts_mut(bytes.as_mut_ptr().cast::<T>(), bytes.len() / size) }
}

/// A real floating-point scalar the kernels compute on (`f32` or `f64`).
pub trait Real:
    Element
    + faer::traits::RealField
    + Add<Output = Self>
    + Sub<Output = Self>
    + Mul<Output = Self>
    + AddAssign
    + PartialOrd
{
    /// Additive identity.
    const ZERO: Self;
    /// Multiplicative identity.
    const ONE: Self;
    /// Converts from `f64` (rounding for `f32`).
    fn from_f64(value: f64) -> Self;
    /// Converts to `f64`.
    fn to_f64(self) -> f64;
}

impl Real for f32 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn from_f64(value: f64) -> Self {
        value as f32
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
}

impl Real for f64 {
    const ZERO: Self = 0.0;
    const ONE: Self = 1.0;
    fn from_f64(value: f64) -> Self {
        value
    }
    fn to_f64(self) -> f64 {
        self
    }
}
