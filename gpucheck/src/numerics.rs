//! Seeded inputs, CPU references and tolerances for the sample kernels.
//!
//! References are computed in f64 from the very values the GPU was given
//! (after rounding to the kernel's element type), so the only differences
//! left are the GPU's f32 arithmetic and the rounding of its outputs:
//!
//! - f32 (saxpy): a fused multiply-add rounds once where a * x + y rounds
//!   twice, so results agree to 2 units in the last place of the larger
//!   term: |d| <= 2 * 2^-23 * (|a x| + |y|).
//! - bfloat16 and float16 outputs: the kernels compute in f32 and round to
//!   the element type once, on store; round-to-nearest is off by at most
//!   half a unit in the last place, 2^-9 of the value for bfloat16 (8
//!   significant bits) and 2^-11 for float16 (11). The bound used is a
//!   whole unit (2^-8, 2^-10) relative, plus 1e-6 absolute: twice the
//!   rounding, leaving room for f32's own error (about 1e-6 relative after
//!   a 4096-term sum and `rsqrtf`'s 2 ulp), and far below the error of
//!   reading an input wrongly (a wrong variant or layout is off by 10% or
//!   more, not 0.4%).

use half::{bf16, f16};

/// xorshift64*: the same inputs on every run for a seed.
#[derive(Debug, Clone)]
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Self {
        Self(seed.max(1))
    }

    /// Uniform in [lo, hi).
    pub fn uniform(&mut self, lo: f32, hi: f32) -> f32 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        let bits = self.0.wrapping_mul(0x2545_F491_4F6C_DD1D) >> 40; // 24 bits
        lo + (hi - lo) * (bits as f32 / (1u32 << 24) as f32)
    }

    pub fn vec(&mut self, n: usize, lo: f32, hi: f32) -> Vec<f32> {
        (0..n).map(|_| self.uniform(lo, hi)).collect()
    }
}

/// A kernel's 16-bit element type, moved to and from the GPU as bits.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Half {
    Bf16,
    F16,
}

impl Half {
    /// From a variant's `dtype`.
    pub fn from_dtype(dtype: &str) -> Option<Self> {
        match dtype {
            "bfloat16" => Some(Self::Bf16),
            "float16" => Some(Self::F16),
            _ => None,
        }
    }

    pub fn to_bits(self, v: f32) -> u16 {
        match self {
            Self::Bf16 => bf16::from_f32(v).to_bits(),
            Self::F16 => f16::from_f32(v).to_bits(),
        }
    }

    pub fn from_bits(self, b: u16) -> f32 {
        match self {
            Self::Bf16 => bf16::from_bits(b).to_f32(),
            Self::F16 => f16::from_bits(b).to_f32(),
        }
    }

    /// `v` as the GPU sees it after upload.
    pub fn round(self, v: f32) -> f32 {
        self.from_bits(self.to_bits(v))
    }

    /// The relative bound of the module docs: one unit in the last place.
    pub fn rel_tol(self) -> f64 {
        match self {
            Self::Bf16 => 2f64.powi(-8),
            Self::F16 => 2f64.powi(-10),
        }
    }
}

/// Absolute floor of every bound (values near zero).
pub const ABS_TOL: f64 = 1e-6;

/// The largest errors seen, and whether every element was within bounds.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Agreement {
    pub max_abs: f64,
    pub max_rel: f64,
    /// Elements outside their bound.
    pub outside: usize,
    pub n: usize,
}

/// Compare `got` with `want`, element `i` allowed `bound(i)`.
pub fn agree(got: &[f32], want: &[f64], bound: impl Fn(usize) -> f64) -> Agreement {
    let mut a = Agreement {
        max_abs: 0.0,
        max_rel: 0.0,
        outside: 0,
        n: want.len(),
    };
    if got.len() != want.len() {
        a.outside = want.len().max(got.len());
        return a;
    }
    for (i, (&g, &w)) in got.iter().zip(want).enumerate() {
        let d = (f64::from(g) - w).abs();
        if d.is_nan() || d > bound(i) {
            a.outside += 1;
        }
        a.max_abs = a.max_abs.max(d);
        if w.abs() > ABS_TOL {
            a.max_rel = a.max_rel.max(d / w.abs());
        }
    }
    a
}

