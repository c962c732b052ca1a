//! bf16 on the host: the bits the device stores, widened and narrowed exactly
//! as the device's conversions do.

use half::bf16;

/// bf16 bits to f32 (exact).
pub fn widen(bits: &[u16]) -> Vec<f32> {
    bits.iter().map(|b| bf16::from_bits(*b).to_f32()).collect()
}

/// f32 to bf16 bits, round to nearest even (what the device's cvt.rn does).
pub fn narrow(x: &[f32]) -> Vec<u16> {
    x.iter().map(|v| bf16::from_f32(*v).to_bits()).collect()
}

/// Round through bf16 (what a bf16 input holds).
pub fn rb(x: &[f32]) -> Vec<f32> {
    widen(&narrow(x))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bf16_helpers_round_to_nearest_even() {
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        let x = [1.0 + 1.0 / 256.0, 1.0 + 3.0 / 256.0, -2.5, 0.1];
        let r = rb(&x);
        assert_eq!(r[0], 1.0);
        assert_eq!(r[1], 1.0 + 4.0 / 256.0);
        assert_eq!(r[2], -2.5);
        assert!((r[3] - 0.1).abs() < 0.1 / 256.0 && r[3] != 0.1);
        assert_eq!(widen(&narrow(&[3.0, -0.5])), vec![3.0, -0.5]);
    }
}
