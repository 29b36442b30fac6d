//! Array maps for `#[target_feature]` kernels that are always inlined.
//!
//! A closure written inside a `#[target_feature]` function is compiled with
//! that function's features, and `array::map` or `array::from_fn` (compiled
//! without them) cannot inline it: LLVM then leaves `map` itself out of
//! line too, and every call in a kernel's loop becomes a real call with a
//! `vzeroupper` and the live vector registers spilled around it. The AVX2
//! decode attention's key dot products (then eight keys of one head per
//! pass) ran at 6 GMAC/s for that, on
//! data in L1, and at 10.5 GMAC/s with [`map`] and [`from_fn`], which are
//! forced inline, so that the closure is called from the kernel itself and
//! inlined there. The packed Q8_0 tiles' per-row slices, made with them,
//! ran 1.07-1.2x faster.
//!
//! Not a rule for every kernel: forcing the packed K-quant tiles' maps
//! inline made the 1.1B Q4_K_M prefill 10-35 % slower on a Zen 3 (more
//! accumulators spilled in their block loops), so they keep `array::map`.

/// `[f(a[0]), f(a[1]), ..]`, always inlined (see the module documentation).
/// Arrays of at least one element.
#[inline(always)]
pub(crate) fn map<T: Copy, U: Copy, const N: usize>(
    a: [T; N],
    mut f: impl FnMut(T) -> U,
) -> [U; N] {
    const { assert!(N > 0, "an array of at least one element") };
    // Not `from_fn(|i| f(a[i]))`: that closure, written here without the
    // kernel's features, could not inline `f` either.
    let mut out = [f(a[0]); N];
    let mut i = 1;
    while i < N {
        out[i] = f(a[i]);
        i += 1;
    }
    out
}

/// `[f(0), f(1), ..]`, always inlined (see the module documentation).
/// Arrays of at least one element.
#[inline(always)]
pub(crate) fn from_fn<U: Copy, const N: usize>(mut f: impl FnMut(usize) -> U) -> [U; N] {
    const { assert!(N > 0, "an array of at least one element") };
    let mut out = [f(0); N];
    let mut i = 1;
    while i < N {
        out[i] = f(i);
        i += 1;
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn maps_every_element_in_order() {
        let mut seen = Vec::new();
        let out = map([3, 1, 4, 1, 5], |x| {
            seen.push(x);
            x * 10
        });
        assert_eq!(out, [30, 10, 40, 10, 50]);
        assert_eq!(seen, [3, 1, 4, 1, 5]);
        assert_eq!(map([7u8], u16::from), [7u16]);
        let squares: [usize; 4] = from_fn(|i| i * i);
        assert_eq!(squares, [0, 1, 4, 9]);
    }
}