/// out = a x + y, and each element's bound.
pub fn saxpy(a: f32, x: &[f32], y: &[f32]) -> (Vec<f64>, Vec<f64>) {
    let eps = f64::from(f32::EPSILON);
    x.iter()
        .zip(y)
        .map(|(&x, &y)| {
            let ax = f64::from(a) * f64::from(x);
            (
                ax + f64::from(y),
                2.0 * eps * (ax.abs() + f64::from(y).abs()) + ABS_TOL,
            )
        })
        .unzip()
}

/// Row-wise y = x / sqrt(mean(x^2) + eps) * w over rows of `cols`.
pub fn rmsnorm(x: &[f32], w: &[f32], cols: usize, eps: f32) -> Vec<f64> {
    x.chunks(cols)
        .flat_map(|row| {
            let ms = row.iter().map(|&v| f64::from(v).powi(2)).sum::<f64>() / cols as f64;
            let scale = 1.0 / (ms + f64::from(eps)).sqrt();
            row.iter()
                .zip(w)
                .map(move |(&v, &w)| f64::from(v) * scale * f64::from(w))
        })
        .collect()
}

/// Rotary embedding of `x` ([tokens, heads, dim], pairs adjacent) by the
/// per-token tables `cos_t`/`sin_t` ([tokens, dim/2]).
pub fn rotary(
    x: &[f32],
    cos_t: &[f32],
    sin_t: &[f32],
    tokens: usize,
    heads: usize,
    dim: usize,
) -> Vec<f64> {
    let half = dim / 2;
    let mut out = vec![0.0; tokens * heads * dim];
    for t in 0..tokens {
        for h in 0..heads {
            for p in 0..half {
                let i = (t * heads + h) * half + p;
                let (a, b) = (f64::from(x[2 * i]), f64::from(x[2 * i + 1]));
                let (c, s) = (
                    f64::from(cos_t[t * half + p]),
                    f64::from(sin_t[t * half + p]),
                );
                out[2 * i] = a * c - b * s;
                out[2 * i + 1] = a * s + b * c;
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_half_unit_error_passes_and_a_wrong_value_does_not() {
        for h in [Half::Bf16, Half::F16] {
            let want = [1.5f64, -3.25, 100.0];
            let bound = |i: usize| h.rel_tol() * want[i].abs() + ABS_TOL;
            let rounded: Vec<f32> = want.iter().map(|&v| h.round(v as f32 * 1.001)).collect();
            // 0.1% off is inside bfloat16's unit (0.39%) but not float16's (0.098%).
            assert_eq!(agree(&rounded, &want, bound).outside == 0, h == Half::Bf16);
            let wrong: Vec<f32> = want.iter().map(|&v| v as f32 * 1.1).collect();
            assert_eq!(agree(&wrong, &want, bound).outside, 3);
        }
    }

    #[test]
    fn references_match_hand_computed_values() {
        let (out, _) = saxpy(2.0, &[1.0, -1.0], &[0.5, 0.5]);
        assert_eq!(out, vec![2.5, -1.5]);
        // Row [3, 4]: mean square 12.5, so each is divided by sqrt(12.5).
        let y = rmsnorm(&[3.0, 4.0], &[1.0, 2.0], 2, 0.0);
        let s = 12.5f64.sqrt();
        assert!((y[0] - 3.0 / s).abs() < 1e-12 && (y[1] - 8.0 / s).abs() < 1e-12);
        // A quarter turn maps (1, 0) to (0, 1).
        let r = rotary(&[1.0, 0.0], &[0.0], &[1.0], 1, 1, 2);
        assert_eq!(r, vec![0.0, 1.0]);
    }

    #[test]
    fn a_length_mismatch_is_a_failure() {
        assert_eq!(agree(&[1.0], &[1.0, 2.0], |_| 1.0).outside, 2);
    }

    #[test]
    fn inputs_are_seeded_and_in_range() {
        let a = Rng::new(7).vec(1000, -2.0, 2.0);
        assert_eq!(a, Rng::new(7).vec(1000, -2.0, 2.0));
        assert!(a.iter().all(|v| (-2.0..2.0).contains(v)));
        assert_ne!(a, Rng::new(8).vec(1000, -2.0, 2.0));
    }
}
